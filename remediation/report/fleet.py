"""The fleet's figures in `medic report`: MTBF, episodes by fault class and by node, time
out of service and in RMA, lemons, what each rung did, false ejections and the nodes waiting
for a human. Pure.

A rung's outcome is measured, not requested: it WORKED when re-qualification passed after it
(the episode's last step, done, and the episode resolved by that verification, never by an
RMA); a done step after which the ladder went on (another step, RMA, a human) did NOT REPAIR.
A step's time runs from its intent to its end; a reboot's ends when the new boot was seen
(REBOOT_SEEN in its output), and one without that record has no measured time.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence

from remediation.episode_types import CLOSED, NEEDS_HUMAN, RESOLVED, RMA, WAITING_CAP
from remediation.policy import fault_family
from remediation.report.durations import in_window, percentile, seconds
from remediation.report.figures import (
    ClassCount,
    FalseEjection,
    FleetReport,
    HumanWait,
    Interruption,
    NodeFigures,
    RungFigures,
)
from remediation.report.rows import REBOOT, EpisodeRow, LemonRule, ReportInput, StepRow

WORKED, NOT_REPAIRED, FAILED, PENDING = "worked", "not_repaired", "failed", "pending"


def _union_seconds(
    intervals: Iterable[tuple[dt.datetime, dt.datetime]], since: dt.datetime, until: dt.datetime
) -> float:
    """Seconds covered by the intervals inside the window, overlaps counted once."""
    clipped = sorted(
        (max(a, since), min(b, until)) for a, b in intervals if b > since and a < until
    )
    total = 0.0
    current: tuple[dt.datetime, dt.datetime] | None = None
    for a, b in clipped:
        if b <= a:
            continue
        if current is None or a > current[1]:
            if current is not None:
                total += seconds(*current)
            current = (a, b)
        else:
            current = (current[0], max(current[1], b))
    if current is not None:
        total += seconds(*current)
    return total


def _is_lemon(episodes: Sequence[EpisodeRow], rule: LemonRule, repaired: Collection[int]) -> bool:
    """The ladder's rule (remediation.policy.LemonScore) at any moment of the window, per
    part and fault family: `rule.episodes` episodes of one part (`target`) and one family
    that needed a repair (`repaired`: a rung's step ran, or an RMA ticket) and that no human
    closed, within `rule.days`, or `rule.failed_requalifications` failed re-qualifications
    among them. A link that came back by itself never counts toward a GPU's."""
    groups: dict[tuple[str, str], list[EpisodeRow]] = defaultdict(list)
    for e in episodes:
        if (e.id in repaired or e.went_to_rma) and e.state != CLOSED:
            groups[(e.target, fault_family(e.fault_class))].append(e)
    span = dt.timedelta(days=rule.days)
    n = rule.episodes
    for group in groups.values():
        if sum(e.failed_requalifications for e in group) >= rule.failed_requalifications:
            return True
        opened = sorted(e.opened_at for e in group)
        if any(opened[i + n - 1] - opened[i] <= span for i in range(len(opened) - n + 1)):
            return True
    return False


def fleet_report(data: ReportInput, interruptions: Sequence[Interruption]) -> FleetReport:
    since, until = data.since, data.until
    hours = max(0.0, seconds(since, until)) / 3600
    gpus = data.fleet_nodes * data.gpus_per_node
    node_hours, gpu_hours = data.fleet_nodes * hours, gpus * hours
    opened = [e for e in data.episodes if in_window(e.opened_at, since, until)]
    # Out of service: every episode that overlaps the window (opened before it, still out).
    overlapping = [
        e
        for e in data.episodes
        if e.opened_at <= until and (e.closed_at is None or e.closed_at >= since)
    ]

    episodes_by_node: dict[str, list[EpisodeRow]] = defaultdict(list)
    for e in opened:
        episodes_by_node[e.node].append(e)
    # An episode needed a repair when a rung's step ran (the ladder's lemon rule counts no
    # other): a link re-checked until it came back did not.
    repaired = {s.episode_id for s in data.steps}
    out_intervals: dict[str, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
    for e in overlapping:
        if e.state != WAITING_CAP:  # a needs_human node stays out until a human acts
            end = until if e.state == NEEDS_HUMAN else (e.closed_at or until)
            out_intervals[e.node].append((e.opened_at, end))
    rma_intervals: dict[str, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
    for t in data.tickets:
        rma_intervals[t.node].append((t.created_at, t.closed_at or until))
    interruptions_by_node: dict[str, int] = defaultdict(int)
    for i in interruptions:
        interruptions_by_node[i.node] += 1
    jobs_by_node: dict[str, set[str]] = defaultdict(set)
    for a in data.actions:
        if in_window(a.at, since, until):
            jobs_by_node[a.node].add(a.job_id)

    nodes = sorted(
        {*episodes_by_node, *interruptions_by_node, *out_intervals, *rma_intervals, *jobs_by_node}
    )
    figures = []
    for node in nodes:
        rma = _union_seconds(rma_intervals[node], since, until)
        out = _union_seconds([*out_intervals[node], *rma_intervals[node]], since, until)
        figures.append(
            NodeFigures(
                node=node,
                episodes=len(episodes_by_node[node]),
                interruptions=interruptions_by_node[node],
                jobs_touched=len(jobs_by_node[node]),
                out_of_service_s=out,
                rma_s=rma,
                lemon=_is_lemon(episodes_by_node[node], data.lemon, repaired),
            )
        )
    figures.sort(key=lambda f: (-f.episodes, -f.interruptions, -f.out_of_service_s, f.node))

    classes: dict[str, tuple[int, int, set[str]]] = {}
    for e in opened:
        n_ep, n_int, where = classes.get(e.fault_class, (0, 0, set()))
        classes[e.fault_class] = (n_ep + 1, n_int, where | {e.node})
    for i in interruptions:
        n_ep, n_int, where = classes.get(i.fault_class, (0, 0, set()))
        classes[i.fault_class] = (n_ep, n_int + 1, where | {i.node})
    by_class = sorted(
        (ClassCount(c, n_ep, n_int, len(where)) for c, (n_ep, n_int, where) in classes.items()),
        key=lambda c: (-c.episodes, -c.interruptions, c.fault_class),
    )

    episodes_by_id = {e.id: e for e in opened}
    steps_by_episode: dict[int, list[StepRow]] = defaultdict(list)
    for s in sorted(data.steps, key=lambda s: s.started_at):
        if s.episode_id in episodes_by_id:
            steps_by_episode[s.episode_id].append(s)
    rung_steps: dict[tuple[int, str], list[StepRow]] = defaultdict(list)
    outcomes: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for episode_id, steps in steps_by_episode.items():
        for n, s in enumerate(steps):
            rung_steps[(s.rung, s.action)].append(s)
            after = step_outcome(episodes_by_id[episode_id], s, n == len(steps) - 1)
            outcomes[(s.rung, s.action)][after] += 1
    rungs = []
    for key in sorted(rung_steps):
        steps = rung_steps[key]
        took = [t for t in (s.took_s for s in steps) if t is not None]
        counts = outcomes[key]
        rungs.append(
            RungFigures(
                rung=key[0],
                action=key[1],
                attempts=len(steps),
                worked=counts[WORKED],
                failed=counts[FAILED],
                p50_s=percentile(took, 0.5),
                p90_s=percentile(took, 0.9),
                not_repaired=counts[NOT_REPAIRED],
                pending=counts[PENDING],
                measured=len(took),
            )
        )
    waiting = tuple(
        HumanWait(e.id, e.node, e.fault_class, e.opened_at, e.closed_at or e.opened_at)
        for e in sorted(overlapping, key=lambda e: e.opened_at)
        if e.state == NEEDS_HUMAN
    )

    false_ejections = tuple(
        FalseEjection(
            episode_id=e.id,
            node=e.node,
            fault_class=e.fault_class,
            opened_at=e.opened_at,
            closed_at=e.closed_at,
            out_s=max(0.0, seconds(e.opened_at, e.closed_at)),
        )
        for e in sorted(opened, key=lambda e: e.opened_at)
        if e.closed_at is not None and is_false_ejection(e, steps_by_episode.get(e.id, ()))
    )
    count = len(opened)
    return FleetReport(
        nodes=data.fleet_nodes,
        gpus=gpus,
        node_hours=node_hours,
        gpu_hours=gpu_hours,
        episodes=count,
        interruptions=len(interruptions),
        mtbf_node_hours=node_hours / count if count else None,
        mtbf_gpu_hours=gpu_hours / count if count else None,
        failure_rate_per_node_hour=count / node_hours if node_hours else 0.0,
        by_class=tuple(by_class),
        by_node=tuple(figures),
        lemons=tuple(f for f in figures if f.lemon),
        out_of_service_s=sum(f.out_of_service_s for f in figures),
        rma_s=sum(f.rma_s for f in figures),
        rungs=tuple(rungs),
        false_ejections=false_ejections,
        waiting_for_human=waiting,
    )


def step_outcome(episode: EpisodeRow, step: StepRow, last: bool) -> str:
    """What re-qualification said after `step`. Only the episode's last step can have
    worked, and only when the episode resolved through the verification after it: an
    episode that went to RMA was resolved by the vendor's repair (its re-qualification
    after the ticket), not by any rung."""
    if step.state != "done":
        return FAILED
    if not last:
        return NOT_REPAIRED  # the verification after it failed: the ladder went on
    if episode.state == RESOLVED:
        return NOT_REPAIRED if episode.went_to_rma else WORKED
    if episode.state in (RMA, NEEDS_HUMAN, CLOSED):
        return NOT_REPAIRED
    return PENDING


def is_false_ejection(episode: EpisodeRow, steps: Sequence[StepRow]) -> bool:
    """Taken out, and re-qualification passed with no repair: resolved, no step that ran
    (a reboot Slurm refused never ran), no failed re-qualification (that confirmed the
    fault) and never an RMA (a lemon's, or one a rung sent it to)."""
    ran = [s for s in steps if not (s.action == REBOOT and s.state == "failed")]
    return (
        episode.state == RESOLVED
        and episode.closed_at is not None
        and not episode.went_to_rma
        and episode.failed_requalifications == 0
        and not ran
    )
