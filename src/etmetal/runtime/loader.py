"""Reading ``.pte`` and ``.ptd`` files into validated program data.

Parsing is ExecuTorch's own (``executorch.exir._serialize``, reached through
:mod:`.program_schema` so that ``executorch.exir``'s package init stays out); this module
checks what the parser cannot (header magic, segment bounds, index ranges) and turns every
parser failure into an ``InvalidProgramError`` naming the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InvalidProgramError
from .program_schema import Cord, ptd_parser, pte_parser, schema

PathOrBytes = str | os.PathLike | bytes | bytearray | memoryview


@dataclass
class ProgramData:
    program: schema.Program
    source: str
    constant_buffers: list[bytes]
    mutable_buffers: list[bytes]
    # named data from the .pte and every .ptd file: key -> bytes
    named_data: dict[str, bytes] = field(default_factory=dict)


def read_bytes(what: PathOrBytes, kind: str) -> tuple[bytes, str]:
    if isinstance(what, (bytes, bytearray, memoryview)):
        return bytes(what), f"<{kind} bytes>"
    path = Path(what)
    try:
        return path.read_bytes(), str(path)
    except OSError as exc:
        raise InvalidProgramError(f"cannot read {kind} file {str(path)!r}: {exc}") from exc


def _check_pte_header(data: bytes, source: str) -> None:
    if len(data) < 8:
        raise InvalidProgramError(f"{source}: {len(data)} bytes is too short for a .pte file")
    ident = data[4:8]
    if not (ident[:2] == b"ET" and ident[2:].isdigit()):
        raise InvalidProgramError(
            f"{source}: not an ExecuTorch program (file identifier {ident!r}, expected b'ET..')"
        )


def _check_segments(data: bytes, source: str) -> None:
    """Segments and the flatbuffer must lie inside the file (before the parser slices)."""
    header = pte_parser._get_extended_header(data)
    if header is None:
        return
    if header.program_size > len(data) or header.program_size < 8:
        raise InvalidProgramError(
            f"{source}: header says the program is {header.program_size} bytes, file has {len(data)}"
        )
    if header.segment_base_offset > len(data):
        raise InvalidProgramError(
            f"{source}: segment base offset {header.segment_base_offset} is past the end of "
            f"the file ({len(data)} bytes)"
        )


def _check_segment_table(program: schema.Program, base: int, data: bytes, source: str) -> None:
    """Every segment the flatbuffer lists lies inside the file (the parser slices silently)."""
    for i, seg in enumerate(program.segments or []):
        if seg.offset < 0 or seg.size < 0 or base + seg.offset + seg.size > len(data):
            raise InvalidProgramError(
                f"{source}: segment {i} (offset {seg.offset}, {seg.size} bytes, base {base}) "
                f"ends past the end of the file ({len(data)} bytes)"
            )


def _deserialize(data: bytes, source: str):
    """``deserialize_pte_binary``, with the segment table checked before segments are cut."""
    header = pte_parser._get_extended_header(data)
    size, base = len(data), 0
    if header is not None and header.is_valid():
        size, base = header.program_size, header.segment_base_offset
    program = pte_parser._flatbuffer_to_program(data[:size])
    if not base:
        return pte_parser.PTEFile(program=program, mutable_data=None, named_data=None)
    _check_segment_table(program, base, data, source)
    return pte_parser._restore_segments(program=program, segment_data=data[base:])


def _parse(data: bytes, source: str):
    try:
        return _deserialize(data, source)
    except InvalidProgramError:
        raise
    except RecursionError as exc:
        raise InvalidProgramError(f"{source}: program flatbuffer is malformed (too deep)") from exc
    except Exception as exc:  # the parser raises whatever the corrupt bytes provoke
        raise InvalidProgramError(
            f"{source}: cannot parse program: {type(exc).__name__}: {exc}"
        ) from exc


def _validate_layout(program: schema.Program, source: str) -> None:
    if not isinstance(program.execution_plan, list) or not program.execution_plan:
        raise InvalidProgramError(f"{source}: program has no methods")
    names = [plan.name for plan in program.execution_plan]
    if len(set(names)) != len(names):
        raise InvalidProgramError(f"{source}: duplicate method names {names}")


def load_program_data(
    what: PathOrBytes, data_files: list[PathOrBytes] | None = None
) -> ProgramData:
    data, source = read_bytes(what, "program")
    _check_pte_header(data, source)
    _check_segments(data, source)
    pte = _parse(data, source)
    program = pte.program
    _validate_layout(program, source)
    constants = [bytes(b.storage) for b in (program.constant_buffer or [])]
    mutable = [bytes(b.storage) for b in (pte.mutable_data or [])]
    named: dict[str, bytes] = {}
    if pte.named_data is not None:
        out = pte.named_data
        for key, entry in out.pte_data.items():
            if not 0 <= entry.buffer_index < len(out.buffers):
                raise InvalidProgramError(
                    f"{source}: named data {key!r} refers to buffer {entry.buffer_index} of "
                    f"{len(out.buffers)}"
                )
            named[key] = bytes(out.buffers[entry.buffer_index])
    for extra in data_files or []:
        for key, blob in load_data_file(extra).items():
            named[key] = blob
    return ProgramData(program, source, constants, mutable, named)


def _check_data_segments(data: bytes, source: str) -> None:
    """The ``.ptd``'s segments lie inside the file (the parser slices silently)."""
    header = ptd_parser.FlatTensorHeader.from_bytes(data[8:])
    flat = ptd_parser._deserialize_to_flat_tensor(
        data[: header.flatbuffer_offset + header.flatbuffer_size]
    )
    for i, seg in enumerate(flat.segments):
        end = header.segment_base_offset + seg.offset + seg.size
        if seg.offset < 0 or seg.size < 0 or end > len(data):
            raise InvalidProgramError(
                f"{source}: data segment {i} (offset {seg.offset}, {seg.size} bytes, base "
                f"{header.segment_base_offset}) ends past the end of the file ({len(data)} bytes)"
            )


def load_data_file(what: PathOrBytes) -> dict[str, bytes]:
    """Named data of a ``.ptd`` (FlatTensor) file: key -> bytes."""
    data, source = read_bytes(what, "data")
    try:
        payload = ptd_parser.FlatTensorSerializer().deserialize(Cord(data))
    except Exception as exc:
        raise InvalidProgramError(
            f"{source}: cannot parse data file: {type(exc).__name__}: {exc}"
        ) from exc
    _check_data_segments(data, source)
    named: dict[str, bytes] = {}
    for key, entry in payload.named_data.items():
        if not 0 <= entry.buffer_index < len(payload.buffers):
            raise InvalidProgramError(
                f"{source}: named data {key!r} refers to segment {entry.buffer_index} of "
                f"{len(payload.buffers)}"
            )
        blob = bytes(payload.buffers[entry.buffer_index])
        named[key] = blob
    return named
