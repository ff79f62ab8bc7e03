"""Helper pytest plugin for ``test_cortex_m_host.py``'s subprocess runs (loaded with ``-p``).

- keeps the first case of each ``ops/`` test module that upstream expects to pass (no
  xfail mark), plus the node ids listed in ``ETMETAL_SLICE_EXTRA``;
- counts the programs that really ran in etmetal's runtime and prints ``host runs: N``;
- prints ``slice outcome: <test file stem> <outcome>`` for each file's first case.
"""

from __future__ import annotations

import os

import pytest

_runs = 0


def pytest_configure(config):
    import etmetal.testing.cortex_m_host as plugin

    original = plugin.run_program

    def counting(buffer, inputs, **kwargs):
        global _runs
        _runs += 1
        return original(buffer, inputs, **kwargs)

    plugin.run_program = counting


@pytest.hookimpl(trylast=True)  # after -k deselected
def pytest_collection_modifyitems(config, items):
    extra = [e for e in os.environ.get("ETMETAL_SLICE_EXTRA", "").split(",") if e]
    kept, seen, dropped, firsts = [], set(), [], []
    for item in items:
        module = item.path
        wanted = any(item.nodeid.endswith(e) for e in extra)
        first = (
            module.parent.name == "ops"
            and "implementation" in item.name
            and module not in seen
            and item.get_closest_marker("xfail") is None
        )
        if first:
            seen.add(module)
            firsts.append(item)
        if wanted or first:
            kept.append(item)
        else:
            dropped.append(item)
    items[:] = kept
    # outcomes per file: the first cases only (the extra ones are checked by name)
    _files.update({item.nodeid: item.path.stem for item in firsts})
    config.hook.pytest_deselected(items=dropped)


_files: dict[str, str] = {}
_outcomes: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    first = report.nodeid in _files
    if first and (report.when == "call" or (report.when == "setup" and not report.passed)):
        _outcomes.append((_files[report.nodeid], report.outcome))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"host runs: {_runs}")
    for stem, outcome in _outcomes:
        terminalreporter.write_line(f"slice outcome: {stem} {outcome}")
