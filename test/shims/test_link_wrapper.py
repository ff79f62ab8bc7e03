"""Where per-model link wrappers go: next to a model in a writable folder, so a private
per-load directory takes its wrapper with it, and never as a new cache entry per load."""

import os
import subprocess

from etmetal.shims.model_link import cache_root, compiler, link_wrapper


def _tiny_so(folder):
    src = folder / "m.c"
    src.write_text("int etmetal_probe(void) { return 7; }\n")
    so = folder / "m.so"
    subprocess.run([compiler("c"), "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


def test_wrapper_lives_beside_a_model_in_a_writable_folder(tmp_path):
    so = _tiny_so(tmp_path)
    before = (
        set((cache_root() / "wrappers").glob("*"))
        if (cache_root() / "wrappers").exists()
        else set()
    )
    wrapper = link_wrapper([so])
    assert tmp_path in wrapper.parents
    after = (
        set((cache_root() / "wrappers").glob("*"))
        if (cache_root() / "wrappers").exists()
        else set()
    )
    assert after == before
    # the wrapper really pulls the model in: its symbol resolves through the wrapper
    import ctypes

    lib = ctypes.CDLL(str(wrapper), mode=os.RTLD_LOCAL)
    assert lib.etmetal_probe() == 7


def test_a_model_loaded_from_the_build_cache_leaves_its_entry_valid(tmp_path, monkeypatch):
    # an AOTI artifact is often loaded where the cache keeps it; its wrapper must not be
    # written into the entry, or the entry fails verification and is rebuilt next time
    from etmetal.common.cache import ContentCache

    monkeypatch.setenv("ETMETAL_CACHE_DIR", str(tmp_path / "cache"))
    cache = ContentCache("things")

    def build(tmp):
        _tiny_so(tmp)

    entry, hit = cache.get_or_create("k1", build, stamp="k1")
    assert not hit
    wrapper = link_wrapper([entry / "m.so"])
    assert entry not in wrapper.parents
    assert cache.verify("k1") is None
    assert cache.get_or_create("k1", build)[1]  # still a hit
