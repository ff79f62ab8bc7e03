"""pytest plugin: ExecuTorch's Cortex-M tests run their programs in etmetal's runtime, not the FVP.

ExecuTorch's ``CortexMTester`` quantizes, runs the Cortex-M passes, serializes a
``.pte`` and hands it to ``arm_executor_runner`` on a Corstone FVP; without the Arm
toolchain every ``test_implementation_*`` case stops at a missing ELF. With this
plugin only that last step changes: the serialized program runs in
``etmetal.runtime`` on this host (the ``cortex_m::`` operators on etmetal's
reference kernels), and upstream's own comparison (``qtol``/``atol`` against the
quantized exported program) judges the result. Nothing else is touched: test
ids, xfail marks and every other test run as upstream wrote them.

Off unless asked for (it is installed as a ``pytest11`` entry point, so it is always
loaded, but it changes nothing until one of these is given)::

    pytest -p etmetal.testing.cortex_m_host --pyargs executorch.backends.cortex_m.test -k implementation
    pytest --etmetal-cortex-m-host <path to executorch>/backends/cortex_m/test -k implementation

When active it also

- resolves ``--pyargs`` names of namespace packages (ExecuTorch's Cortex-M test folder
  has no ``__init__.py``) to their folder, so the module form works from any directory;
- reports a test module that cannot be imported because an optional model package
  (torchvision, torchaudio, ...) is missing as a skip naming the package;
- runs only the kernels upstream's FVP test runner is built with (its selective build,
  :mod:`etmetal.testing.cortex_m_fvp`): a program calling any other operator is refused
  as the runner refuses it, so the cases upstream expects to fail for that reason fail
  here too (``--etmetal-cortex-m-kernels=all`` lifts this and uses every etmetal kernel);
- reports the strict xfails that pass because the host is more capable than the device
  (:data:`etmetal.testing.cortex_m_fvp.HOST_DIFFERENCES`, each with its reason) as a
  named host/device difference, an XPASS that does not fail the run;
- lists any other strict XPASS (upstream expects a failure on the FVP, the host run
  matches the reference) in a summary section of its own; pytest still counts those as
  failures, because the marks are upstream's.

``docs/cortex_m_host.md`` lists each upstream xfail and why it fails on the FVP.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from etmetal.testing import cortex_m_fvp

PLUGIN_NAME = "etmetal.testing.cortex_m_host"
OPTION = "--etmetal-cortex-m-host"
KERNELS_OPTION = "--etmetal-cortex-m-kernels"

# Packages only some model tests need; a module that cannot import one is a skip.
OPTIONAL_PACKAGES = frozenset({"torchvision", "torchaudio", "ultralytics", "timm", "transformers"})

_TESTER_MODULE = "executorch.backends.cortex_m.test.tester"
_STRICT_XPASS_PREFIX = "[XPASS(strict)]"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("etmetal")
    group.addoption(
        OPTION,
        action="store_true",
        default=False,
        dest="etmetal_cortex_m_host",
        help="run ExecuTorch's Cortex-M tester programs in etmetal's runtime instead of the FVP",
    )
    group.addoption(
        KERNELS_OPTION,
        choices=("fvp", "all"),
        default="fvp",
        dest="etmetal_cortex_m_kernels",
        help="fvp (default): only the operators upstream's FVP test runner is built with; "
        "host: every etmetal kernel",
    )


def _requested(namespace) -> bool:
    """Whether this run asked for the plugin: the option, or ``-p`` naming this module."""
    if getattr(namespace, "etmetal_cortex_m_host", False):
        return True
    return PLUGIN_NAME in (getattr(namespace, "plugins", None) or [])


# ------------------------------------------------------------------ --pyargs namespace packages


def _namespace_package_dir(name: str) -> str | None:
    """The single folder of a namespace package, or None for anything else."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, AttributeError, ValueError):
        return None
    if spec is None or spec.origin not in (None, "namespace"):
        return None
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if len(locations) == 1 else None


