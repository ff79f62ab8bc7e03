"""Crash isolation: a method's delegates run in a worker process over shared memory.

``load_program(..., isolate=True)`` gives each loaded method that has delegates one
worker process. The method's planned buffers (arenas) are allocated in ``memfd``
shared memory and mapped by the worker too, so a delegate reads its inputs and writes
its outputs in place, with no copies; the few delegate arguments outside the arenas
(constants, unplanned tensors) go through a shared scratch buffer.

Policy when the worker dies (a faulting ``.so``, ``abort``, the OOM killer): the call
that was running raises ``DelegateError`` naming the signal; the next execute respawns
the worker and re-initializes the method's delegates, so the host keeps serving.
Planned memory (including mutable buffers) lives in the host and survives the respawn.
"""

from __future__ import annotations

import contextlib
import inspect
import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import weakref
from typing import Any

import torch

from . import errors as _errors
from .backend_interface import BackendExecutor, BackendInitContext
from .errors import DelegateError, EtmetalRuntimeError

TIMEOUT_ENV = "ETMETAL_ISOLATE_TIMEOUT"  # seconds a delegate execute may take in the worker
_HEADER = struct.Struct("<Q")


def send_msg(sock: socket.socket, obj: Any, fds: tuple[int, ...] = ()) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if fds:  # ancillary data rides on the header bytes
        socket.send_fds(sock, [_HEADER.pack(len(data))], list(fds))
    else:
        sock.sendall(_HEADER.pack(len(data)))
    sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionResetError("peer closed the connection")
        got += k
    return bytes(buf)


def recv_msg(sock: socket.socket, with_fds: bool = False) -> tuple[Any, list[int]]:
    fds: list[int] = []
    if with_fds:
        head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 4)
        if not head:
            raise ConnectionResetError("peer closed the connection")
        if len(head) < _HEADER.size:
            head += _recv_exact(sock, _HEADER.size - len(head))
    else:
        head = _recv_exact(sock, _HEADER.size)
    (n,) = _HEADER.unpack(head)
    return pickle.loads(_recv_exact(sock, n)), fds


def class_ref(cls: type) -> tuple[str, str, str | None]:
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        path = None
    return cls.__module__, cls.__qualname__, path


def rebuild_error(name: str, message: str) -> EtmetalRuntimeError:
    """The worker's exception as the same etmetal class when it has a plain constructor."""
    cls = getattr(_errors, name, None)
    plain = (
        isinstance(cls, type)
        and issubclass(cls, EtmetalRuntimeError)
        and cls.__init__ is EtmetalRuntimeError.__init__
    )
    return cls(message) if plain else DelegateError(message)


