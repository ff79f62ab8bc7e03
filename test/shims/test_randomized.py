"""10,000 random shim calls against a small reference model of storages, counts and contents.

The reference knows nothing of etmetal's classes: it keeps, per storage, a count and
a numpy mirror of the bytes; per handle, the view geometry. After every call the
live tensors/storages/bytes must agree with ``memory_stats()`` and the touched
tensor's values (read back through the C getters and the raw data pointer) must
agree with the mirror. Invalid calls are mixed in and must only return an error code.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import pytest

from etmetal.shims import clear_last_error, last_error, memory_stats

DTYPES = {6: np.float32, 7: np.float64, 3: np.int32}
N_CALLS = 10_000


@dataclass
class RefStorage:
    nbytes: int
    owned: bool
    dtype: type
    mirror: np.ndarray  # typed copy of the storage's contents
    count: int = 0
    keepalive: object = None


@dataclass
class RefTensor:
    storage: RefStorage
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return int(np.prod(self.sizes)) if self.sizes else 1

    def span(self) -> tuple[int, int]:
        if 0 in self.sizes:
            return self.offset, self.offset
        end = self.offset + 1 + sum((s - 1) * st for s, st in zip(self.sizes, self.strides))
        return self.offset, end

    def values(self) -> np.ndarray:
        m = self.storage.mirror
        item = m.itemsize
        return np.lib.stride_tricks.as_strided(
            m[self.offset :], self.sizes, tuple(st * item for st in self.strides), writeable=True
        )


@dataclass
class Reference:
    handles: dict[int, RefTensor] = field(default_factory=dict)
    dead: list[int] = field(default_factory=list)

    def add(self, handle: int, t: RefTensor) -> None:
        t.storage.count += 1
        self.handles[handle] = t

    def remove(self, handle: int) -> None:
        t = self.handles.pop(handle)
        t.storage.count -= 1
        self.dead.append(handle)

    def live_storages(self) -> list[RefStorage]:
        seen = {id(t.storage): t.storage for t in self.handles.values()}
        return list(seen.values())


def _geometry(rng, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Random sizes and non-overlapping strides, sometimes with holes, in a random order."""
    sizes = tuple(
        int(rng.choice([1, 2, 2, 3, 4, 0] if rng.random() < 0.05 else [1, 2, 3, 4]))
        for _ in range(ndim)
    )
    strides = [0] * ndim
    inner_extent = 1
    for d in rng.permutation(ndim):
        st = inner_extent + (int(rng.integers(0, 3)) if rng.random() < 0.4 else 0)
        strides[d] = st
        inner_extent += (sizes[d] - 1) * st if sizes[d] else 0
    return sizes, tuple(strides)


def _extent(sizes, strides) -> int:
    if 0 in sizes:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(sizes, strides))


