"""Pair tests, Slurm's side: one 2-node job per pair (`srun --nodes=2 --ntasks-per-node=1
... medic sweep pair-probe`) inside the pair sweep's reservation, and what its output says.

Each task of the job prints one JSON line `{"pair_probe": {"node", "measured", "errors"}}`
(cli/sweep.py's `pair-probe`); the figures of both are merged and judged against the
floors of the pair's node classes (the lower of the two nodes' floors).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from medic_core.config import CONFIG_ENV, MedicConfig
from medic_core.pair_settings import FIGURE, PROBE_KEY, PairSettings
from medic_core.settings import SweepSettings
from medic_core.slurm import NodeInfo, SlurmError
from remediation.sweep.pairs import Pair, PairResult, judge_pair
from remediation.sweep.policy import FAIL, INCONCLUSIVE, gres_request
from remediation.sweep.slurm import SweepSlurm

PAIR_RESERVATION = "medic-sweep-pairs"


class PairSlurm(SweepSlurm):
    def cancel_job_named(self, name: str) -> None:
        self._run("scancel", f"--name={name}")


@dataclass(frozen=True)
class PairProbeLine:
    node: str
    measured: Mapping[str, float]
    errors: tuple[str, ...]


def probe_lines(stdout: str) -> list[PairProbeLine]:
    """Every task's report in srun's output; other lines (and hostile ones) are skipped."""
    found = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            body = doc.get(PROBE_KEY) if isinstance(doc, dict) else None
            if not isinstance(body, dict):
                continue
            measured = body.get("measured")
            figures = {
                str(k): float(v)
                for k, v in (measured.items() if isinstance(measured, dict) else ())
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            }
            errors = body.get("errors")
            found.append(
                PairProbeLine(
                    str(body.get("node", ""))[:255],
                    figures,
                    tuple(str(e)[:500] for e in errors) if isinstance(errors, list) else (),
                )
            )
    return found


def pair_floors(
    settings: PairSettings, classes: Mapping[str, str], a: str, b: str
) -> dict[str, float]:
    """The floors a pair is held to: per figure, the lower of its two nodes' classes'."""
    fa, fb = settings.floors(classes.get(a)), settings.floors(classes.get(b))
    return {k: min(fa[k], fb[k]) for k in fa}


def judge_output(
    pair: Pair,
    round_no: int,
    stdout: str,
    timed_out: bool,
    why: str,
    settings: PairSettings,
    floors: Mapping[str, float],
) -> PairResult:
    a, b = pair
    if timed_out:
        return PairResult(
            a, b, round_no, FAIL, {}, f"the pair job did not finish within {settings.timeout:g}s"
        )
    lines = probe_lines(stdout)
    measured: dict[str, float] = {}
    errors: list[str] = []
    for line in lines:
        for k, v in line.measured.items():
            measured[k] = min(v, measured.get(k, v))
        errors += [f"{line.node}: {e}" for e in line.errors]
    wanted = [FIGURE[t] for t in settings.tests]
    if not lines:
        return PairResult(a, b, round_no, INCONCLUSIVE, {}, f"no report from the pair: {why}")
    judged = judge_pair(measured, floors, wanted)
    text = judged.why + (f" ({'; '.join(errors)})" if errors else "")
    return PairResult(a, b, round_no, judged.outcome, measured, text[:2000])


def srun_args(
    reservation: str,
    pair: Pair,
    round_no: int,
    sweep: SweepSettings,
    pairs: PairSettings,
    info: NodeInfo | None,
) -> list[str]:
    args = [
        f"--reservation={reservation}",
        f"--nodelist={','.join(pair)}",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--exclusive",
        f"--job-name={job_name(reservation, pair, round_no)}",
        f"--time={math.ceil(pairs.timeout / 60) + 1}",
        f"--immediate={math.ceil(sweep.immediate)}",
        "--quiet",
    ]
    gres = gres_request(info.gres) if info else None
    if gres:
        args.append(f"--gres={gres}")
    tests = [arg for t in pairs.tests for arg in ("--test", t)]
    return [*args, *sweep.srun_args, *pairs.probe, "--nodes", ",".join(pair), *tests]


def job_name(reservation: str, pair: Pair, round_no: int) -> str:
    return f"{reservation}-r{round_no}-{pair[0]}-{pair[1]}"[:200]


def job_env(slurm: SweepSlurm, config: MedicConfig) -> dict[str, str]:
    """The sweep's environment for the pair jobs: the probe names its node from
    SLURMD_NODENAME, and reads the configuration the sweep read (same path on the nodes)."""
    env = {k: v for k, v in os.environ.items() if k != "MEDIC_NODE_NAME"}
    env.update(slurm.env)
    if config.source is not None:
        env[CONFIG_ENV] = str(config.source)
    return env


def run_pair(
    slurm: PairSlurm,
    config: MedicConfig,
    reservation: str,
    pair: Pair,
    round_no: int,
    sweep: SweepSettings,
    pairs: PairSettings,
    floors: Mapping[str, float],
) -> PairResult:
    info = slurm.node(pair[0])
    result = slurm.srun(
        srun_args(reservation, pair, round_no, sweep, pairs, info),
        timeout=pairs.timeout + sweep.immediate + 30,
        env=job_env(slurm, config),
    )
    if result.timed_out:
        with contextlib.suppress(SlurmError):
            slurm.cancel_job_named(job_name(reservation, pair, round_no))
    return judge_output(
        pair, round_no, result.stdout, result.timed_out, result.describe_failure(), pairs, floors
    )


def result_json(r: PairResult) -> dict[str, Any]:
    return {
        "pair": [r.a, r.b],
        "round": r.round,
        "outcome": r.outcome,
        "measured": dict(r.measured),
        "why": r.why,
    }


def node_classes(inventories: Sequence[Any]) -> dict[str, str]:
    """Node -> class from the daemons' stored inventories (unreadable ones left out)."""
    from medic_core.inventory import NodeInventory

    classes = {}
    for stored in inventories:
        with contextlib.suppress(ValueError):
            classes[stored.node] = NodeInventory.from_json(stored.inventory).node_class
    return classes
