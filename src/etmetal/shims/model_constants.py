"""A model container's constants: copied from its weights blob, or lent as user-managed
constants (``AotiModel(..., constants=...)``, :mod:`.user_constants`).

Both run while the container is being made, under the model's ``running`` record, and
read the model's loaded ``.so`` (``model._lib``), its container and its error check.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from etmetal.shims.abi_codes import DEVICE_CPU

from . import user_constants
from .bridge import BridgeError
from .model_run import AotiModelError
from .storage import HostAllocator, ShimError


def aligned_blob(
    blob: bytes | bytearray | memoryview | None, host: HostAllocator
) -> tuple[int, object]:
    """A pointer to the weights and the object keeping them alive (copied only if misaligned)."""
    if blob is None or len(blob) == 0:
        return 0, None
    arr = np.frombuffer(blob, dtype=np.uint8)
    if arr.ctypes.data % host.alignment == 0:
        return arr.ctypes.data, arr
    buf = host.allocate(arr.nbytes)
    buf.numpy()[:] = arr
    return buf.data_ptr(), buf


def load_from_blob(model: Any, num_constants: int) -> None:
    """Let ``model``'s container copy its ``num_constants`` constants from its weights
    blob, after checking the blob is large enough; the copy must reach etmetal's shims."""
    name = model.so_path.name
    need = model._size("AOTInductorModelContainerGetConstantsBlobSize")
    have = 0 if model._blob_owner is None else len(model._blob_owner)
    if have < need:
        raise AotiModelError(
            f"{name}: weights blob has {have} bytes, the model's {num_constants} constants "
            f"need {need}"
        )
    before = model._bridge.calls
    model._check(
        model._lib.AOTInductorModelUpdateConstantsFromBlob(model._container, model._blob_ptr),
        "loading constants from the weights blob",
    )
    if model._bridge.calls == before:
        raise BridgeError(
            f"{name}: constants loaded without any shim call reaching "
            "etmetal: the .so is bound to another aoti_torch implementation (or "
            "to the bridge of another ShimContext that loaded this file first: "
            "give each context its own copy of the file)"
        )


def lend(model: Any, count: int) -> list[int]:
    """Lend ``model.constants`` to its container as user-managed constants (no copy);
    returns the handles the model must release after deleting the container."""
    lib, container, name = model._lib, model._container, model.so_path.name
    try:
        user_constants.bind(lib, name)
        stored = user_constants.stored_constants(lib, container, count, model._check)
        user_constants.check_offered(stored, model.constants, name)
    except ShimError as exc:
        raise AotiModelError(str(exc)) from exc
    ctx = model.context
    before = set(ctx.handles)
    native = ctx.native
    # lent as native borrowed records while the native implementation serves
    lend_native = native is not None and native.fallbacks and model._device_type == DEVICE_CPU
    native_aliases: list[int] = []
    handles: list[int] = []
    try:
        with contextlib.ExitStack() as stack:
            if lend_native:
                native_aliases = stack.enter_context(native.aliases(len(stored)))
            handles = user_constants.lend(
                lib,
                container,
                {n: model.constants[n] for n, _, _ in stored},
                ctx.register,
                ctx.unregister,
                model._device_type,
                model._check,
                native=native if lend_native else None,
            )
    finally:
        # torch's container keeps each user-managed constant under a handle of its own
        # (MaybeOwningAtenTensorHandle(handle, user_managed=true) calls
        # aoti_torch_new_tensor_handle) that nothing ever deletes: ours to release
        # after the container, with the lent handles (C logged the native ones)
        lent = set(handles)
        aliases = [h for h in ctx.handles if h not in before and h not in lent]
        model._constant_handles = [*handles, *aliases, *native_aliases]
    return model._constant_handles
