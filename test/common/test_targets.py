"""The target records (``etmetal.common.targets``): the only place a target is spelled, and
what each record says checked against torch and against the code that reads it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import etmetal
from etmetal.common import targets
from etmetal.common.fallback_table import DEFAULT_RUNTIME, FALLBACKS

ROOT = Path(etmetal.__file__).resolve().parent
RECORD_MODULE = ROOT / "common" / "targets.py"
# a target name or a torch device string written as a double-quoted literal
TARGET_LITERAL = re.compile(r'"(?:mps_emulated|host|mps)"')


def spelled_targets(root: Path, allowed: Path) -> list[str]:
    """``path:line: text`` of every line under ``root`` that spells a target literally."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if TARGET_LITERAL.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_only_the_record_module_spells_a_target():
    assert spelled_targets(ROOT, RECORD_MODULE) == []
    # and the record module does: the scan looks at the right text
    assert TARGET_LITERAL.search(RECORD_MODULE.read_text())


def test_the_scan_finds_a_target_spelled_elsewhere(tmp_path):
    (tmp_path / "records.py").write_text('HOST = "host"\n')
    (tmp_path / "user.py").write_text('x = 1\nif target == "mps_emulated":\n    pass\n')
    (tmp_path / "device.py").write_text('torch.device("mps")\n')
    found = spelled_targets(tmp_path, tmp_path / "records.py")
    assert found == [
        'device.py:1: torch.device("mps")',
        'user.py:2: if target == "mps_emulated":',
    ]


def test_records_are_frozen_and_complete():
    assert set(targets.TARGETS) == {"host", "mps", "mps_emulated"}
    for name, record in targets.TARGETS.items():
        assert record.name == name and str(record) == name
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.name = "other"  # type: ignore[misc]
    assert (targets.AUTO, *targets.TARGETS) == targets.CHOICES


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_record_devices_are_torch_devices_with_a_c_shim_header(name):
    record = targets.TARGETS[name]
    for device in (record.torch_device, record.container_device):
        assert torch.device(device).type == device
    # torch declares the fallbacks of a device in c_shim_<device>.h: the prefix is one
    include = Path(torch.__file__).parent / "include/torch/csrc/inductor/aoti_torch/generated"
    assert (include / f"c_shim_{record.shim_prefix}.h").is_file()


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_tables_read_the_records(name):
    record = targets.TARGETS[name]
    prefix, ops = FALLBACKS[name]
    assert prefix == record.shim_prefix and record.fallbacks <= ops
    assert DEFAULT_RUNTIME[name] == record.default_runtime


def test_the_runtime_runs_exactly_the_records_it_can():
    from etmetal.runtime.metal_delegate import TARGET_DEVICES

    assert {
        t.name: t.container_device for t in targets.TARGETS.values() if t.etmetal_runs
    } == TARGET_DEVICES
    assert "mps" not in TARGET_DEVICES  # an mps .so needs Apple's Metal


def test_get_target_names_the_bad_value():
    assert targets.get_target("host") is targets.HOST
    assert targets.get_target(targets.MPS) is targets.MPS
    with pytest.raises(ValueError, match=r"unknown Metal target 'gpu'.*'mps_emulated'"):
        targets.get_target("gpu")
    with pytest.raises(ValueError, match=r"'auto' is resolved"):
        targets.get_target("auto")
    with pytest.raises(ValueError, match="unknown Metal target 3"):
        targets.get_target(3)  # type: ignore[arg-type]
