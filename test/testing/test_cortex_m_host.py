"""ExecuTorch's own Cortex-M implementation tests, run through ``etmetal.testing.cortex_m_host``.

The reference is upstream's: each case quantizes, lowers and serializes with ExecuTorch's
``CortexMTester`` and compares the program's output with the quantized exported program
within the test's own ``qtol``. The plugin only swaps the FVP run for etmetal's runtime.
A subprocess pytest runs one case per upstream ops file (the first one upstream expects
to pass) plus a few chosen ones, and this test reads its result counts.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tosa_serializer", reason="the cortex-m extra (tosa-tools) is not installed")

from etmetal.testing import cortex_m_host  # noqa: E402

HERE = Path(__file__).parent
# upstream's strict xfails that pass on a host with every kernel: two that the FVP
# runner's kernel set refuses (a float softmax over a non-last dim, a broadcasting float
# division) and one the host is more capable for (a 5-D convolution)
SOFTMAX_NOT_LAST = "test_implementation_softmax[cortex-m55-dim_not_last]"
DIV_BROADCAST = "test_implementation_div[cortex-m55-broadcast_1]"
CONV3D = "test_implementation_conv2d[cortex-m55-conv3d]"


def _pytest(*args: str, env: dict | None = None, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]), **(env or {})},
    )


def _counts(output: str) -> dict[str, int]:
    final = [line for line in output.splitlines() if re.search(r" in [\d.]+s", line)][-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", final)}


@pytest.mark.timeout(2400)  # ~2 min on an idle machine; the lowering is upstream's, CPU-bound
def test_one_case_per_ops_file_passes_on_the_host(tmp_path):
    ops = cortex_m_host.upstream_test_dir() / "ops"
    files = {p.stem for p in ops.glob("test_*.py") if "def test_implementation" in p.read_text()}
    out = _pytest(
        "-p",
        "etmetal.testing.cortex_m_host",
        "-p",
        "slice_plugin",
        "--pyargs",  # module names: works from any directory
        "executorch.backends.cortex_m.test.ops",
        "executorch.backends.cortex_m.test.models.test_wav2letter",
        "-k",
        "implementation",
        "-rfEsX",
        env={"ETMETAL_SLICE_EXTRA": ",".join([SOFTMAX_NOT_LAST, DIV_BROADCAST, CONV3D])},
        cwd=tmp_path,
    )
    text = out.stdout + out.stderr
    counts = _counts(out.stdout)
    print(f"\nslice: {counts}")
    # every ops file with implementation tests contributes a case upstream expects to
    # pass on the FVP, and it passes on the host
    passed_files = set(re.findall(r"^slice outcome: (\w+) passed$", out.stdout, re.M))
    # a file whose only case upstream skips outright (lstm: "Not implemented yet")
    skipped_files = set(re.findall(r"^slice outcome: (\w+) skipped$", out.stdout, re.M))
    assert len(skipped_files) <= 1 and len(passed_files) >= len(files) - 1, text[-5000:]
    missing = files - passed_files - skipped_files
    assert not missing, f"no passing case from {missing}\n{text[-5000:]}"
    assert "error" not in counts and "errors" not in counts, text[-5000:]
    # the programs really ran in etmetal's runtime: one run per executed case
    runs = int(re.search(r"host runs: (\d+)", out.stdout).group(1))
    executed = ("passed", "failed", "xfailed", "xpassed")
    assert runs == sum(counts.get(k, 0) for k in executed)
    section = out.stdout.split("etmetal Cortex-M host", 1)[1]
    assert f"{counts['passed']} passed" in section
    # upstream's strict xfails: refused as the FVP runner refuses them (xfailed), or a named
    # host/device difference (xpassed); none fails the run
    refused = section.split("refused as the FVP test runner", 1)[1].split("host/device", 1)[0]
    assert SOFTMAX_NOT_LAST in refused and DIV_BROADCAST in refused and CONV3D not in refused
    differences = section.split("host/device differences", 1)[1]
    assert CONV3D in differences and "portable convolution kernel" in differences
    assert "strict XPASS (upstream marks" not in section
    assert counts.get("failed", 0) == 0 and counts.get("xpassed") == 1, text[-5000:]
    assert out.returncode == 0, text[-5000:]
    # a missing optional model package is a skip that names it
    if importlib.util.find_spec("torchaudio") is None:
        assert "optional dependency 'torchaudio' is not installed" in out.stdout


@pytest.mark.timeout(1200)
def test_every_kernel_on_the_host_makes_upstreams_strict_xfail_a_failure(tmp_path):
    # --etmetal-cortex-m-kernels=all: no runner kernel set, so the softmax runs (and
    # matches the reference) and upstream's strict mark fails the run, listed on its own
    out = _pytest(
        "-p",
        "etmetal.testing.cortex_m_host",
        "--etmetal-cortex-m-kernels=all",
        "--pyargs",
        "executorch.backends.cortex_m.test.ops.test_softmax",
        "-k",
        "implementation and dim_not_last",
        cwd=tmp_path,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1 and _counts(out.stdout).get("failed") == 1, text[-5000:]
    section = out.stdout.split("etmetal Cortex-M host", 1)[1]
    assert "strict XPASS (upstream marks" in section and SOFTMAX_NOT_LAST in section
    assert "refused as the FVP test runner" not in section
    assert "every etmetal kernel" in out.stdout  # the header says which kernel set ran


def test_pyargs_resolves_namespace_packages_only():
    folder = cortex_m_host.upstream_test_dir()
    args = [
        "-k",
        "executorch.backends.cortex_m.test",
        "executorch.backends.cortex_m.test::test_x",
        "executorch.backends.cortex_m.test.ops",  # a regular package: pytest resolves it
    ]
    cortex_m_host._resolve_pyargs(args)
    assert args == [
        "-k",
        str(folder),
        f"{folder}::test_x",
        "executorch.backends.cortex_m.test.ops",
    ]
    assert (folder / "tester.py").exists()


def test_missing_optional_package_is_found_through_the_cause_chain():
    try:
        try:
            raise ModuleNotFoundError("No module named 'torchaudio'", name="torchaudio.models")
        except ModuleNotFoundError as inner:
            raise RuntimeError("ImportError while importing test module") from inner
    except RuntimeError as exc:
        assert cortex_m_host._missing_optional(exc) == "torchaudio"
    # a package that is not optional stays an error
    assert cortex_m_host._missing_optional(ModuleNotFoundError("x", name="tosa_serializer")) is None


def test_entry_point_plugin_is_inert_unless_asked_for(tmp_path):
    # an installed-looking distribution that declares the pytest11 entry point
    site = tmp_path / "site"
    info = site / "etmetal_plugin_probe-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: etmetal-plugin-probe\nVersion: 0\n"
    )
    (info / "entry_points.txt").write_text(
        "[pytest11]\netmetal.testing.cortex_m_host = etmetal.testing.cortex_m_host\n"
    )
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, **env},
    )  # fmt: skip
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "1 passed" in plain.stdout
    assert "etmetal Cortex-M host" not in plain.stdout  # loaded, but changed nothing
    helped = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "--help"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, **env},
    )  # fmt: skip
    assert "--etmetal-cortex-m-host" in helped.stdout