class SharedArena:
    """A memfd-backed byte buffer the host and the worker both map."""

    def __init__(self, nbytes: int, name: str = "etmetal-arena"):
        self.nbytes = nbytes
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, max(nbytes, 1))
        self.map = mmap.mmap(self.fd, max(nbytes, 1))
        # frombuffer keeps the mapping alive as long as a tensor views it
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)[:nbytes]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class IsolationHost:
    """The host side of one method's worker: spawns, talks to and respawns it."""

    def __init__(self, method_name: str, named_data: dict[str, bytes]):
        self.method_name = method_name
        self._named = named_data
        self.arenas: list[SharedArena] = []
        self._arena_ptrs: dict[int, int] = {}  # storage data_ptr -> arena id
        self._scratch: SharedArena | None = None
        self._inits: list[tuple] = []  # (class ref, context fields, processed, specs)
        self._checks: dict[int, list] = {}
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._closed = False
        self.spawns = 0
        timeout = os.environ.get(TIMEOUT_ENV)
        self._timeout = float(timeout) if timeout else None
        self._finalizer = weakref.finalize(self, IsolationHost._shutdown, self._state())

    # -- memory ---------------------------------------------------------------------
    def allocate(self, nbytes: int) -> torch.Tensor:
        """A planned buffer in shared memory (the runtime's arena allocator)."""
        arena = SharedArena(nbytes)
        self.arenas.append(arena)
        self._arena_ptrs[arena.tensor.untyped_storage().data_ptr()] = len(self.arenas) - 1
        return arena.tensor

    def _describe(self, args: list, scratch_plan: list) -> list:
        descs = []
        offset = 0
        for value in args:
            if not isinstance(value, torch.Tensor):
                descs.append(("value", value))
                continue
            meta = (tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype)
            arena = self._arena_ptrs.get(value.untyped_storage().data_ptr())
            if arena is not None:
                descs.append(("arena", arena, *meta))
                continue
            # outside the arenas: through the scratch buffer, packed
            nbytes = value.numel() * value.element_size()
            align = 64
            offset = (offset + align - 1) // align * align
            scratch_plan.append((value, offset))
            size = tuple(value.shape)
            strides = tuple(torch.empty(size, device="meta").stride())
            descs.append(
                ("scratch", -1, size, strides, offset // value.element_size(), value.dtype)
            )
            offset += nbytes
        if scratch_plan and (self._scratch is None or self._scratch.nbytes < offset):
            old = self._scratch
            self._scratch = SharedArena(max(offset, 4096), "etmetal-scratch")
            if old is not None:
                old.close()
            if self._sock is not None:
                send_msg(self._sock, ("scratch",), (self._scratch.fd,))
        return descs

    def _scratch_view(self, value: torch.Tensor, offset: int) -> torch.Tensor:
        out = torch.empty(0, dtype=value.dtype)
        out.set_(
            self._scratch.tensor.untyped_storage(),
            offset // value.element_size(),
            value.shape,
            torch.empty(value.shape, device="meta").stride(),
        )
        return out

    # -- process --------------------------------------------------------------------
    def _state(self) -> dict:
        self._st = {"proc": None, "sock": None, "arenas": self.arenas}
        return self._st

    @staticmethod
    def _shutdown(st: dict) -> None:
        sock, proc = st.get("sock"), st.get("proc")
        if sock is not None:
            with contextlib.suppress(OSError):
                send_msg(sock, ("exit",))
            sock.close()
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for arena in st.get("arenas", []):
            arena.close()
        st["sock"] = st["proc"] = None

    def _spawn(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "etmetal.runtime.isolation_worker", str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        finally:
            child.close()
        self._proc, self._sock = proc, parent
        self._st["proc"], self._st["sock"] = proc, parent
        self.spawns += 1
        send_msg(parent, ("hello", list(sys.path), self._named, torch.get_num_threads()))
        for i, arena in enumerate(self.arenas):
            send_msg(parent, ("arena", i), (arena.fd,))
        if self._scratch is not None:
            send_msg(parent, ("scratch",), (self._scratch.fd,))
        for index, init in enumerate(self._inits):
            self._call(("init", index, *init), "init")
            if index in self._checks:
                self._call(("check_call", index, self._checks[index]), "check_call")

    def _died(self, what: str) -> DelegateError:
        proc = self._proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if self._sock is not None:
            self._sock.close()
        self._proc = self._sock = None
        self._st["proc"] = self._st["sock"] = None
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        pid = proc.pid if proc is not None else "?"
        # the dead worker could not remove its private .so directories
        from .tempfiles import sweep_stale

        sweep_stale()
        return DelegateError(
            f"method {self.method_name!r}: delegate worker process (pid {pid}) {how} during "
            f"{what}; the host is unaffected and the next execute starts a new worker"
        )

    def _call(self, msg: tuple, what: str) -> Any:
        sock = self._sock
        try:
            # only executes are bounded: a worker's start (imports, delegate init) is slow
            sock.settimeout(self._timeout if what == "execute" else None)
            send_msg(sock, msg)
            reply, _ = recv_msg(sock)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            timed_out = isinstance(exc, TimeoutError)
            if timed_out and self._proc is not None:
                self._proc.kill()
            error = self._died(what)
            if timed_out:
                error = DelegateError(
                    f"method {self.method_name!r}: the delegate did not finish {what} within "
                    f"{self._timeout} s (${TIMEOUT_ENV}); its worker process was killed and the "
                    "next execute starts a new one"
                )
            raise error from exc
        except BaseException:
            # interrupted mid-request (e.g. KeyboardInterrupt): the stream is out of step
            if self._proc is not None:
                self._proc.kill()
            self._died(what)
            raise
        if reply[0] == "err":
            raise rebuild_error(reply[1], reply[2])
        return reply[1]

    def request(self, msg: tuple, what: str) -> Any:
        with self._lock:
            if self._closed:
                raise DelegateError(f"method {self.method_name!r}: the delegate worker is closed")
            if self._sock is None:
                self._spawn()
            return self._call(msg, what)

    # -- delegate calls ---------------------------------------------------------------
    def init(
        self, cls: type, context: BackendInitContext, processed: bytes, specs
    ) -> IsolatedExecutor:
        fields = (
            context.method_name,
            context.trust_native_code,
            tuple(context.trusted_blob_hashes),
            {k: v for k, v in context.options.items() if k != "isolation_host"},
        )
        init = (class_ref(cls), fields, bytes(processed), list(specs))
        with self._lock:
            index = len(self._inits)
            self._inits.append(init)
            try:
                self.request(("init", index, *init), "init")
            except BaseException:
                self._inits.pop()
                raise
        return IsolatedExecutor(self, index)

    def execute(self, index: int, args: list) -> None:
        with self._lock:
            scratch: list = []
            descs = self._describe(args, scratch)
            for value, offset in scratch:
                self._scratch_view(value, offset).copy_(value)
            metas = self.request(("execute", index, descs), "execute")
            for value, offset in scratch:
                value.copy_(self._scratch_view(value, offset))
            for value, meta in zip(args, metas):
                if meta is not None and isinstance(value, torch.Tensor):
                    sizes, strides = meta
                    if tuple(value.shape) != sizes or tuple(value.stride()) != strides:
                        value.as_strided_(sizes, strides, value.storage_offset())

    def check_call(self, index: int, args: list) -> None:
        with self._lock:
            descs = self._describe([a for a in args], [])
            self._checks[index] = descs
            self.request(("check_call", index, descs), "check_call")

    def destroy(self, index: int) -> None:
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(EtmetalRuntimeError):
                    self._call(("destroy", index), "destroy")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._finalizer()
            if self._scratch is not None:
                self._scratch.close()

    def worker_stats(self) -> tuple[tuple | None, int]:
        """(the worker's shim ``memory_stats()`` fields or None, its RSS in bytes)."""
        return self.request(("stats",), "stats")

    @property
    def worker_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


class IsolatedExecutor(BackendExecutor):
    """Stands in the host for a delegate that lives in the worker process."""

    def __init__(self, host: IsolationHost, index: int):
        self._host = host
        self._index = index

    @classmethod
    def init(cls, context, processed, compile_specs):  # pragma: no cover - built by the host
        raise TypeError("IsolatedExecutor is created by IsolationHost.init")

    def check_call(self, args: list) -> None:
        self._host.check_call(self._index, args)

    def execute(self, args: list) -> None:
        self._host.execute(self._index, args)

    def destroy(self) -> None:
        self._host.destroy(self._index)
