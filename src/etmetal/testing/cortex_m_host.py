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
- lists strict XPASS cases (upstream expects a failure on the FVP, the host run matches
  the reference) in a summary section of their own; pytest still counts them as
  failures, because the marks are upstream's.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

PLUGIN_NAME = "etmetal.testing.cortex_m_host"
OPTION = "--etmetal-cortex-m-host"

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


def run_program(buffer: bytes, inputs) -> list:
    """Run a serialized program's ``forward`` in etmetal's runtime; the outputs as a list."""
    from torch.utils._pytree import tree_flatten

    from etmetal.runtime import Runtime

    flat, _ = tree_flatten(inputs)
    method = Runtime.get().load_program(buffer).load_method("forward")
    try:
        return copy.deepcopy(list(method.execute(list(flat))))
    finally:
        method.destroy()


def host_serialize_class(base: type) -> type:
    """A subclass of upstream's Cortex-M ``Serialize`` stage whose run step is etmetal's."""

    class HostCortexMSerialize(base):
        """Upstream's Cortex-M Serialize stage; ``run_artifact`` runs the ``.pte`` on the host."""

        def run_artifact(self, inputs):
            if self.buffer is None:
                raise RuntimeError("the Serialize stage has not run: no program to execute")
            return run_program(self.buffer, inputs)

    HostCortexMSerialize.__qualname__ = HostCortexMSerialize.__name__
    return HostCortexMSerialize


class _Patch:
    """Swaps the tester module's ``CortexMSerialize`` (``CortexMTester`` looks the name up
    when it builds its stages) and puts it back at the end of the session."""

    def __init__(self) -> None:
        import importlib

        try:
            self.module = importlib.import_module(_TESTER_MODULE)
        except ImportError as exc:
            raise pytest.UsageError(
                f"{PLUGIN_NAME}: ExecuTorch's Cortex-M tester ({_TESTER_MODULE}) cannot be "
                f"imported: {exc}. It needs the Arm TOSA serializer: pip install 'etmetal[cortex-m]'"
            ) from exc
        self.original = self.module.CortexMSerialize
        self.module.CortexMSerialize = host_serialize_class(self.original)

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
    the patched run step, and the strict XPASS cases for the summary."""

    def __init__(self) -> None:
        self.patch = _Patch()
        self.strict_xpass: list[tuple[str, str]] = []

    def pytest_report_header(self) -> str:
        return "etmetal: Cortex-M tester programs run in etmetal's runtime (no FVP)"

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # runs in the controller for xdist workers' reports too
        if report.when != "call" or not report.failed:
            return
        text = report.longrepr if isinstance(report.longrepr, str) else ""
        if text.startswith(_STRICT_XPASS_PREFIX):
            self.strict_xpass.append((report.nodeid, text[len(_STRICT_XPASS_PREFIX) :].strip()))

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
        config.pluginmanager.register(HostSession(), _SESSION_NAME)


_SESSION_NAME = "etmetal-cortex-m-host-session"


def upstream_test_dir() -> Path:
    """ExecuTorch's Cortex-M test folder in the installed wheel."""
    folder = _namespace_package_dir("executorch.backends.cortex_m.test")
    if folder is None:
        raise RuntimeError("executorch.backends.cortex_m.test is not installed")
    return Path(folder)
