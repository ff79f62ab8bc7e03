"""The worker side of crash isolation (``python -m etmetal.runtime.isolation_worker FD``).

Serves one method's delegates over the socket ``FD``: maps the host's shared arenas,
initializes each delegate, and executes it on tensors viewing the shared memory.
Any Python exception goes back to the host as an error reply; a native fault ends
this process, which the host reports and recovers from.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import mmap
import os
import socket
import sys


def _load_class(ref):
    module_name, qualname, path = ref
    try:
        obj = importlib.import_module(module_name)
    except ImportError:
        if not path:
            raise
        spec = importlib.util.spec_from_file_location(f"_etmetal_isolated_{abs(hash(path))}", path)
        obj = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = obj
        spec.loader.exec_module(obj)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the host dies, even mid-execute.

    Elsewhere there is no prctl; the host's shutdown and the pipe's EOF still end the worker.
    """
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def main(fd: int) -> int:
    _die_with_parent()
    sock = socket.socket(fileno=fd)
    # the host's sys.path, so the worker imports the same etmetal and delegate modules
    from etmetal.runtime.isolation import recv_msg, send_msg

    (hello, paths, named, threads), _ = recv_msg(sock)
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    import torch

    from etmetal.runtime.backend_interface import BackendInitContext

    torch.set_num_threads(max(int(threads), 1))
    arenas: dict[int, torch.Tensor] = {}
    scratch = [None]
    executors: dict[int, object] = {}

    def named_data(key):
        blob = named.get(key)
        if blob is None:
            raise KeyError(key)
        return memoryview(blob)

    def mapped(fd_: int) -> torch.Tensor:
        size = os.fstat(fd_).st_size
        m = mmap.mmap(fd_, size)
        os.close(fd_)
        return torch.frombuffer(m, dtype=torch.uint8)

    def tensor(desc):
        kind = desc[0]
        if kind == "value":
            return desc[1]
        _, arena, sizes, strides, offset, dtype = desc
        base = scratch[0] if kind == "scratch" else arenas[arena]
        t = torch.empty(0, dtype=dtype)
        t.set_(base.untyped_storage(), offset, sizes, strides)
        return t

    while True:
        try:
            msg, fds = recv_msg(sock, with_fds=True)
        except ConnectionResetError:
            return 0  # host gone
        op = msg[0]
        if op == "exit":
            for ex in executors.values():
                with contextlib.suppress(Exception):
                    ex.destroy()
            return 0
        if op == "arena":
            arenas[msg[1]] = mapped(fds[0])
            continue
        if op == "scratch":
            scratch[0] = mapped(fds[0])
            continue
        try:
            if op == "init":
                _, index, ref, fields, processed, specs = msg
                method_name, trust, hashes, options = fields
                context = BackendInitContext(
                    method_name=method_name,
                    get_named_data=named_data,
                    trust_native_code=trust,
                    trusted_blob_hashes=frozenset(hashes),
                    options=options,
                )
                executors[index] = _load_class(ref).init(context, processed, specs)
                reply = ("ok", None)
            elif op == "check_call":
                _, index, descs = msg
                executors[index].check_call([tensor(d) for d in descs])
                reply = ("ok", None)
            elif op == "execute":
                _, index, descs = msg
                args = [tensor(d) for d in descs]
                executors[index].execute(args)
                metas = [
                    (tuple(a.shape), tuple(a.stride())) if isinstance(a, torch.Tensor) else None
                    for a in args
                ]
                reply = ("ok", metas)
            elif op == "stats":  # for leak checks: the worker's shim state and RSS
                stats = None
                if "etmetal.shims" in sys.modules:
                    stats = tuple(sys.modules["etmetal.shims"].memory_stats().__dict__.values())
                with open("/proc/self/statm") as f:
                    rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                reply = ("ok", (stats, rss))
            elif op == "destroy":
                ex = executors.pop(msg[1], None)
                if ex is not None:
                    ex.destroy()
                reply = ("ok", None)
            else:
                reply = ("err", "DelegateError", f"isolation worker: unknown request {op!r}")
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the host
            from etmetal.runtime.errors import EtmetalRuntimeError

            if isinstance(exc, EtmetalRuntimeError):
                reply = ("err", type(exc).__name__, str(exc))
            else:
                reply = ("err", "DelegateError", f"{type(exc).__name__}: {exc}")
        send_msg(sock, reply)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
