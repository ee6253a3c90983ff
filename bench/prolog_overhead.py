"""What Medic's Prolog and Epilog add to a job start: `srun -N1 true` timed end to end as a
user runs it, on a one-node lab with medic-healthd answering the prolog from fresh results.

Configurations: no hooks, `Prolog=/bin/true` (what any prolog costs in Slurm itself: the
floor), Medic's Prolog only, Medic's Prolog and Epilog, each with and without
PrologFlags=Alloc (slurm.conf rewritten and `scontrol reconfigure` between them). They are
interleaved: every round runs a block of --block calls of each, in a new random order, so a
drift of the machine's speed falls on all of them alike. What a hook set adds is computed
per round, as the difference of its block's median and the same round's no-hooks block's
median under the same flags (blocks run seconds apart: their k-th calls are no pair); the
rounds' differences carry 95 % bootstrap intervals (p90 from 20 rounds). The lab's Prolog is
a /bin/sh wrapper exporting the lab's paths before it execs medic-hook, which a production
node does not run: `sh_true_prolog` (that wrapper exec'ing /bin/true) measures it, and
`prolog_over_wrapped_true` is Medic's Prolog less it. The load average is recorded at every
round.

Prints one JSON object. Run: .venv/bin/python -m bench.prolog_overhead --calls 1000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.stats import described
from cli.lab.cluster import Lab
from cli.lab.slurm_conf import LabSpec

HOOK_LINES = ("Prolog=", "Epilog=", "PrologFlags=")
# The lab's own hook lines kept (by prefix), or a line of their own.
HOOK_SETS: dict[str, tuple[str, ...]] = {
    "no_hooks": (),
    "true_prolog": ("=Prolog=/bin/true",),
    # The lab's hook wrapper (a /bin/sh script exporting the lab's paths), exec'ing
    # /bin/true: its cost is the lab's alone (production names medic-hook directly).
    "sh_true_prolog": ("=Prolog={wrapped_true}",),
    "prolog": ("Prolog=",),
    "prolog_epilog": ("Prolog=", "Epilog="),
}
FLAGS = ("alloc", "no_alloc")


def wrapped_true(lab: Lab) -> Path:
    """The lab's Prolog wrapper with its last line (exec the compiled front) made
    `exec /bin/true`: what the wrapper alone costs."""
    prolog = lab.layout.bin_dir / "medic-prolog"
    lines = prolog.read_text().splitlines()
    assert lines[-1].startswith("exec "), lines[-1]
    path = lab.layout.bin_dir / "bench-wrapped-true"
    path.write_text("\n".join([*lines[:-1], "exec /bin/true"]) + "\n")
    path.chmod(0o755)
    return path


def reconfigure(lab: Lab, original: str, hooks: tuple[str, ...], alloc: bool) -> None:
    """slurm.conf as the lab writes it, but with only the hook lines in `hooks` (of Prolog=,
    Epilog=) and PrologFlags=Alloc on or off."""
    lines = [ln for ln in original.splitlines() if not ln.startswith(HOOK_LINES)]
    kept = tuple(h for h in hooks if not h.startswith("="))
    lines += [ln for ln in original.splitlines() if kept and ln.startswith(kept)]
    own = [h[1:] for h in hooks if h.startswith("=")]
    lines += [h.format(wrapped_true=wrapped_true(lab)) if "{" in h else h for h in own]
    if alloc:
        lines.append("PrologFlags=Alloc")
    lab.layout.slurm_conf.write_text("\n".join(lines) + "\n")
    lab.slurm(["scontrol", "reconfigure"])


def time_srun(lab: Lab, calls: int) -> list[float]:
    lab.slurm(["srun", "-N1", "true"], timeout=60)  # the first after a reconfigure: not timed
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        lab.slurm(["srun", "-N1", "true"], timeout=60)
        times.append((time.perf_counter() - started) * 1000)
    return times


def overhead(calls: int, block: int, seed: int, sets: list[str]) -> dict[str, object]:
    rng = random.Random(seed)
    configs = [(flags, name) for flags in FLAGS for name in ["no_hooks", *sets]]
    times: dict[str, list[float]] = {f"{f}.{n}": [] for f, n in configs}
    added: dict[str, list[float]] = {f"{f}.{n}": [] for f, n in configs if n != "no_hooks"}
    alloc_itself: list[float] = []
    over_true: dict[str, list[float]] = {flags: [] for flags in FLAGS}
    over_wrapper: dict[str, list[float]] = {flags: [] for flags in FLAGS}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=1))
        try:
            lab.start_healthd("n1")
            original = lab.layout.slurm_conf.read_text()
            for _ in range((calls + block - 1) // block):
                order = configs[:]
                rng.shuffle(order)
                got: dict[str, list[float]] = {}
                for flags, name in order:
                    reconfigure(lab, original, HOOK_SETS[name], flags == "alloc")
                    got[f"{flags}.{name}"] = time_srun(lab, block)
                loads.append(os.getloadavg()[0])
                # Blocks run seconds apart: the k-th calls of two blocks are no pair. What a
                # hook set adds is a difference of the two blocks' medians, one per round.
                mid = {key: statistics.median(values) for key, values in got.items()}
                for key, values in got.items():
                    times[key] += values
                    flags, name = key.split(".")
                    if name != "no_hooks":
                        added[key].append(mid[key] - mid[f"{flags}.no_hooks"])
                        floor = mid.get(f"{flags}.true_prolog")
                        if name == "prolog" and floor is not None:  # Medic's over any prolog
                            over_true[flags].append(mid[key] - floor)
                        wrapper = mid.get(f"{flags}.sh_true_prolog")
                        if name == "prolog" and wrapper is not None:  # ...less the lab's sh
                            over_wrapper[flags].append(mid[key] - wrapper)
                alloc_itself.append(mid["alloc.no_hooks"] - mid["no_alloc.no_hooks"])
            lab.layout.slurm_conf.write_text(original)
            lab.slurm(["scontrol", "reconfigure"])
        finally:
            lab.down()
    return {
        "benchmark": "prolog_overhead",
        "method": "interleaved blocks in a random order each round; added = difference of"
        " block medians per round; 95 % bootstrap intervals",
        "rounds": len(alloc_itself),
        "calls": len(times["alloc.no_hooks"]),
        "block": block,
        "runs": {key: described(values, rng) for key, values in times.items()},
        "added": {key: described(values, rng) for key, values in added.items()},
        "prolog_over_true_prolog": {
            flags: described(values, rng) for flags, values in over_true.items() if values
        },
        # Medic's Prolog less the lab's /bin/sh wrapper: what a production node pays.
        "prolog_over_wrapped_true": {
            flags: described(values, rng) for flags, values in over_wrapper.items() if values
        },
        "alloc_flag_itself": described(alloc_itself, rng),
        "load_avg_1m": [round(min(loads), 2), round(max(loads), 2)],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000, help="per configuration")
    parser.add_argument("--block", type=int, default=50, help="calls per configuration a round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sets",
        default="true_prolog,sh_true_prolog,prolog,prolog_epilog",
        help=f"hook sets beside no_hooks, of {', '.join(list(HOOK_SETS)[1:])}",
    )
    args = parser.parse_args()
    sets = [s for s in args.sets.split(",") if s]
    unknown = [s for s in sets if s not in HOOK_SETS or s == "no_hooks"]
    if unknown:
        parser.error(f"--sets: unknown {', '.join(unknown)}")
    print(json.dumps(overhead(args.calls, args.block, args.seed, sets)))


if __name__ == "__main__":
    main()
