"""The steady-state run of an ``AotiModel``: one call into C per run (``etm_run``).

After its first run a model knows what its outputs look like. From then on a run
writes each input's record image only when the input tensor changed (address,
offset, sizes, strides, dtype), predicts each output's geometry, and lets the
bridge do the rest: borrow the inputs as native records, run the container, and
copy each native output that came back as predicted straight into its destination
(a fresh tensor for small outputs, or the caller's planned tensor). Anything
unexpected (an output Python touched, a new shape, a failed run) is handed back to
``AotiModel``'s general path, so the result is the same either way.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import torch

from etmetal.shims.abi_codes import ITEMSIZE, TORCH_TO_DTYPE

from .native_tensors import MAX_DIMS, NO_SLOT, RECORD_SIZE, OutSpec, RunCall, pack_image
from .storage import packed_extent

# new output tensors up to this size are filled by a copy in C; larger ones are adopted
# (no copy) through the general path. Adopting costs the general path's Python around the
# run: the 4-layer transformer's 256 KiB output made its run 2-4% slower adopted (limit
# 64 KiB) than copied (etmetal bench native, interleaved), the copy itself a few
# microseconds of a 39 ms run. Kept at a quarter of native_tensors.NATIVE_LIMIT, so a
# native output past it (adopted) still exists
COPY_LIMIT = 256 << 10

# (sizes, strides, dtype, nbytes) of an output, as the bridge reports it
Geometry = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, int]


def geometry_of(t: torch.Tensor) -> Geometry:
    sizes, strides = tuple(t.shape), tuple(t.stride())
    return sizes, strides, t.dtype, packed_extent(sizes, strides) * t.element_size()


class SteadyResult(NamedTuple):
    """What one steady run did (the container ran: ``rc`` is its return code)."""

    rc: int
    # per output: the new tensor, None when it went straight into the caller's tensor, or
    # (when ``pending``) the live handle, an int, that the general path must take
    results: list[torch.Tensor | int | None]
    pending: bool  # some output came back as a handle Python must adopt


class SteadyRun:
    """The prepared ``etm_call`` of one model container and the per-run bookkeeping."""

    def __init__(
        self,
        ctx,
        run_fn: int,
        container: int,
        n_in: int,
        n_out: int,
        proxy: int | None = None,
        device_type: int = 0,
    ) -> None:
        """``ctx``: the model's ``ShimContext`` (its bridge is loaded); ``proxy``: the proxy
        executor handle the runs pass (None: the model has none); ``device_type``: the c10
        device the inputs stand for (host memory either way: 0, or 13 for mps)."""
        self.ctx = ctx
        self.device_type = device_type
        self.n_in, self.n_out = n_in, n_out
        self._images = ctypes.create_string_buffer(max(n_in, 1) * RECORD_SIZE)
        self._in_handles = (ctypes.c_void_p * max(n_in, 1))()
        self._out_handles = (ctypes.c_void_p * max(n_out, 1))()
        self._outs = (OutSpec * max(n_out, 1))()
        self._specs = [self._outs[i] for i in range(n_out)]  # views made once, not per run
        self._dsts = (ctypes.c_int64 * max(n_out, 1))()  # per run: where each output goes
        self.call = self._call = RunCall(
            run_fn,
            container,
            ctypes.addressof(self._images),
            n_in,
            ctypes.addressof(self._in_handles),
            ctypes.addressof(self._out_handles),
            n_out,
            ctypes.addressof(self._outs),
            ctypes.addressof(self._dsts),
            0,
            0,
            proxy,
        )
        self._call_arg = ctypes.c_void_p(ctypes.addressof(self._call))
        # 1 once the first run taught the outputs, 0 again when the container is deleted:
        # what a FastRun (fast_run.py) over this call reads before it runs
        self.armed = ctypes.c_int64(0)
        self._etm_run = ctx.native.run
        self._keys: list[tuple | None] = [None] * n_in
        self.geometries: list[Geometry | None] = [None] * n_out
        self._makers: list = [None] * n_out  # makes a new tensor of output i's geometry

    def learn_output(self, i: int, t: torch.Tensor | None) -> None:
        """Predict output ``i`` like ``t`` (None: do not predict it; it is not native)."""
        spec = self._specs[i]
        if t is None or t.dim() > MAX_DIMS or t.dtype not in TORCH_TO_DTYPE:
            self.geometries[i] = None
            spec.nbytes = -1  # never matches a record
            return
        geometry = self.geometries[i] = geometry_of(t)
        sizes, strides, dtype, nbytes = geometry
        template = torch.empty_strided(sizes, strides, dtype=dtype)
        if torch.empty_like(template).stride() == strides:
            self._makers[i] = partial(torch.empty_like, template)  # the cheapest way
        else:  # a view with holes: empty_like would pack it
            self._makers[i] = partial(torch.empty_strided, sizes, strides, dtype=dtype)
        spec.dim, spec.dtype, spec.nbytes = len(sizes), TORCH_TO_DTYPE[dtype], nbytes
        spec.sizes[: len(sizes)] = sizes
        spec.strides[: len(strides)] = strides

    def _set_input(self, i: int, t: torch.Tensor, key: tuple) -> bool:
        """Write input ``i``'s image; False when the general path must handle ``t``."""
        dtype = TORCH_TO_DTYPE.get(t.dtype)
        if dtype is None or not t.is_cpu or t.dim() > MAX_DIMS:
            return False
        untyped = t.untyped_storage()
        offset = t.storage_offset()
        if untyped.data_ptr() + offset * ITEMSIZE[dtype] != t.data_ptr():
            return False
        pack_image(
            self._images,
            i,
            t.data_ptr(),
            dtype,
            tuple(t.shape),
            tuple(t.stride()),
            offset,
            untyped.nbytes(),
            self.device_type,
        )
        self._keys[i] = key
        return True

    def run(
        self, inputs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor] | None
    ) -> SteadyResult | None:
        """Run once; None when this run cannot go this way (nothing ran)."""
        if len(inputs) != self.n_in:
            return None
        keys = self._keys
        try:
            for i, t in enumerate(inputs):
                key = (t.data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)
                if key != keys[i] and not self._set_input(i, t, key):
                    return None
        except (AttributeError, TypeError):  # not a tensor: the general path reports it
            return None
        where, results = self._dsts, [None] * self.n_out
        for i, geometry in enumerate(self.geometries):
            if geometry is None:
                where[i] = 0
            elif dsts is not None:
                d = dsts[i]
                same = d.shape == geometry[0] and d.stride() == geometry[1]
                where[i] = d.data_ptr() if same and d.dtype == geometry[2] else 0
            elif geometry[3] <= COPY_LIMIT:
                r = results[i] = self._makers[i]()
                where[i] = r.data_ptr()
            else:
                where[i] = 0
        rc = self._etm_run(self._call_arg)
        if rc == NO_SLOT:
            return None
        return self.complete(rc, results)

    def complete(self, rc: int, results: list) -> SteadyResult:
        """After ``etm_run`` returned ``rc``: release the inputs Python adopted and the
        container left, and mark the outputs Python must take (their handles)."""
        call = self._call
        if call.leftover:  # inputs Python adopted and the container left behind
            outputs = set(self._out_handles[: self.n_out])
            handles = self.ctx.handles
            for h in self._in_handles[: self.n_in]:
                if h in handles and h not in outputs:
                    self.ctx.unregister(h)
        if not call.pending:
            return SteadyResult(rc, results, pending=False)
        for i, h in enumerate(self._out_handles[: self.n_out]):
            if h:
                results[i] = h
        return SteadyResult(rc, results, pending=True)
