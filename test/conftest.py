"""Suite-wide fixtures. Compiled AOTI artifacts are shared through the content-addressed
cache of ``etmetal.backend.aoti_compile`` (under the user cache dir), so each distinct
model compiles once per machine, whichever xdist worker asks first."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_lm_programs(tmp_path_factory):
    """The directory holding ``etmetal bench llm --config tiny``'s programs (the tiny LM,
    weights and KV cache shared / upstream's one-blob layout), lowered once per suite run
    by the bench's own code: xdist workers share the suite's temp directory, and the first
    to ask lowers them under a lock while the others wait."""
    from pathlib import Path

    from filelock import FileLock

    from etmetal.bench import llm as llm_bench
    from etmetal.examples import llm

    suite_tmp = os.environ.get("ETMETAL_SUITE_TMPDIR")
    if suite_tmp:
        directory = Path(suite_tmp) / "tiny-lm-programs"
        directory.mkdir(exist_ok=True)
    else:
        directory = tmp_path_factory.mktemp("tiny-lm-programs")
    with FileLock(str(directory) + ".lock"):
        llm_bench.lower_programs(llm.make_decoder_lm(llm.CONFIGS["tiny"]), "tiny", directory)
    return directory


def pytest_configure(config):
    # one intra-op thread per xdist worker: two workers on two cores
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
        # and in the processes the worker starts: two workers already fill two cores, and
        # `host` artifacts (keyed by the thread count their kernels were generated for)
        # compiled in a subprocess are then the ones an in-process compile finds
        os.environ.setdefault("OMP_NUM_THREADS", "1")


# --- no temp files left behind (issue 8) ---------------------------------------------------
# The suite runs with a private temp directory (other processes on the machine cannot add
# to it); at the end, any etmetal-* entry left there fails the session.
_SUITE_TMP = None


@pytest.hookimpl(tryfirst=True)  # before xdist starts its workers
def pytest_sessionstart(session):
    global _SUITE_TMP
    import tempfile

    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("ETMETAL_SUITE_TMPDIR"):
        return  # xdist workers inherit the controller's TMPDIR
    _SUITE_TMP = tempfile.mkdtemp(prefix="pytest-etmetal-suite-")
    os.environ["TMPDIR"] = os.environ["ETMETAL_SUITE_TMPDIR"] = _SUITE_TMP
    tempfile.tempdir = _SUITE_TMP


def pytest_sessionfinish(session, exitstatus):
    import shutil
    import tempfile

    if _SUITE_TMP is None:
        return
    import gc

    gc.collect()  # delegates released by collection remove their directories
    left = sorted(p for p in os.listdir(_SUITE_TMP) if p.startswith("etmetal-"))
    if left:
        print(f"\netmetal: temp entries left behind in {_SUITE_TMP}: {left}")
        session.exitstatus = 1
    tempfile.tempdir = None
    shutil.rmtree(_SUITE_TMP, ignore_errors=True)
