"""What a MetalPartitioner run delegated and what it kept out, with the reasons."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KeptOut:
    """One operator node left to the portable runtime."""

    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class DelegatedPartition:
    tag: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    fallbacks: tuple[str, ...] = ()


@dataclass
class PartitionReport:
    """One program (method) as the partitioner saw it for one target."""

    target: str
    method: str | None = None
    partitions: list[DelegatedPartition] = field(default_factory=list)
    kept_out: list[KeptOut] = field(default_factory=list)

    @property
    def delegated_ops(self) -> Counter[str]:
        return Counter(op for p in self.partitions for op in p.ops)

    @property
    def kept_out_ops(self) -> Counter[str]:
        return Counter(k.op for k in self.kept_out)

    def reasons(self) -> dict[str, str]:
        """op -> why it stayed out (first reason seen for that op)."""
        out: dict[str, str] = {}
        for k in self.kept_out:
            out.setdefault(k.op, k.reason)
        return out

    def text(self) -> str:
        name = f" {self.method}" if self.method else ""
        lines = [
            f"Metal partition report{name} (target {self.target}): "
            f"{len(self.partitions)} delegate partition(s), "
            f"{sum(len(p.ops) for p in self.partitions)} op node(s) delegated, "
            f"{len(self.kept_out)} kept out"
        ]
        for p in self.partitions:
            ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in Counter(p.ops).items())
            extra = f"; fallbacks {', '.join(sorted(set(p.fallbacks)))}" if p.fallbacks else ""
            lines.append(f"  {p.tag}: {len(p.ops)} op node(s): {ops}{extra}")
        for op, reason in self.reasons().items():
            n = self.kept_out_ops[op]
            lines.append(f"  kept out: {op} ({n} node{'s' if n > 1 else ''}): {reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()