class Fuzzer:
    def __init__(self, cdrv, seed: int) -> None:
        self.c = cdrv
        self.rng = np.random.default_rng(seed)
        self.ref = Reference()
        self.calls = 0
        self.failures_expected = 0
        self.codes: list[tuple[str, int]] = []  # (call, returned code), in order

    # --- checks ---------------------------------------------------------------------------

    def check_counts(self) -> None:
        stats = memory_stats()
        live = self.ref.live_storages()
        assert stats.tensors == len(self.ref.handles)
        assert stats.storages == len(live)
        assert stats.bytes == sum(s.nbytes for s in live if s.owned)

    def check_contents(self, handle: int) -> None:
        t = self.ref.handles[handle]
        sizes, strides, _ = self.c.geometry(handle)
        assert (sizes, strides) == (t.sizes, t.strides)
        got = self.c.read(handle, t.storage.dtype)
        np.testing.assert_array_equal(got, t.values())

    def expect(self, rc: int, ok: bool, what: str) -> None:
        self.calls += 1
        self.codes.append((what.split()[0], rc))
        if ok:
            assert rc == 0, f"{what}: unexpected failure: {last_error()}"
        else:
            assert rc == 1, f"{what}: invalid call succeeded"
            assert last_error(), f"{what}: failure without a message"
            self.failures_expected += 1
            clear_last_error()

    def pick(self) -> int | None:
        if not self.ref.handles:
            return None
        keys = list(self.ref.handles)
        return keys[int(self.rng.integers(len(keys)))]

    # --- operations -----------------------------------------------------------------------

    def fill(self, handle: int, storage: RefStorage) -> None:
        """Give a fresh storage known contents, written through its raw pointer."""
        n = storage.nbytes // np.dtype(storage.dtype).itemsize
        if n == 0:
            return
        values = (self.rng.standard_normal(n) * 100).astype(storage.dtype)
        ptr = self.c.ptr(handle) - self.ref.handles[handle].offset * values.itemsize
        ctypes.memmove(ptr, values.ctypes.data, values.nbytes)
        storage.mirror[:] = values

    def op_create(self) -> None:
        code = int(self.rng.choice(list(DTYPES)))
        sizes, strides = _geometry(self.rng, int(self.rng.integers(0, 4)))
        h = ctypes.c_void_p()
        rc = self.c.lib.aoti_torch_empty_strided(
            len(sizes), self.c.i64s(sizes), self.c.i64s(strides), code, 0, 0, ctypes.byref(h)
        )
        self.expect(rc, True, "empty_strided")
        dtype = DTYPES[code]
        nbytes = _extent(sizes, strides) * np.dtype(dtype).itemsize
        storage = RefStorage(
            nbytes, True, dtype, np.zeros(nbytes // np.dtype(dtype).itemsize, dtype)
        )
        self.ref.add(h.value, RefTensor(storage, sizes, strides, 0))
        self.fill(h.value, storage)

    def op_blob(self) -> None:
        code = int(self.rng.choice(list(DTYPES)))
        dtype = DTYPES[code]
        sizes, strides = _geometry(self.rng, int(self.rng.integers(1, 4)))
        offset = int(self.rng.integers(0, 4))
        n = offset + _extent(sizes, strides)
        blob = (self.rng.standard_normal(max(n, 1)) * 10).astype(dtype)
        h = ctypes.c_void_p()
        rc = self.c.lib.aoti_torch_create_tensor_from_blob(
            blob.ctypes.data, len(sizes), self.c.i64s(sizes), self.c.i64s(strides), offset, code,
            0, 0, ctypes.byref(h),
        )  # fmt: skip
        self.expect(rc, True, "create_tensor_from_blob")
        storage = RefStorage(n * blob.itemsize, False, dtype, blob[:n].copy(), keepalive=blob)
        self.ref.add(h.value, RefTensor(storage, sizes, strides, offset))

    def op_reinterpret(self) -> None:
        base = self.pick()
        if base is None:
            return self.op_create()
        t = self.ref.handles[base]
        sizes, strides = _geometry(self.rng, int(self.rng.integers(0, 4)))
        item = np.dtype(t.storage.dtype).itemsize
        room = t.storage.nbytes // item - t.offset - _extent(sizes, strides)
        if self.rng.random() < 0.2:  # aim past the end on purpose
            inc = max(room, 0) + int(self.rng.integers(1, 4))
        else:
            inc = int(self.rng.integers(-t.offset, max(room, 0) + 1)) if room >= 0 else 0
        new_offset = t.offset + inc
        ok = new_offset >= 0 and (
            _extent(sizes, strides) == 0
            or (new_offset + _extent(sizes, strides)) * item <= t.storage.nbytes
        )
        rc, h = self.c.reinterpret(base, sizes, strides, inc)
        self.expect(rc, ok, f"reinterpret {sizes} {strides} +{inc}")
        if ok:
            self.ref.add(h, RefTensor(t.storage, sizes, strides, new_offset))
            self.check_contents(h)

    def op_new_handle(self) -> None:
        src = self.pick()
        if src is None:
            return self.op_create()
        h = ctypes.c_void_p()
        self.expect(
            self.c.lib.aoti_torch_new_tensor_handle(src, ctypes.byref(h)), True, "new_handle"
        )
        t = self.ref.handles[src]
        self.ref.add(h.value, RefTensor(t.storage, t.sizes, t.strides, t.offset))
        self.check_contents(h.value)

    def op_delete(self) -> None:
        r = self.rng.random()
        if r < 0.1 and self.ref.dead:
            h = self.ref.dead[int(self.rng.integers(len(self.ref.dead)))]
            return self.expect(self.c.delete(h), False, "double delete")
        if r < 0.13:
            return self.expect(self.c.delete(None), False, "delete NULL")
        h = self.pick()
        if h is None:
            return self.op_create()
        self.expect(self.c.delete(h), True, "delete")
        self.ref.remove(h)

    def op_copy(self) -> None:
        live = list(self.ref.handles)
        if len(live) < 2:
            return self.op_create()
        dst = live[int(self.rng.integers(len(live)))]
        td = self.ref.handles[dst]
        same = [h for h in live if h != dst and self.ref.handles[h].numel == td.numel
                and self.ref.handles[h].storage.dtype == td.storage.dtype]  # fmt: skip
        if same and self.rng.random() < 0.7:
            src = same[int(self.rng.integers(len(same)))]
        else:
            src = live[int(self.rng.integers(len(live)))]
        ts = self.ref.handles[src]
        if ts.storage is td.storage:
            (a0, a1), (b0, b1) = ts.span(), td.span()
            if a0 < b1 and b0 < a1:
                return  # overlapping copies have no single right answer; not issued
        ok = ts.numel == td.numel and ts.storage.dtype == td.storage.dtype
        self.expect(self.c.lib.aoti_torch_copy_(dst, src, 0), ok, "copy_")
        if ok:
            td.values()[...] = ts.values().copy().reshape(td.sizes)
            self.check_contents(dst)

    def op_write(self) -> None:
        """Write through one view's raw pointer; every alias of that memory must see it."""
        h = self.pick()
        if h is None:
            return self.op_create()
        t = self.ref.handles[h]
        values = (self.rng.standard_normal(t.sizes) * 7).astype(t.storage.dtype)
        self.c.write(h, values)
        t.values()[...] = values

    def op_invalid(self) -> None:
        out = ctypes.c_void_p()
        two = self.c.i64s((2, 2))
        choice = int(self.rng.integers(4))
        if choice == 0:
            rc = self.c.lib.aoti_torch_empty_strided(-2, two, two, 6, 0, 0, ctypes.byref(out))
        elif choice == 1:
            rc = self.c.lib.aoti_torch_empty_strided(2, two, two, 77, 0, 0, ctypes.byref(out))
        elif choice == 2:
            rc = self.c.lib.aoti_torch_new_tensor_handle(0xBAD0, ctypes.byref(out))
        else:
            h = self.pick()
            if h is None:
                return
            rc = self.c.lib.aoti_torch_new_tensor_handle(h, None)
        self.expect(rc, False, f"invalid #{choice}")

    def run(self, n_calls: int) -> None:
        ops = [self.op_create, self.op_blob, self.op_reinterpret, self.op_new_handle,
               self.op_delete, self.op_copy, self.op_write, self.op_invalid]  # fmt: skip
        weights = np.array([12, 4, 26, 10, 24, 16, 3, 5], dtype=float)
        weights /= weights.sum()
        step = 0
        while self.calls < n_calls:
            if len(self.ref.handles) > 48:  # keep the population small and churning
                self.op_delete()
            else:
                ops[int(self.rng.choice(len(ops), p=weights))]()
            self.check_counts()
            step += 1
            if step % 250 == 0:
                for h in self.ref.handles:
                    self.check_contents(h)
        for h in list(self.ref.handles):
            self.check_contents(h)
            self.expect(self.c.delete(h), True, "final delete")
            self.ref.remove(h)
        self.check_counts()


@pytest.mark.parametrize("seed", [20240])
def test_random_shim_calls_agree_with_reference(cdrv, seed):
    fuzzer = Fuzzer(cdrv, seed)
    fuzzer.run(N_CALLS)
    assert fuzzer.calls >= N_CALLS
    assert fuzzer.failures_expected > 500  # the invalid calls really were in the mix


def test_random_shim_calls_give_the_same_codes_on_both_implementations(cdrv):
    """A shorter seeded sequence on the native shims and on the Python reference: both
    agree with the reference model, and call for call on every returned code."""
    from etmetal.shims import default_context

    ctx = default_context()

    def python_calls() -> int:
        return sum(p for _, p in ctx.load_bridge().shim_counts().values())

    codes, in_python = {}, {}
    for implementation in ("native", "python"):
        previous = ctx.set_implementation(implementation)
        before = python_calls()
        try:
            fuzzer = Fuzzer(cdrv, 20250)
            fuzzer.run(N_CALLS // 5)
        finally:
            ctx.set_implementation(previous)
        codes[implementation] = fuzzer.codes
        in_python[implementation] = python_calls() - before
    assert codes["native"] == codes["python"]
    # the reference served more of them in Python (natively, the hot calls stay in C)
    assert in_python["python"] > in_python["native"], in_python
    assert sum(rc for _, rc in codes["python"]) > 50  # refusals were in the mix
