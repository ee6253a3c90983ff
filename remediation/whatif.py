"""`medic report what-if`: the expected cost of failures for one training run. Pure.

A synchronous training job stops when any of its nodes fails, so with independent failures
at rate r per node-hour a job on N nodes is interrupted at Λ = N·r per hour of running
(exponential failures: the MTBF of the job is 1/Λ; Meta's Llama 3 report and the HPCA 2025
paper on Meta's research clusters both read their fleets this way). Each interruption costs
the MTTR (down until training runs again) and, with checkpoints every τ hours, on average
τ/2 of work done since the last checkpoint (Young 1974; Daly 2006 for the refinement), which
is run again and can itself be interrupted. Writing a checkpoint stalls training δ.

For T hours of failure-free work:

    compute   C = T·(1 + δ/τ)                 work plus checkpoint stalls
    running   R = C + n·τ/2                   plus the work done again
    failures  n = Λ·R  =>  n = Λ·C / (1 − Λ·τ/2)
    wall      W = R + n·MTTR
    ETTR      T / W;   lost time W − T;   Young's optimal interval τ* = sqrt(2δ/Λ)

Without τ the work lost is taken to be inside the MTTR: n = Λ·T and W = T·(1 + Λ·MTTR),
which is the model of AWS's HyperPod case (docs/operator-guide.md works it by hand).

With a reload time per checkpoint tier (`Reloads`), the MTTR given is the downtime before
the reload, and each interruption adds its tier's reload: every one from the durable tier,
or a share s from the node-local tier (the job comes back on the same nodes: an application
fault) and the rest from durable, MTTR + s·local + (1 − s)·durable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    nodes: int
    gpus_per_node: int
    failure_rate: float  # interruptions per node-hour of running
    work_hours: float  # failure-free wall time of the run
    mttr_hours: float
    checkpoint_interval_hours: float | None = None
    checkpoint_cost_hours: float = 0.0
    price_per_gpu_hour: float | None = None


RELOAD_TIERS = ("local", "durable")  # a peer replica tier is not built (docs/resilient-jobs.md)


@dataclass(frozen=True)
class Reloads:
    """Hours to reload a checkpoint from each tier, and the share of interruptions that
    reload from the node-local one (None: no node-local tier)."""

    durable_hours: float
    local_hours: float | None = None
    local_share: float | None = None

    @classmethod
    def of(cls, hours: dict[str, float], local_share: float | None) -> Reloads:
        if "durable" not in hours:
            raise ValueError(
                "--reload durable=DURATION is needed: a lost node's job always reloads from"
                " the durable tier (peer replicas are not built)"
            )
        local = hours.get("local")
        if (local is None) != (local_share is None):
            raise ValueError(
                "--reload local=DURATION and --local-share go together: the share (0 to 1)"
                " of interruptions that come back on the same nodes and reload locally"
            )
        if local_share is not None and not 0 <= local_share <= 1:
            raise ValueError(f"--local-share {local_share}: expected a share from 0 to 1")
        return cls(hours["durable"], local, local_share)

    def rows(self, mttr_hours: float) -> list[tuple[str, float]]:
        """(label, MTTR with the reload) for every interruption from durable, and with the
        node-local tier when there is one."""
        found = [("durable", mttr_hours + self.durable_hours)]
        if self.local_hours is not None and self.local_share is not None:
            share = self.local_share
            mixed = share * self.local_hours + (1 - share) * self.durable_hours
            found.append((f"local {share:.0%}, else durable", mttr_hours + mixed))
        return found


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    job_failure_rate: float  # Λ, per hour of running
    mtbf_hours: float | None  # 1/Λ (None without failures)
    interruptions: float
    running_hours: float  # computing, checkpointing and redoing lost work
    down_hours: float  # interruptions x MTTR
    lost_work_hours: float  # redone after restarts
    wall_hours: float
    lost_hours: float  # wall - failure-free work
    ettr: float
    gpu_hours: float
    cost: float | None
    lost_cost: float | None
    optimal_interval_hours: float | None  # Young's, when a checkpoint cost is given


def expect(s: Scenario) -> Outcome:
    if s.nodes < 1 or s.gpus_per_node < 1:
        raise ValueError("a run needs at least one node with one GPU")
    if not 0 <= s.failure_rate < 1:
        raise ValueError(f"failure rate {s.failure_rate}: expected a rate per node-hour in [0, 1)")
    if s.work_hours <= 0 or s.mttr_hours < 0 or s.checkpoint_cost_hours < 0:
        raise ValueError("work must be positive; MTTR and checkpoint cost not negative")
    rate = s.nodes * s.failure_rate
    interval = s.checkpoint_interval_hours
    if interval is not None and interval <= 0:
        raise ValueError("the checkpoint interval must be positive")
    if interval is None:
        compute = s.work_hours
        half = 0.0
    else:
        compute = s.work_hours * (1 + s.checkpoint_cost_hours / interval)
        half = interval / 2
    if rate * half >= 1:
        raise ValueError(
            f"checkpoints every {interval} h with one failure every {1 / rate:.3g} h: the run"
            " never finishes (on average a failure comes before the next checkpoint);"
            " checkpoint more often"
        )
    interruptions = rate * compute / (1 - rate * half)
    lost_work = interruptions * half
    running = compute + lost_work
    down = interruptions * s.mttr_hours
    wall = running + down
    gpus = s.nodes * s.gpus_per_node
    optimal = None
    if s.checkpoint_cost_hours > 0 and rate > 0:
        optimal = math.sqrt(2 * s.checkpoint_cost_hours / rate)
    price = s.price_per_gpu_hour
    return Outcome(
        scenario=s,
        job_failure_rate=rate,
        mtbf_hours=1 / rate if rate else None,
        interruptions=interruptions,
        running_hours=running,
        down_hours=down,
        lost_work_hours=lost_work,
        wall_hours=wall,
        lost_hours=wall - s.work_hours,
        ettr=s.work_hours / wall,
        gpu_hours=wall * gpus,
        cost=wall * gpus * price if price is not None else None,
        lost_cost=(wall - s.work_hours) * gpus * price if price is not None else None,
        optimal_interval_hours=optimal,
    )


@dataclass(frozen=True)
class Saving:
    """What a shorter MTTR (`better`) saves against `base`, the same run otherwise."""

    base: Outcome
    better: Outcome
    wall_hours: float  # base wall - better wall (negative: it costs)
    wall_share: float  # of the base's wall time
    lost_share: float | None  # of the base's lost time (None: it lost none)
    gpu_hours: float
    cost: float | None


def saving(base: Outcome, better: Outcome) -> Saving:
    saved = base.wall_hours - better.wall_hours
    price = base.scenario.price_per_gpu_hour
    gpus = base.scenario.nodes * base.scenario.gpus_per_node
    return Saving(
        base=base,
        better=better,
        wall_hours=saved,
        wall_share=saved / base.wall_hours,
        lost_share=saved / base.lost_hours if base.lost_hours > 0 else None,
        gpu_hours=saved * gpus,
        cost=saved * gpus * price if price is not None else None,
    )