def _resolve_pyargs(args: list[str]) -> None:
    """Replace namespace-package names among ``args`` with their folder, in place."""
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            continue
        module, sep, rest = arg.partition("::")
        folder = _namespace_package_dir(module) if "." in module or module.isidentifier() else None
        if folder is not None:
            args[i] = folder + sep + rest


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser, args: list[str]) -> None:
    namespace = early_config.known_args_namespace
    if not (_requested(namespace) and getattr(namespace, "pyargs", False)):
        return
    # pytest 9 resolves --pyargs names to files only for regular packages (unless
    # consider_namespace_packages is set): hand it the folder instead. Both the raw
    # arguments (parsed again later) and the early namespace (initial conftests) change.
    _resolve_pyargs(args)
    file_or_dir = getattr(namespace, "file_or_dir", None)
    if file_or_dir:
        _resolve_pyargs(file_or_dir)


# ------------------------------------------------------------------ the run step


def run_program(buffer: bytes, inputs, *, runner_kernels: bool = False) -> list:
    """Run a serialized program's ``forward`` in etmetal's runtime; the outputs as a list.

    With ``runner_kernels`` (the plugin's default, ``--etmetal-cortex-m-kernels=fvp``), a
    program calling an operator the FVP test runner lacks raises
    :class:`~etmetal.testing.cortex_m_fvp.RunnerKernelMissing` before it runs. Without it
    (the backend-suite flow), every etmetal kernel is available."""
    from torch.utils._pytree import tree_flatten

    from etmetal.runtime import Runtime

    if runner_kernels:
        cortex_m_fvp.check_runner_kernels(cortex_m_fvp.operator_names(buffer))

    flat, _ = tree_flatten(inputs)
    method = Runtime.get().load_program(buffer).load_method("forward")
    try:
        return copy.deepcopy(list(method.execute(list(flat))))
    finally:
        method.destroy()


def host_serialize_class(base: type, runner_kernels: bool = True) -> type:
    """A subclass of upstream's Cortex-M ``Serialize`` stage whose run step is etmetal's."""

    class HostCortexMSerialize(base):
        """Upstream's Cortex-M Serialize stage; ``run_artifact`` runs the ``.pte`` on the host."""

        def run_artifact(self, inputs):
            if self.buffer is None:
                raise RuntimeError("the Serialize stage has not run: no program to execute")
            return run_program(self.buffer, inputs, runner_kernels=runner_kernels)

    HostCortexMSerialize.__qualname__ = HostCortexMSerialize.__name__
    return HostCortexMSerialize


class _Patch:
    """Swaps the tester module's ``CortexMSerialize`` (``CortexMTester`` looks the name up
    when it builds its stages) and puts it back at the end of the session."""

    def __init__(self, runner_kernels: bool = True) -> None:
        import importlib

        try:
            self.module = importlib.import_module(_TESTER_MODULE)
        except ImportError as exc:
            raise pytest.UsageError(
                f"{PLUGIN_NAME}: ExecuTorch's Cortex-M tester ({_TESTER_MODULE}) cannot be "
                f"imported: {exc}. It needs the Arm TOSA serializer: pip install 'etmetal[cortex-m]'"
            ) from exc
        self.original = self.module.CortexMSerialize
        self.module.CortexMSerialize = host_serialize_class(self.original, runner_kernels)

    def undo(self) -> None:
        self.module.CortexMSerialize = self.original


# ------------------------------------------------------------------ optional dependencies


def _missing_optional(exc: BaseException | None) -> str | None:
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            root = exc.name.split(".")[0]
            if root in OPTIONAL_PACKAGES:
                return root
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_make_collect_report(collector: pytest.Collector):
    if not isinstance(collector, pytest.Module) or not _requested(collector.config.option):
        return None
    try:
        collector.obj  # noqa: B018 - imports the test module (cached on success)
    except (Exception, pytest.skip.Exception) as exc:
        # anything but a missing optional package: the default hook imports again and
        # reports it as pytest always does (an importorskip stays that module's skip)
        package = _missing_optional(exc)
        if package is None:
            return None
        message = f"optional dependency {package!r} is not installed (pip install {package})"
        return pytest.CollectReport(
            collector.nodeid, "skipped", (str(collector.path), None, message), result=[]
        )
    return None


# ------------------------------------------------------------------ session


