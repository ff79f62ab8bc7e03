"""torch's own AOTI runner, the reference arm the delegate benchmarks time etmetal against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def torch_runner(so_path: Path, weights_path: Path) -> Any:
    """torch's own AOTI runner over a ``link_libtorch=True`` build, weights from the blob.

    etmetal's bridge stays out of the global symbol scope, so this works whether or not
    etmetal has loaded models in this process already.
    """
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(so_path), 1)
    if weights_path.stat().st_size:  # a model without constants has an empty blob
        runner.update_constant_buffer_from_blob(str(weights_path))
    return runner
