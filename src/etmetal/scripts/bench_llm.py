"""``etmetal bench llm``: its arguments, and the printing of what :mod:`etmetal.bench.llm`
measures (latency against eager and torch's AOTI runner, ``.pte`` size, peak RSS)."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from etmetal.bench import llm as lb
from etmetal.bench import timing as bm
from etmetal.bench.sections import write_section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bm.add_common_arguments(parser, repeat=30)
    parser.add_argument("--config", default="30m", help="LM size: 30m (default) or tiny")
    parser.add_argument("--write-md", metavar="PATH", help="put the LLM section in this file")
    parser.add_argument(
        "--programs",
        metavar="DIR",
        help="keep the lowered programs in DIR: a program already there is reused as it is "
        "(lowering the 30m LM takes minutes)",
    )


def collect(args: argparse.Namespace) -> dict[str, Any]:
    from etmetal.examples import llm

    torch.set_num_threads(args.threads)
    model = llm.make_decoder_lm(llm.CONFIGS[args.config])
    params = sum(p.numel() for p in model.parameters())
    print(f"LM {args.config}: {params / 1e6:.1f}M parameters, {torch.get_num_threads()} thread(s)")
    with tempfile.TemporaryDirectory(prefix="etmetal-bench-llm-") as tmp:
        directory = Path(args.programs or tmp)
        directory.mkdir(parents=True, exist_ok=True)
        paths = lb.lower_programs(model, args.config, directory)
        rows = lb.latency(model, paths["shared"], args)
        memory = lb.measure_memory(paths)
    for name, m in memory.items():
        one, both = m["one_method"], m["both_methods"]
        print(
            f"{name}: .pte {m['pte_mib']:.1f} MiB, peak RSS one method "
            f"{one['peak_mib']:.0f} MiB (+{one['above_base_mib']:.0f}), both "
            f"{both['peak_mib']:.0f} MiB (+{both['above_base_mib']:.0f}), "
            f"ratio {m['both_over_one']:.3f}"
        )
    doc = bm.emit(args, "llm", rows, memory=memory, parameters=params, prompt=lb.PROMPT)
    doc["started_utc"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.write_md:
        write_section(Path(args.write_md), "llm", lb.render(doc, args))
    return doc
