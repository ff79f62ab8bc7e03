"""ExecuTorch's backend conformance suite, with an ``etmetal`` flow added.

The ``etmetal`` flow lowers exactly like the stock ``portable`` flow (no delegation) and
only swaps the run stage: the serialized ``.pte`` runs in ``etmetal.runtime`` instead of
the stock C++ runtime, so the two flows differ in nothing but the runtime.

The ``metal_host`` and ``metal_stock`` flows are delegated (``etmetal.testing.metal_flows``):
``MetalPartitioner`` for the ``host`` target lowers each case to AOTI ``.so`` delegates, run
by etmetal's runtime (``metal_host``) or, lowered for upstream's runtime, by the stock
runtime with etmetal's native ``MetalBackend`` registered (``metal_stock``). The
``metal_emulated`` flow is ``metal_host`` for the ``mps_emulated`` target. The script
reports how many of their passes really ran a delegated program and the most frequent
failure causes (``--flows metal_host metal_stock metal_emulated``).

The ``cortex_m_host`` flow (``etmetal.testing.cortex_m_flow``) is upstream's ``cortex_m`` flow
(quantize -> Cortex-M passes -> serialize) with the program run in etmetal's runtime instead
of the FVP; its failures are reported by the suite stage that failed and, for output
mismatches, by whether the lowered program or the runtime is the cause.

Used two ways:

- as a pytest plugin (``-p etmetal.testing.backend_suite``): registers the flow and fixes
  the suite's input seed so both flows see the same inputs;
- from ``etmetal regress backend-suite [--flows portable etmetal] [-k EXPR] [--json out.json]``:
  :func:`run_flows` runs the operator suite once per flow in subprocesses
  and prints pass/fail/skip counts and every case that passes on one flow only.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SEED_ENV = "ETMETAL_SUITE_SEED"
DELEGATED_LOG_ENV = "ETMETAL_SUITE_DELEGATED_LOG"
DEFAULT_SEED = 20260101


def _make_flow():
    from executorch.backends.test.harness import Tester
    from executorch.backends.test.harness.stages import Serialize, StageType
    from executorch.backends.test.suite.flow import TestFlow
    from torch.utils._pytree import tree_flatten

    class EtmetalSerialize(Serialize):
        """The stock Serialize stage, run by etmetal's runtime."""

        def run_artifact(self, inputs):
            from etmetal.runtime import Runtime

            flat, _ = tree_flatten(inputs)
            program = Runtime.get().load_program(self.buffer)
            method = program.load_method("forward")
            return copy.deepcopy(method.execute(list(flat)))

    class EtmetalTester(Tester):
        def __init__(self, module, example_inputs, dynamic_shapes=None):
            stages = Tester.default_stage_classes()
            stages[StageType.SERIALIZE] = EtmetalSerialize
            super().__init__(module, example_inputs, stages, dynamic_shapes=dynamic_shapes)

    return TestFlow("etmetal", backend="etmetal", tester_factory=EtmetalTester, is_delegated=False)


ETMETAL_TEST_FLOW = None
METAL_TEST_FLOWS: dict = {}  # metal_flows.FLOW_NAMES -> TestFlow
CORTEX_M_HOST_TEST_FLOW = None


def _make_cortex_m_host_flow():
    """``cortex_m_host`` (``etmetal.testing.cortex_m_flow``), or None without the Cortex-M
    test stack (the ``cortex-m`` extra)."""
    try:
        from etmetal.testing.cortex_m_flow import make_flow
    except ImportError:
        return None
    return make_flow()


def _install() -> None:
    """Add the flow to the suite's registry and pin the input seed (plugin import time)."""
    global ETMETAL_TEST_FLOW, CORTEX_M_HOST_TEST_FLOW
    import executorch.backends.test.suite.flow as flow_module
    from executorch.backends.test.suite import reporting

    from etmetal.testing import metal_flows

    if getattr(flow_module.all_flows, "_etmetal", False):
        return
    ETMETAL_TEST_FLOW = _make_flow()
    for name in metal_flows.FLOW_NAMES:
        METAL_TEST_FLOWS[name] = metal_flows.make_flow(name, DELEGATED_LOG_ENV)
    CORTEX_M_HOST_TEST_FLOW = _make_cortex_m_host_flow()
    stock_all_flows = flow_module.all_flows

    def all_flows():
        flows = stock_all_flows()
        flows[ETMETAL_TEST_FLOW.name] = ETMETAL_TEST_FLOW
        flows.update(METAL_TEST_FLOWS)
        if CORTEX_M_HOST_TEST_FLOW is not None:
            flows[CORTEX_M_HOST_TEST_FLOW.name] = CORTEX_M_HOST_TEST_FLOW
        return flows

    all_flows._etmetal = True
    flow_module.all_flows = all_flows
    if reporting.get_active_test_session() is None:
        reporting.begin_test_session(None, seed=int(os.environ.get(SEED_ENV, DEFAULT_SEED)))


