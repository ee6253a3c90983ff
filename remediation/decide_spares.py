"""The decision core's part for hot spares (split from remediation.decide): which spare a
requeued job is handed, what a handed spare's reservation admits, and when the drain that
refused another job in its prolog is lifted. Pure functions of what Slurm and the store
show, like the rest of the core."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from medic_core.slurm import NodeInfo
from remediation.decide import fault_key

# --- a hot spare for a requeued job ------------------------------------------------------------


@dataclass(frozen=True)
class SpareDecision:
    node: str  # the spare handed to the job; "" for none
    why: str


def spare_key(job_id: str, slurm_restarts: int) -> str:
    """One hand-over per run of a job (`fault_key`): two nodes of one job answering the same
    fault, or a daemon answering again after a crash, hand one spare, not two."""
    return f"job:{job_id}:{fault_key(slurm_restarts)}"


def decide_spare(
    key: str,
    pool: Sequence[NodeInfo],
    free: int,
    handed: Collection[str],
    *,
    size: int,
) -> SpareDecision:
    """Hand a spare from the pool to a job Medic just requeued? Only with a pool configured
    (`size`), once per job run (`handed`: the keys already recorded), when no healthy node
    outside the pool is free for it (`free`), and only a spare Slurm shows idle and in
    service (a spare that failed meanwhile is never handed); the first by name."""
    if size <= 0:
        return SpareDecision("", "no spare pool ([remediation.spares] size = 0)")
    if key in handed:
        return SpareDecision("", f"a spare was handed for {key} already")
    if free > 0:
        return SpareDecision("", f"{free} healthy node(s) free: the queue places the job")
    usable = sorted(
        (n for n in pool if n.state == "IDLE" and not n.drained and not n.down),
        key=lambda n: _natural(n.name),
    )
    if not usable:
        return SpareDecision("", f"no idle spare in the pool ({len(pool)} held)")
    return SpareDecision(usable[0].name, f"no healthy node free: spare {usable[0].name} handed")


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


# --- a handed spare, bound to the run it was handed to ----------------------------------------


@dataclass(frozen=True)
class ReservedJob:
    """A job Slurm shows in a handed spare's reservation."""

    job_id: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    nodes: tuple[str, ...]  # () while pending


@dataclass(frozen=True)
class SpareTending:
    """What to do with a handed spare's reservation now: `requeue` (other jobs running on
    the spare), then `unbind` (clear the reservation of these jobs), then `delete` it."""

    requeue: tuple[str, ...]
    unbind: tuple[str, ...]
    delete: bool
    why: str
    # The job in its prolog on the spare (`launching`) that is not the bound run: refused
    # there (the prolog fails, so its script never starts), not requeued by Medic.
    refuse: str = ""


def decide_spare_tending(
    bound: str,
    spare: str,
    in_reservation: Sequence[ReservedJob],
    *,
    moved: bool,
    launching: str = "",
    refused: Collection[str] = (),
    in_prolog: Collection[str] = (),
) -> SpareTending:
    """A handed spare admits only the run it was handed to (`bound`). Slurm admits a
    reservation's jobs by user, account or group, never by job, so every other job in it
    (the same user's, naming it) is refused: requeued off the spare if it runs, cleared of
    the reservation. Once the bound job runs, its allocation holds the spare and the
    reservation goes (cleared of the job first: Slurm refuses to delete a reservation in
    use), so the spare is free when that run ends, fails or is requeued. A bound job not in
    the reservation (it ended, or was never moved in: `moved` False while the hand-over
    may still be moving it) gives the spare back at once.

    `launching`: a job in its prolog on the spare (the launch gate asks before its verdict).
    Another job of the reservation is refused there, `refuse`: the prolog fails, so Slurm
    never starts its script (a requeue during the prolog does not always stop it), and it
    is left to Slurm's requeue rather than requeued by Medic as well, as are the jobs
    already `refused` in their prolog whose refusal still holds the spare. A job that may
    still be in its prolog (`in_prolog`: on the spare for less than the prolog's time;
    Slurm shows it RUNNING or CONFIGURING) is left to that prolog, which asks this daemon:
    it is refused there, or it is still running once its prolog had its time (the daemon
    did not answer it) and is requeued then."""
    others = [j for j in in_reservation if j.job_id != bound]
    refuse = launching if launching and any(j.job_id == launching for j in others) else ""
    prolog = {j.job_id for j in others if j.state == "CONFIGURING"} | set(in_prolog)
    left = {refuse, *refused, *prolog}
    requeue = tuple(j.job_id for j in others if j.state != "PENDING" and j.job_id not in left)
    # Cleared of the reservation once out of its prolog: the prolog's gate looks for it there.
    unbind = tuple(j.job_id for j in others if j.job_id not in {refuse, *prolog})
    mine = next((j for j in in_reservation if j.job_id == bound), None)
    refused = f"; {len(others)} other job(s) refused" if others else ""
    if mine is None:
        if not moved:
            why = f"job {bound} being moved in{refused}"
            return SpareTending(requeue, unbind, False, why, refuse)
        why = f"job {bound} is not in it (ended, failed, requeued or never moved): given back"
        return SpareTending(requeue, unbind, True, why + refused, refuse)
    if mine.state == "PENDING":
        why = f"job {bound} waits for {spare}{refused}"
        return SpareTending(requeue, unbind, False, why, refuse)
    state = mine.state.lower()
    if spare in mine.nodes:
        why = f"job {bound} {state} on {spare}: its allocation holds it, the reservation goes"
    else:
        why = f"job {bound} {state} without {spare}: given back"
    return SpareTending(requeue, (*unbind, bound), True, why + refused, refuse)


def decide_unseen_launch(bound_runs: Collection[str], launching: str) -> SpareTending | None:
    """A handed spare whose reservation Slurm did not show while `launching` was in its
    prolog: the job is refused unless it is a run the spare is handed to. Fails closed, as
    the prolog does when the daemon does not answer: only the reservation's own jobs can
    start on a handed spare, and the bound run is allowed, so what is refused is the user's
    other job, or at worst a job the spare was free for again since (requeued by its
    prolog's failure, not lost). None: nothing to refuse."""
    if not launching or launching in bound_runs:
        return None
    why = f"its reservation not read: job {launching} refused unseen"
    return SpareTending((), (), False, why, refuse=launching)


def decide_refusal_lift(
    refused_states: Sequence[tuple[str, tuple[str, ...]]], spare: str, reason_matches: bool
) -> str:
    """Why a spare drained to refuse another job in its prolog stays drained ("" when the
    drain may be lifted now). `refused_states`: (state, nodes) of each job refused there.
    The drain is lifted once no refused job is still in its prolog (CONFIGURING) or shown
    RUNNING on the spare: its prolog has failed, and Slurm has requeued it (lifted earlier,
    Slurm's own "Prolog error" drain would land on a node in service, and that one is never
    Medic's); its epilog may still run (COMPLETING), which no other job waits for on an
    exclusive node. Only while Slurm still shows the refusal's own reason (another drain
    since is not this one)."""
    if not reason_matches:
        return "the spare's drain is no longer the refusal's"
    for state, nodes in refused_states:
        if state in ("CONFIGURING", "RUNNING") and spare in nodes:
            return f"a refused job is still {state.lower()} on {spare}"
    return ""