class HostSession:
    """The active plugin's per-session part (registered only when the plugin is asked for):
    the patched run step, and what the summary lists (strict XPASS cases, named host/device
    differences, programs the FVP runner's kernel set refuses)."""

    def __init__(self, runner_kernels: bool = True) -> None:
        self.runner_kernels = runner_kernels
        self.patch = _Patch(runner_kernels)
        self.strict_xpass: list[tuple[str, str]] = []
        self.differences: list[tuple[str, str]] = []
        self.refused: list[tuple[str, str]] = []

    def pytest_report_header(self) -> str:
        kernels = (
            "the FVP test runner's kernel set" if self.runner_kernels else "every etmetal kernel"
        )
        return f"etmetal: Cortex-M tester programs run in etmetal's runtime (no FVP), {kernels}"

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: sees pytest's xfail verdict
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        text = report.longrepr if isinstance(report.longrepr, str) else ""
        if report.when != "call" or not (report.failed and text.startswith(_STRICT_XPASS_PREFIX)):
            return
        if cortex_m_fvp.host_difference(report.nodeid) is not None:
            # what pytest reports for a non-strict xfail that passes: an XPASS, not a failure
            report.outcome = "passed"
            report.wasxfail = text[len(_STRICT_XPASS_PREFIX) :].strip()
            report.longrepr = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # runs in the controller for xdist workers' reports too, so it reads reports only
        if report.when != "call":
            return
        text = report.longrepr if isinstance(report.longrepr, str) else ""
        if report.failed and text.startswith(_STRICT_XPASS_PREFIX):
            self.strict_xpass.append((report.nodeid, text[len(_STRICT_XPASS_PREFIX) :].strip()))
        elif report.passed and hasattr(report, "wasxfail"):
            diff = cortex_m_fvp.host_difference(report.nodeid)
            if diff is not None:
                self.differences.append((report.nodeid, diff.reason))
        elif report.skipped and hasattr(report, "wasxfail"):
            refused = cortex_m_fvp.RunnerKernelMissing.__name__ in str(report.longrepr)
            if refused:
                self.refused.append((report.nodeid, report.wasxfail))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        stats = terminalreporter.stats
        counts = {k: len(stats.get(k, [])) for k in ("passed", "failed", "skipped", "xfailed")}
        counts["xpassed"] = len(stats.get("xpassed", []))
        counts["strict XPASS"] = len(self.strict_xpass)
        counts["failed"] -= counts["strict XPASS"]
        counts["errors"] = len(stats.get("error", []))
        write = terminalreporter.write_line
        terminalreporter.section("etmetal Cortex-M host", sep="=")
        write(
            "programs ran in etmetal's runtime: "
            + ", ".join(f"{n} {k}" for k, n in counts.items())
            + " (failed excludes strict XPASS)"
        )
        if self.refused:
            write(
                "refused as the FVP test runner refuses them (an operator outside its kernel "
                "set; upstream expects these to fail):"
            )
            for nodeid, _ in self.refused:
                write(f"  {nodeid}")
        if self.differences:
            write(
                "host/device differences (upstream expects a failure on the FVP; the host is "
                "more capable, so the case passes and does not fail the run):"
            )
            for nodeid, reason in self.differences:
                write(f"  {nodeid}  [{reason}]")
        if self.strict_xpass:
            write(
                "strict XPASS (upstream marks these xfail(strict=True) for the FVP; the host "
                "run matches the reference):"
            )
            for nodeid, reason in self.strict_xpass:
                write(f"  {nodeid}  [{reason}]")

    def pytest_unconfigure(self) -> None:
        self.patch.undo()


def pytest_configure(config: pytest.Config) -> None:
    if _requested(config.option) and not config.pluginmanager.has_plugin(_SESSION_NAME):
        runner_kernels = config.getoption("etmetal_cortex_m_kernels", "fvp") == "fvp"
        config.pluginmanager.register(HostSession(runner_kernels), _SESSION_NAME)


_SESSION_NAME = "etmetal-cortex-m-host-session"


def upstream_test_dir() -> Path:
    """ExecuTorch's Cortex-M test folder in the installed wheel."""
    folder = _namespace_package_dir("executorch.backends.cortex_m.test")
    if folder is None:
        raise RuntimeError("executorch.backends.cortex_m.test is not installed")
    return Path(folder)