_install()

RESULTS_PROPERTY = "suite_results"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Record the suite's own verdicts (``TestResult`` names: QUANTIZE_FAIL, LOWER_FAIL,
    PTE_RUN_FAIL, OUTPUT_MISMATCH_FAIL, ...) as a junit property: the stage that failed."""
    report = yield
    runner = getattr(item, "funcargs", {}).get("test_runner")
    results = getattr(runner, "_results", None)
    if call.when == "call" and results:
        names = ",".join(r.result.name for r in results)
        item.user_properties.append((RESULTS_PROPERTY, names))  # junit reads the teardown's
    return report


# ----------------------------------------------------------------------------- script


def suite_dir() -> Path:
    import executorch.backends.test.suite as suite

    return Path(suite.__file__).parent


def files_defining(test_names: list[str]) -> list[str]:
    """The operator files (names relative to the suite's ``operators`` folder) that define
    the test functions ``test_names``: a session that collects only these starts faster
    than one that collects the whole suite and deselects."""
    operators = suite_dir() / "operators"
    wanted = {
        name: re.compile(rf"^\s*def {re.escape(name)}\(", re.MULTILINE) for name in test_names
    }
    found: dict[str, str] = {}
    for path in sorted(operators.glob("test_*.py")):
        text = path.read_text()
        for name, pattern in wanted.items():
            if name not in found and pattern.search(text):
                found[name] = path.name
    missing = sorted(set(test_names) - set(found))
    if missing:
        raise ValueError(f"no operator file of the suite ({operators}) defines {missing}")
    return sorted(set(found.values()))


def run_flows(
    flows: list[str],
    out_dir: Path,
    *,
    files: list[str] | None = None,
    keyword: str | None = None,
    workers: int = 1,
    timeouts: bool = True,
) -> dict[str, dict[str, str]]:
    """Run the operator suite (or ``files`` of it) for ``flows`` in one pytest session.

    Returns flow -> {test id without the flow: pass | fail | skip}.
    """
    xml_path = out_dir / "suite.xml"
    operators = suite_dir() / "operators"
    paths = [str(operators / f) for f in files] if files else [str(operators)]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        f"--rootdir={suite_dir()}",
        "-p",
        "etmetal.testing.backend_suite",
        "-p",
        "no:cacheprovider",
        "-m",
        " or ".join(f"flow_{f}" for f in flows),
        "-q",
        f"--junitxml={xml_path}",
        "-o",
        "junit_family=xunit2",
    ]
    if keyword:
        cmd += ["-k", keyword]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if not timeouts:  # the suite's per-case limits (120 s per operator case) assume an idle machine
        cmd += ["-p", "no:timeout"]
    env = dict(os.environ)
    env[DELEGATED_LOG_ENV] = str(out_dir / "delegated.log")
    # the results are in the XML; the session's own output (the dependencies' import-time
    # warnings included) matters only when it wrote none
    proc = subprocess.run(cmd, cwd=out_dir, capture_output=True, text=True, env=env)
    if not xml_path.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(
            f"the suite's pytest session wrote no results ({proc.returncode}):\n{tail}"
        )
    return {flow: parse_junit(xml_path, flow) for flow in flows}


def delegated_tests(out_dir: Path, flow: str) -> set[str]:
    """Test ids (flow stripped) of ``flow`` whose program was delegated and run (the
    ``metal_host`` and ``metal_stock`` flows record them; the suite serializes only delegated programs)."""
    log = out_dir / "delegated.log"
    if not log.exists():
        return set()
    ids = set()
    for line in log.read_text().splitlines():
        if f"[{flow}-" not in line and f"[{flow}]" not in line:
            continue
        path, *scopes = line.split("::")  # file::[Class::]test[params]
        name = scopes[-1].replace(f"[{flow}-", "[").replace(f"[{flow}]", "")
        classname = ".".join([f"{Path(path).parent.name}.{Path(path).stem}", *scopes[:-1]])
        ids.add(f"{classname}::{name}")
    return ids


_ERROR_LINE = re.compile(r"^E\s+((?:[\w.]+)(?:Error|Exception|Failure)\b.*)$", re.MULTILINE)


def failure_causes(xml_path: Path, flow: str, top: int = 10) -> list[tuple[int, str]]:
    """The most frequent root errors of ``flow``'s failed cases: (count, message)."""
    return _reasons(xml_path, flow, ("failure", "error"), top)


def failure_stages(xml_path: Path, flow: str) -> list[tuple[int, str]]:
    """``flow``'s failures grouped by the suite stage that failed (its ``TestResult``), with
    the ``cortex_m_host`` flow's mismatch analysis (lowered program or runtime) appended."""
    from etmetal.testing.cortex_m_flow import PROGRAM_CAUSE, RUNTIME_CAUSE

    counts: dict[str, int] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name", "")
        if f"[{flow}-" not in name and f"[{flow}]" not in name:
            continue
        node = case.find("failure")
        node = node if node is not None else case.find("error")
        if node is None:
            continue
        props = {p.get("name"): p.get("value") or "" for p in case.iter("property")}
        verdicts = props.get(RESULTS_PROPERTY, "").split(",")
        failed = [
            v for v in verdicts if v and v not in ("SUCCESS", "SUCCESS_UNDELEGATED", "SKIPPED")
        ]
        text = node.text or ""
        stage = failed[0] if failed else "no suite verdict"
        if "Timeout" in (node.get("message") or "") or "Timeout (>" in text:
            stage = "timeout (pytest-timeout)"
        if PROGRAM_CAUSE in text:
            stage += ": lowered program (equals the cortex_m program on the Python references)"
        elif RUNTIME_CAUSE in text:
            stage += ": runtime (differs from the cortex_m program on the Python references)"
        counts[stage] = counts.get(stage, 0) + 1
    return sorted(((n, c) for c, n in counts.items()), reverse=True)


def skip_reasons(xml_path: Path, flow: str, top: int = 10) -> list[tuple[int, str]]:
    """Why ``flow``'s cases were skipped, most frequent first: (count, message)."""
    return _reasons(xml_path, flow, ("skipped",), top)


def _reasons(xml_path: Path, flow: str, tags: tuple[str, ...], top: int) -> list[tuple[int, str]]:
    counts: dict[str, int] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name", "")
        if f"[{flow}-" not in name and f"[{flow}]" not in name:
            continue
        node = next((n for n in (case.find(t) for t in tags) if n is not None), None)
        if node is None:
            continue
        lines = [m for m in _ERROR_LINE.findall(node.text or "") if "Test failure." not in m]
        cause = lines[0] if lines else (node.get("message") or "?")
        cause = re.sub(r"\d+", "N", cause)[:160]  # group messages differing in numbers
        counts[cause] = counts.get(cause, 0) + 1
    return sorted(((n, c) for c, n in counts.items()), reverse=True)[:top]


def parse_junit(xml_path: Path, flow: str) -> dict[str, str]:
    """Outcomes of ``flow``'s cases; ids drop the flow parameter so flows line up."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name", "")
        if f"[{flow}-" not in name and f"[{flow}]" not in name:
            continue
        # the flow is the first parameter id: test_x[portable-float32] -> test_x[float32]
        name = name.replace(f"[{flow}-", "[").replace(f"[{flow}]", "")
        test_id = f"{case.get('classname')}::{name}"
        if case.find("skipped") is not None:
            outcomes[test_id] = "skip"
        elif case.find("failure") is not None or case.find("error") is not None:
            outcomes[test_id] = "fail"
        else:
            outcomes[test_id] = "pass"
    return outcomes


def compare(results: dict[str, dict[str, str]]) -> dict:
    summary: dict = {"counts": {}, "regressions": {}}
    for flow, outcomes in results.items():
        counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("pass", "fail", "skip")}
        counts["total"] = len(outcomes)
        summary["counts"][flow] = counts
    flows = list(results)
    for a in flows:
        for b in flows:
            if a == b:
                continue
            worse = sorted(
                t for t, v in results[a].items() if v == "pass" and results[b].get(t) != "pass"
            )
            summary["regressions"][f"pass on {a}, not on {b}"] = worse
    return summary
