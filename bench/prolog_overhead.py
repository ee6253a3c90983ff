"""What Medic's Prolog and Epilog add to a job: `srun -N1 true` timed end to end, --calls
times each with Prolog and Epilog, with the Prolog only, and with neither, each with and
without PrologFlags=Alloc (slurm.conf rewritten and `scontrol reconfigure` between them), on
the same one-node lab with medic-healthd answering the prolog from fresh results.

Prints one JSON object. Run: .venv/bin/python -m bench.prolog_overhead --calls 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from cli.lab.cluster import Lab
from cli.lab.slurm_conf import LabSpec


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_srun(lab: Lab, calls: int) -> list[float]:
    lab.slurm(["srun", "-N1", "true"], timeout=60)  # warm-up
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        lab.slurm(["srun", "-N1", "true"], timeout=60)
        times.append((time.perf_counter() - started) * 1000)
    return times


def summary(times: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p90_ms": round(percentile(times, 0.9), 1),
        "p99_ms": round(percentile(times, 0.99), 1),
    }


HOOK_LINES = ("Prolog=", "Epilog=", "PrologFlags=")


def reconfigure(lab: Lab, original: str, hooks: tuple[str, ...], alloc: bool) -> None:
    """slurm.conf as the lab writes it, but with only the hook lines in `hooks` (of Prolog=,
    Epilog=) and PrologFlags=Alloc on or off."""
    lines = [ln for ln in original.splitlines() if not ln.startswith(HOOK_LINES)]
    lines += [ln for ln in original.splitlines() if ln.startswith(hooks)]
    if alloc:
        lines.append("PrologFlags=Alloc")
    lab.layout.slurm_conf.write_text("\n".join(lines) + "\n")
    lab.slurm(["scontrol", "reconfigure"])


def added(with_hooks: dict[str, float], bare: dict[str, float]) -> dict[str, float]:
    return {k.replace("_ms", "_added_ms"): round(with_hooks[k] - bare[k], 1) for k in bare}


def overhead(calls: int) -> dict[str, object]:
    """Each hook set against no hooks under the same PrologFlags: PrologFlags=Alloc has a
    price of its own (srun polls the controller until the prolog is done: the first poll
    comes 0.1 s later, whatever the prolog), which any prolog run at allocation pays."""
    runs: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=1))
        try:
            lab.start_healthd("n1")
            original = lab.layout.slurm_conf.read_text()
            for alloc in (True, False):
                flags = "alloc" if alloc else "no_alloc"
                for name, hooks in (
                    ("no_hooks", ()),
                    ("prolog", ("Prolog=",)),
                    ("prolog_epilog", ("Prolog=", "Epilog=")),
                ):
                    reconfigure(lab, original, hooks, alloc)
                    runs[f"{flags}.{name}"] = summary(time_srun(lab, calls))
            lab.layout.slurm_conf.write_text(original)
        finally:
            lab.down()
    result: dict[str, object] = {"benchmark": "prolog_overhead", "calls": calls, "runs": runs}
    for flags in ("alloc", "no_alloc"):
        bare = runs[f"{flags}.no_hooks"]
        result[f"{flags}.prolog"] = added(runs[f"{flags}.prolog"], bare)
        result[f"{flags}.prolog_epilog"] = added(runs[f"{flags}.prolog_epilog"], bare)
    result["alloc_flag_itself"] = added(runs["alloc.no_hooks"], runs["no_alloc.no_hooks"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(overhead(args.calls)))


if __name__ == "__main__":
    main()
