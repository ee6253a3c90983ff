"""Offline sweeps, the runner: `Sweeper` gathers from Slurm and the store, plans with
`remediation.sweep.policy`, writes each step to `remediation.sweep.store` before taking it,
holds nodes with reservations (`SweepSlurm`), runs the probe under srun and hands failures
to the ladder. The deep tier on the node itself (`medic sweep probe`) is healthd.inline.deep_probe.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from medic_core.config import MedicConfig
from medic_core.drain_reason import drain_if_allowed, format_reason
from medic_core.settings import SweepSettings
from medic_core.slurm import NodeInfo, SlurmError
from medic_core.status import Status
from medic_core.store import Severity, Store
from medic_core.vocabulary import Finding, Recommendation
from remediation import episodes as ep
from remediation.sweep.policy import (
    CHECKED,
    FAIL,
    FINAL,
    HANDED,
    HELD,
    HOLDING,
    INCONCLUSIVE,
    PASS,
    PLANNED,
    PROBING,
    RETURNED,
    SKIPPED,
    TAKING,
    Candidate,
    NodeVerdict,
    Risk,
    availability,
    gres_request,
    judge,
    next_batch,
    partition_caps,
    rank,
    summary,
)
from remediation.sweep.slurm import SweepSlurm, invoking_user
from remediation.sweep.store import SweepNode, SweepStore

log = logging.getLogger("medic.sweep")

EVENT_KIND = "sweep"
# Seconds a reservation outlives the node's deep-tier timeout: room for srun to start and
# for the sweep to record the result and delete it.
RESERVATION_SLACK = 600.0


# ---- the runner ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """One step of a sweep, for the CLI's progress bar or log lines."""

    node: str
    state: str
    message: str
    done: int
    total: int


@dataclass(frozen=True)
class SweepReport:
    sweep_id: int | None
    resumed: bool
    dry_run: bool
    nodes: tuple[SweepNode, ...]
    plan: tuple[tuple[Candidate, Risk], ...]
    caps: Mapping[str, int]
    seconds: float
    message: str

    def to_json(self) -> dict[str, Any]:
        if self.dry_run:
            nodes = [
                {"node": c.node, "partitions": list(c.partitions), "risk": r.to_json()}
                for c, r in self.plan
            ]
        else:
            nodes = [n.to_json() for n in self.nodes]
        return {
            "sweep": self.sweep_id,
            "resumed": self.resumed,
            "dry_run": self.dry_run,
            "caps": dict(self.caps),
            "seconds": round(self.seconds, 3),
            "message": self.message,
            "nodes": nodes,
        }


def _episode_counts(episodes: Iterable[ep.Episode]) -> dict[str, tuple[int, int]]:
    counts: dict[str, tuple[int, int]] = {}
    for e in episodes:
        n, failed = counts.get(e.node, (0, 0))
        counts[e.node] = (n + 1, failed + e.failed_requalifications)
    return counts


