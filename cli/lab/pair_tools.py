"""The lab's stand-ins for the pair tests' tools: nccl-tests' `all_reduce_perf` and
perftest's `ib_write_bw` across two lab nodes (`medic sweep run --pairs`).

Each node's links are a file the lab injects like its other faults,
<lab>/nodes/<n>/pair_link.json: {"allreduce_busbw_gbps": 480.0, "ib_bw_gbps": 392.0} (these
healthy figures when the file is absent). A pair measures the lower of its two nodes'
figures, as a slow HCA or link slows every transfer it takes part in. The pair's nodes come
from MEDIC_PAIR_NODES (set by `medic sweep pair-probe`), the task's own from SLURMD_NODENAME
and its rank from SLURM_PROCID; the output has the layout of the real tools', which the
probe parses with the deep tier's own parsers. `install` writes the wrappers into
<lab>/tools (the `search_dirs` of `[sweep.pairs]`); production never runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cli.lab.layout import LabLayout
from cli.lab.processes import write_script

HEALTHY = {"allreduce_busbw_gbps": 480.0, "ib_bw_gbps": 392.0}
LINK_FILE = "pair_link.json"
SIZES = (8, 1 << 20, 1 << 30)


def install(layout: LabLayout, python: Path) -> list[Path]:
    """Wrappers <lab>/tools/all_reduce_perf and ib_write_bw; returns their paths."""
    layout.tools_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for tool in ("all_reduce_perf", "ib_write_bw"):
        path = layout.tools_dir / tool
        write_script(
            path,
            f'#!/bin/sh\n# Written for the lab\'s pair tests.\nexec "{python}" -m '
            f'cli.lab.pair_tools {tool} --lab-root "{layout.root}" "$@"\n',
        )
        written.append(path)
    return written


def set_link(layout: LabLayout, node: str, **figures: float) -> None:
    """Inject a node's link figures (allreduce_busbw_gbps, ib_bw_gbps); {} heals it."""
    unknown = set(figures) - set(HEALTHY)
    if unknown:
        raise ValueError(f"unknown link figure(s) {sorted(unknown)}: use {sorted(HEALTHY)}")
    path = layout.node(node).dir / LINK_FILE
    if figures:
        path.write_text(json.dumps(figures))
    else:
        path.unlink(missing_ok=True)


def link(layout: LabLayout, node: str, figure: str) -> float:
    try:
        doc = json.loads((layout.node(node).dir / LINK_FILE).read_text())
    except (OSError, ValueError):
        doc = {}
    value = doc.get(figure) if isinstance(doc, dict) else None
    return float(value) if isinstance(value, int | float) else HEALTHY[figure]


def _pair(layout: LabLayout, figure: str, nodes: list[str]) -> float:
    return min(link(layout, n, figure) for n in nodes)


def all_reduce_perf(layout: LabLayout, nodes: list[str]) -> int:
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return 0  # nccl-tests: rank 0 prints the table
    busbw = _pair(layout, "allreduce_busbw_gbps", nodes)
    print("# Collective test starting: all_reduce_perf (medic lab stand-in)")
    print("#" + " " * 62 + "out-of-place" + " " * 23 + "in-place")
    print(
        "#       size         count      type   redop    root     time   algbw   busbw"
        " #wrong     time   algbw   busbw #wrong"
    )
    for size in SIZES:
        bw = busbw * size / SIZES[-1]
        algbw = bw / 2  # 2 ranks: busbw = algbw * 2 (n-1)/n
        time_us = size / max(algbw, 1e-9) / 1e3
        row = f"{size:>12} {size // 4:>13} {'float':>9} {'sum':>7} {-1:>7} {time_us:>8.1f}"
        row += f" {algbw:>7.2f} {bw:>7.2f} {0:>6} {time_us:>8.1f} {algbw:>7.2f} {bw:>7.2f} {0:>6}"
        print(row)
    print("# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {busbw / len(SIZES):.3f}")
    return 0


def ib_write_bw(layout: LabLayout, args: list[str], me: str) -> int:
    if not args or args[-1].startswith("-"):
        return 0  # the server (no peer named last): its client prints the figure
    bw = min(link(layout, me, "ib_bw_gbps"), link(layout, args[-1], "ib_bw_gbps"))
    print(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
    print(f" 65536      5000             0.00               {bw:.2f}              0.7")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lab-pair-tool")
    parser.add_argument("tool", choices=["all_reduce_perf", "ib_write_bw"])
    parser.add_argument("--lab-root", type=Path, required=True)
    known, rest = parser.parse_known_args(argv)
    layout = LabLayout(known.lab_root)
    me = os.environ.get("SLURMD_NODENAME", "")
    nodes = [n for n in os.environ.get("MEDIC_PAIR_NODES", me).split(",") if n]
    if known.tool == "all_reduce_perf":
        return all_reduce_perf(layout, nodes or [me])
    return ib_write_bw(layout, rest, me)


if __name__ == "__main__":
    sys.exit(main())