class Sweeper:
    def __init__(
        self,
        config: MedicConfig,
        store: Store,
        slurm: SweepSlurm,
        settings: SweepSettings,
        progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.rows = SweepStore(store)
        self.episodes = ep.EpisodeStore(store)
        self.slurm = slurm
        self.settings = settings
        self.progress = progress or (lambda _p: None)
        self._done = 0
        self._total = 0

    # ---- gather --------------------------------------------------------------------------

    def candidates(self, nodes: Sequence[NodeInfo]) -> list[Candidate]:
        now = self.rows.now()
        since = now - dt.timedelta(days=self.settings.lemon_days)
        counts = _episode_counts(self.episodes.find(since=since))
        open_nodes = {e.node for e in self.episodes.find(states=ep.OPEN_STATES)}
        history = self.rows.history()
        deep_seen: dict[str, dt.datetime] = {}
        correctable: dict[str, int] = {}
        for cond in self.store.conditions():
            if cond.type.startswith("deep_") and cond.status.value != "NOT_APPLICABLE":
                deep_seen[cond.node] = max(
                    cond.updated_at, deep_seen.get(cond.node, cond.updated_at)
                )
            if cond.type == "gpu_ecc":
                correctable[cond.node] = correctable.get(cond.node, 0) + int(
                    cond.evidence.get("aggregate_sbe") or 0
                )
        found = []
        for node in nodes:
            last = history.get(node.name)
            seen = [t for t in (deep_seen.get(node.name), last.checked_at if last else None) if t]
            before = last.risk.get("correctable") if last else None
            episodes, failed = counts.get(node.name, (0, 0))
            why = availability(node, node.name in open_nodes)
            found.append(
                Candidate(
                    node=node.name,
                    partitions=node.partitions,
                    available=not why,
                    why_not=why,
                    episodes_recent=episodes,
                    failed_requalifications=failed,
                    last_deep=max(seen) if seen else None,
                    correctable=correctable.get(node.name, 0),
                    correctable_before=int(before) if isinstance(before, int) else None,
                    correctable_since=last.checked_at if last else None,
                )
            )
        return found

    def plan(
        self, nodes: Sequence[NodeInfo], partition: str | None
    ) -> list[tuple[Candidate, Risk]]:
        wanted = {partition} if partition else set(self.settings.partitions)
        chosen = [n for n in nodes if not wanted or wanted & set(n.partitions)]
        ranked = rank(self.candidates(chosen), self.rows.now(), self.settings.min_interval_days)
        if self.settings.max_nodes:
            ranked = ranked[: self.settings.max_nodes]
        return ranked

    # ---- run -----------------------------------------------------------------------------

    def run(
        self, partition: str | None = None, share: float | None = None, dry_run: bool = False
    ) -> SweepReport:
        started = time.monotonic()
        share = self.settings.share if share is None else share
        if dry_run:
            nodes = self.slurm.nodes()
            plan = self.plan(nodes, partition)
            caps = partition_caps(nodes, share, self.settings.min_nodes)
            return SweepReport(
                None,
                False,
                True,
                (),
                tuple(plan),
                caps,
                time.monotonic() - started,
                f"would check {len(plan)} nodes",
            )
        with self.rows.exclusive():
            active = self.rows.active()
            resumed = active is not None
            if active is None:
                nodes = self.slurm.nodes()
                plan = self.plan(nodes, partition)
                sweep_id = self.rows.create(partition or "", share, plan)
                log.info("sweep %d: %d nodes planned", sweep_id, len(plan))
            else:
                sweep_id, share = active.id, active.share
                self.rows.adopt(sweep_id)
                log.warning(
                    "resuming sweep %d (was pid %d on %s)", sweep_id, active.pid, active.host
                )
            caps = self._drive(sweep_id, share)
            rows = self.rows.nodes(sweep_id)
            message = summary(r.state for r in rows)
            self.rows.finish(sweep_id, message)
            plan_rows = tuple(rows)
        return SweepReport(
            sweep_id, resumed, False, plan_rows, (), caps, time.monotonic() - started, message
        )

    def _drive(self, sweep_id: int, share: float) -> dict[str, int]:
        rows = self.rows.nodes(sweep_id)
        self._total = len(rows)
        self._done = sum(1 for r in rows if r.state in FINAL)
        nodes = self.slurm.nodes()
        caps = partition_caps(nodes, share, self.settings.min_nodes)
        workers = max(1, sum(caps.values()))
        with concurrent.futures.ThreadPoolExecutor(workers, "sweep") as pool:
            running: dict[concurrent.futures.Future[None], SweepNode] = {}
            for row in rows:  # what a killed sweep left half done, first
                if row.state in HOLDING:
                    running[pool.submit(self._recover, row)] = row
            while True:
                rows = self.rows.nodes(sweep_id)
                queue = [r for r in rows if r.state == PLANNED]
                if not queue and not running:
                    break
                held: dict[str, int] = {}
                for r in rows:
                    if r.state in HOLDING:
                        for p in r.partitions:
                            held[p] = held.get(p, 0) + 1
                if queue:
                    nodes = self.slurm.nodes()
                    caps = partition_caps(nodes, share, self.settings.min_nodes)
                    by_name = {n.name: n for n in nodes}
                    partitions_of = {
                        r.node: by_name[r.node].partitions if r.node in by_name else ()
                        for r in queue
                    }
                    for name in next_batch([r.node for r in queue], partitions_of, held, caps):
                        row = next(r for r in queue if r.node == name)
                        if self._take(row, by_name.get(name)):
                            running[pool.submit(self._check, row)] = row
                        for p in partitions_of[name]:
                            held[p] = held.get(p, 0) + 1
                    unplaceable = [r for r in queue if not partitions_of[r.node]]
                    for r in unplaceable:
                        self._skip(r, "no longer in Slurm's node list")
                if not running:
                    continue
                finished, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in finished:
                    row = running.pop(future)
                    try:
                        future.result()
                    except Exception:
                        log.exception("sweep of %s failed; its reservation expires", row.node)
                        self.rows.set_node(
                            row.id, state=SKIPPED, message="sweep error: see the log"
                        )
        return caps

    # ---- one node ------------------------------------------------------------------------

    def _report(self, row: SweepNode, state: str, message: str) -> None:
        if state in FINAL:
            self._done += 1
        self.progress(Progress(row.node, state, message, self._done, self._total))

    def _skip(self, row: SweepNode, why: str) -> None:
        self.rows.set_node(row.id, state=SKIPPED, message=why)
        self._report(row, SKIPPED, why)

    def _minutes(self) -> int:
        return math.ceil((self.settings.timeout + self.settings.immediate + RESERVATION_SLACK) / 60)

    def _take(self, row: SweepNode, node: NodeInfo | None) -> bool:
        why = "no longer in Slurm's node list" if node is None else ""
        if node is not None:
            why = availability(node, self.episodes.open_for(row.node) is not None)
        if why:
            self._skip(row, why)
            return False
        self.rows.set_node(row.id, state=TAKING, taken_at=self.rows.now())
        user = self.settings.reservation_user or invoking_user()
        try:
            self.slurm.create_reservation(row.reservation, row.node, self._minutes(), user)
        except SlurmError as exc:  # busy since we looked (Slurm refuses), or gone
            self._skip(row, f"not taken: {exc}")
            return False
        # Someone may have drained it between our look and the reservation: theirs now.
        again = self.slurm.node(row.node)
        why = "gone" if again is None else availability(again, False, ours=True)
        if why:
            self._give_back(row, SKIPPED, f"not taken: {why}")
            return False
        self.rows.set_node(row.id, state=HELD)
        self._report(row, HELD, f"taken ({row.reservation})")
        return True

    def _recover(self, row: SweepNode) -> None:
        """A node a killed sweep left held: cancel its orphaned probe and decide again."""
        if row.state == CHECKED:
            self._finish(row, _stored_verdict(row))
            return
        if not self.slurm.reservation_exists(row.reservation):
            # Never made (killed right after the intent), or expired: plan it again.
            self.rows.set_node(row.id, state=PLANNED, taken_at=None)
            self._report(row, PLANNED, "reservation gone: planned again")
            return
        self.slurm.cancel_reservation_jobs(row.reservation)
        self.rows.set_node(row.id, state=HELD)
        self._report(row, HELD, "resumed: the interrupted probe is run again")
        self._check(row)

    def _check(self, row: SweepNode) -> None:
        self.rows.set_node(row.id, state=PROBING)
        self._report(row, PROBING, "deep tier running")
        info = self.slurm.node(row.node)
        args = [
            f"--reservation={row.reservation}",
            f"--nodelist={row.node}",
            "--nodes=1",
            "--ntasks=1",
            "--exclusive",
            f"--job-name={row.reservation}",
            f"--time={math.ceil(self.settings.timeout / 60) + 1}",
            f"--immediate={math.ceil(self.settings.immediate)}",
            "--quiet",
        ]
        gres = gres_request(info.gres) if info else None
        if gres:
            args.append(f"--gres={gres}")
        probe = [*self.settings.probe, "--timeout", f"{self.settings.timeout:g}"]
        for name in self.settings.checks:
            probe += ["--check", name]
        started = time.monotonic()
        result = self.slurm.srun(
            [*args, *self.settings.srun_args, *probe],
            timeout=self.settings.timeout + self.settings.immediate + 30,
            env=self._job_env(),
        )
        if result.timed_out:
            with contextlib.suppress(SlurmError):
                self.slurm.cancel_reservation_jobs(row.reservation)
        verdict = judge(
            result.returncode,
            result.stdout,
            result.timed_out,
            result.describe_failure(),
            self.settings.timeout,
        )
        self._record(row, verdict, time.monotonic() - started)
        self._finish(row, verdict)

    def _job_env(self) -> dict[str, str]:
        # The probe names its node from SLURMD_NODENAME: a MEDIC_NODE_NAME of ours would
        # make it speak for the wrong node.
        env = {k: v for k, v in os.environ.items() if k != "MEDIC_NODE_NAME"}
        env.update(self.slurm.env)
        return env

    def _record(self, row: SweepNode, verdict: NodeVerdict, seconds: float) -> None:
        now = self.rows.now()
        findings = [
            {
                "check": f.check,
                "status": f.status.value,
                "fault_class": f.fault_class,
                "target": f.target,
                "message": f.message,
                "recommendation": f.recommendation,
            }
            for f in verdict.findings
        ]
        self.rows.set_node(
            row.id,
            state=CHECKED,
            status=verdict.outcome,
            findings=findings,
            message=verdict.message[:2000],
            checked_at=now,
            seconds=round(seconds, 3),
        )
        severity = {PASS: Severity.INFO, FAIL: Severity.CRITICAL}.get(
            verdict.outcome, Severity.WARN
        )
        self.store.add_event(
            node=row.node,
            at=now,
            kind=EVENT_KIND,
            severity=severity,
            source=f"sweep:{row.sweep_id}",
            message=f"deep tier {verdict.outcome}: {verdict.message}",
            fault_class=verdict.findings[0].fault_class if verdict.findings else "",
            target=verdict.findings[0].target if verdict.findings else "",
            evidence={
                "sweep": row.sweep_id,
                "seconds": round(seconds, 3),
                "findings": findings,
                "source": verdict.report.get("source"),
            },
        )
        self._report(row, CHECKED, f"{verdict.outcome}: {verdict.message}")

    def _finish(self, row: SweepNode, verdict: NodeVerdict) -> None:
        if verdict.outcome != FAIL:
            self._give_back(row, RETURNED, verdict.message)
            return
        episode_id, why = self.hand_to_ladder(row.node, verdict.findings, row.taken_at)
        self.rows.set_node(row.id, episode_id=episode_id)
        self._give_back(row, HANDED, why)

    def hand_to_ladder(
        self, node: str, findings: Sequence[Finding], taken: dt.datetime | None
    ) -> tuple[int | None, str]:
        """The ladder's own admission (kill switch, drain cap, lemon, fleet signature), then
        Medic's drain with the fault's reason: the node is the episode's from here on."""
        from medic_core.settings import RemediationSettings
        from remediation.ladder import Ladder

        # The node's medic-healthd ran the probe, recorded the fault and admitted it itself
        # (its episode may be closed already: needs_human); a second episode would double
        # count towards the lemon score.
        since = taken or self.rows.now()
        own = self.episodes.find(node=node, since=since)
        if own and not own[-1].open:
            return own[-1].id, f"episode {own[-1].id} ({own[-1].state}) opened by medic-healthd"

        ladder = Ladder(
            node,
            self.episodes,
            self.slurm,
            _SweepLadderHost(self.store, node),
            RemediationSettings.from_config(self.config),
        )
        admission = ladder.admit(findings)
        episode = admission.episode
        if not admission.drain:
            return (episode.id if episode else None), f"ladder: not drained ({admission.why})"
        first = findings[0]
        reason = format_reason(first.fault_class or first.check, first.target, first.message)
        outcome = drain_if_allowed(
            self.slurm,
            node,
            reason,
            ladder.book,  # recorded first: the episode's ladder gives back only its own drain
            actor="sweep",
            episode_id=episode.id if episode else None,
        )
        ladder.drained(admission, outcome.value)
        return (episode.id if episode else None), (
            f"episode {episode.id if episode else '-'}: {admission.why}; drain {outcome.value}"
        )

    def _give_back(self, row: SweepNode, state: str, message: str) -> None:
        self.slurm.delete_reservation(row.reservation)
        self.rows.set_node(row.id, state=state, message=message[:2000], returned_at=self.rows.now())
        self._report(row, state, message)


def _stored_verdict(row: SweepNode) -> NodeVerdict:
    findings = tuple(
        Finding(
            check=str(f.get("check", "")),
            status=Status(f.get("status", "CRITICAL")),
            fault_class=str(f.get("fault_class", "")),
            target=str(f.get("target", "")),
            message=str(f.get("message", "")),
            recommendation=Recommendation.parse(f.get("recommendation")),
        )
        for f in row.findings
    )
    return NodeVerdict(row.status or INCONCLUSIVE, "", findings, row.message)


class _SweepLadderHost:
    """The ladder's host for an admission made by the sweep. Only `event` is used there;
    the node's own medic-healthd runs the episode (its ladder thread reads the store)."""

    def __init__(self, store: Store, node: str) -> None:
        self.store = store
        self.node = node

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None:
        self.store.add_event(
            node=self.node,
            at=dt.datetime.now(dt.UTC),
            kind="remediation",
            severity=Severity(severity),
            source="sweep",
            message=message,
            fault_class=fault_class,
            target=target,
        )

    def _not_here(self) -> Any:
        raise RuntimeError("the sweep only admits; the node's medic-healthd runs the episode")

    def boot_id(self) -> str:
        return str(self._not_here())

    def jobs_running(self) -> bool:
        return bool(self._not_here())

    def gpu_busy(self, gpu: int) -> bool:
        return bool(self._not_here())

    def release_gpus(self) -> None:
        self._not_here()

    def reacquire_gpus(self) -> None:
        self._not_here()

    def after_repair(self, gpu: int | None, before: float) -> None:
        self._not_here()

    def verify(self, extra_checks: Sequence[str]) -> list[Finding]:
        return list(self._not_here())

    def open_rma(self, episode: ep.Episode, why: str) -> int | None:
        return int(self._not_here())
