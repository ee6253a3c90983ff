"""Hot spares: a pool of pre-qualified nodes Medic holds in one Slurm reservation
(`[remediation.spares] reservation`, "medic-spares"), handed at once to a resilient job
Medic requeued when no healthy node is free for it, and refilled from repaired nodes.

Hand-over (`SparePool.hand_over`, the daemon's ladder thread, right after the requeue and
before the releaser makes the job eligible): the decision core (`remediation.decide.
decide_spare`) picks the spare; the intent is recorded (an event of kind "spare" keyed by
the job's run, so a daemon that crashes and answers again, or the job's other node
answering the same fault, never hands a second spare); a reservation of the job's own is
made on the spare, `medic-spare-<job>`, with Flags=OVERLAP (made while the spare is still
in the pool, which it leaves after: never a moment in no reservation), FLEX (the job may use
nodes outside it too: a multi-node job keeps its healthy nodes), NO_HOLD_JOBS_AFTER (a job
still waiting in it when it goes is not held) and PURGE_COMP (Slurm deletes it if no job is
in it for `purge_after` seconds: a hand-over a crash cut short); the job is moved into it.
No other job of the queue can take the spare, whatever its priority.

Bound to the run (`SparePool.tend`, the spare's own daemon's ladder thread, every loop while
the spare is in the pool or handed): Slurm admits a reservation's jobs by user, account or
group, never by job, so the reservation names the job's user and Medic refuses the rest
(`remediation.decide_spares.decide_spare_tending`): another job in it (the user's, naming it) is
requeued off the spare if it runs and cleared of the reservation. Once the bound job runs,
it is cleared of the reservation and the reservation deleted: the job's allocation holds
the spare, and nothing names the spare any more, so when that run ends, fails or is
requeued the spare is simply free (a listed spare refills the pool after the deep tier). A
bound job that left the reservation without running in it gives the spare back at once.

Refill (`SparePool.join`, the ladder's give-back after a repair, and a listed node that
is idle and in service): a pool short of `size` takes the node if it passes the deep tier
first; it enters the pool reservation before Medic's drain is lifted, so no job lands on
it in between. Medic changes only the pool reservation it names and the reservations
named `medic-spare-*` it made: a node is added only after it passed the deep checks here,
and removed only when handed.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from medic_core.drain_book import SPARES, DrainBook
from medic_core.drain_reason import (
    DrainOutcome,
    as_slurm_stores,
    drain_if_allowed,
    format_reason,
)
from medic_core.settings import SpareSettings
from medic_core.slurm import NodeInfo, SlurmError, expand_hostlist
from medic_core.spare_names import JOB_RESERVATION_PREFIX, job_reservation
from medic_core.status import Status
from medic_core.store import Severity, Store
from medic_core.vocabulary import Finding
from remediation.decide import SPARE_REFUSAL
from remediation.decide_spares import (
    ReservedJob,
    SpareDecision,
    SpareTending,
    decide_refusal_lift,
    decide_spare,
    decide_spare_tending,
    decide_unseen_launch,
    spare_key,
)
from remediation.give_back import give_back
from remediation.sweep.slurm import SweepSlurm, invoking_user

log = logging.getLogger("medic.spares")

EVENT_KIND = "spare"
HANDING, HANDED, FAILED, JOINED = "handing", "handed", "failed", "joined"
# A handed spare's reservation after the hand-over: released (the bound job runs; its
# allocation holds the spare), given back (the bound job is not in it), and each other job
# found in it (refused: requeued off the spare and cleared of the reservation).
RELEASED, GIVEN_BACK, REFUSED_JOB = "released", "given_back", "refused_job"
# A job refused in its prolog leaves the spare drained by Medic (the prolog's failure makes
# Slurm drain it anyway: Medic's drain first keeps it Medic's); lifted once the job is off.
REFUSAL_LIFTED = "refusal_lifted"
REFUSAL_FAULT = SPARE_REFUSAL
OPEN_ACTIONS = frozenset({HANDING, HANDED, FAILED})
ACTOR = "daemon"  # a node's medic-healthd, named in each event's `by`
# The default `prolog_grace`: [hooks] launch_budget's default, the prolog's 0.3 s for its
# actions, and slurmctld's own time to show the prolog's end.
PROLOG_GRACE = 15.0
# A hand-over recorded as started may still be moving the job into its reservation.
MOVE_GRACE = dt.timedelta(seconds=60)
# How often a daemon with no open hand-over looks at the store again (a restart looks at
# once: a hand-over a crash interrupted is tended).
IDLE_LOOK_SECONDS = 60.0
# How far back the store is read for hand-overs already recorded: longer than any
# requeue-and-restart of one run.
HANDED_LOOKBACK = dt.timedelta(days=2)


def slurm_duration(seconds: int) -> str:
    """HH:MM:SS: Slurm reads a bare number in a reservation's flags as minutes (the lab's
    22.05 shows PURGE_COMP=60 as 01:00:00)."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def parse_reserved_jobs(text: str) -> list[ReservedJob]:
    """`squeue -h -R NAME -o %i|%T|%N` (user data: a line that is not three fields, or
    whose host list does not parse, is skipped or read without nodes)."""
    found = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            continue
        try:
            nodes = tuple(expand_hostlist(parts[2])) if parts[2] else ()
        except ValueError:
            nodes = ()
        found.append(ReservedJob(parts[0], parts[1], nodes))
    return found


def parse_reservations(text: str) -> dict[str, tuple[str, ...]]:
    """{name: nodes} from `scontrol -o show reservation` (one reservation a line)."""
    found: dict[str, tuple[str, ...]] = {}
    for line in text.split("\n"):
        name = re.match(r"ReservationName=(\S+)", line)
        if not name:
            continue
        nodes = re.search(r"(?:^|\s)Nodes=(\S*)", line)
        hostlist = nodes.group(1) if nodes else ""
        try:
            names = tuple(expand_hostlist(hostlist)) if hostlist not in ("", "(null)") else ()
        except ValueError:
            names = ()
        found[name.group(1)] = names
    return found


class SparesSlurm(SweepSlurm):
    """The reservation commands spares need beyond a sweep's (create, exists, delete)."""

    def reservations(self) -> dict[str, tuple[str, ...]]:
        result = self._run("scontrol", "-o", "show", "reservation")
        return parse_reservations(result)

    def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        self._run("scontrol", "update", f"reservationname={name}", f"nodes={','.join(nodes)}")

    def move_job(self, job_id: str, reservation: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", f"reservationname={reservation}")

    def reservation_jobs(self, name: str) -> list[ReservedJob]:
        """Jobs not yet finished in reservation `name` (22.05's `squeue --json` ignores -R)."""
        return parse_reserved_jobs(self._run("squeue", "-h", "-R", name, "-o", "%i|%T|%N"))

    def unbind(self, job_id: str) -> None:
        """Clear a job's reservation (an admin may, pending or running; it keeps running)."""
        self._run("scontrol", "update", f"jobid={job_id}", "reservationname=")

    def cancel(self, job_id: str) -> None:
        self._run("scancel", job_id)


@dataclass(frozen=True)
class OpenHandOver:
    """A hand-over this daemon recorded whose reservation was neither released nor given
    back: the last event of kind "spare" for that reservation."""

    job_id: str
    spare: str
    reservation: str
    action: str  # HANDING, HANDED or FAILED
    at: dt.datetime  # when that event was recorded


# node -> when (time.monotonic) its daemon looks at the store for open hand-overs next
_next_look: dict[str, float] = {}
# (reservation, job) -> when (time.monotonic) a job other than the bound one was first seen
# started on the spare: its prolog asks this daemon within `prolog_grace` of that.
_started_seen: dict[tuple[str, str], float] = {}
# One tend at a time in a daemon: the ladder thread's loop and the launch gate's (a job about
# to start on a handed spare: `guard_launch`) would otherwise requeue the same job twice.
_tend_lock = threading.Lock()


@dataclass(frozen=True)
class HandOver:
    job_id: str
    node: str  # "" when none was handed
    why: str
    reservation: str = ""


class SparePool:
    """The pool's actions; every Slurm call through `SparesSlurm` (argv, timeout), every
    step an event in the store before and after it is taken."""

    def __init__(
        self,
        settings: SpareSettings,
        slurm: SparesSlurm,
        store: Store,
        node: str,
        prolog_grace: float = PROLOG_GRACE,
    ) -> None:
        self.settings = settings
        self.slurm = slurm
        self.store = store
        self.node = node  # the node whose daemon acts (the faulty one, or the one joining)
        # How long another job started on a handed spare may still be in its prolog (whose
        # gate refuses it): the launch budget and the prolog's grace for its actions.
        self.prolog_grace = prolog_grace

    # ---- what the store says -------------------------------------------------------------

    def handed_keys(self) -> set[str]:
        since = dt.datetime.now(dt.UTC) - HANDED_LOOKBACK
        return {
            str(e.evidence.get("key"))
            for e in self.store.events(since=since, kind=EVENT_KIND)
            if e.evidence.get("action") in (HANDING, HANDED)
        }

    def _event(self, node: str, severity: Severity, message: str, **evidence: object) -> None:
        self.store.add_event(
            node=node,
            at=dt.datetime.now(dt.UTC),
            kind=EVENT_KIND,
            severity=severity,
            source="spares",
            message=message,
            target=f"job:{evidence['job_id']}" if evidence.get("job_id") else "",
            evidence=dict(evidence),
        )

    # ---- hand-over -----------------------------------------------------------------------

    def hand_over(self, job_id: str, slurm_restarts: int) -> HandOver:
        """A spare for job `job_id`, requeued by Medic off this node, if the decision core
        says so. Never raises SlurmError: a failed hand-over leaves the job to the queue."""
        key = spare_key(job_id, slurm_restarts)
        try:
            decision, user, old = self._decide(job_id, key)
        except SlurmError as exc:
            return HandOver(job_id, "", f"not handed: Slurm: {exc}")
        if not decision.node:
            return HandOver(job_id, "", decision.why)
        spare, name = decision.node, job_reservation(job_id)
        evidence = {"job_id": job_id, "key": key, "spare": spare, "reservation": name,
                    "by": self.node, "actor": ACTOR}  # fmt: skip
        # The intent first: answered again after a crash, this job gets no second spare.
        self._event(spare, Severity.INFO, f"handing {spare} to job {job_id}", action=HANDING,
                    **evidence)  # fmt: skip
        purge = slurm_duration(self.settings.purge_after)
        try:
            # The job's reservation first, overlapping the pool's, then the spare leaves the
            # pool: never a moment with the spare in no reservation (the lab's scheduler
            # gave it to a waiting job in the milliseconds between the two).
            self.slurm.create_reservation(
                name,
                spare,
                self.settings.hold_days * 24 * 60,
                user,
                flags=("FLEX", "OVERLAP", "NO_HOLD_JOBS_AFTER", f"PURGE_COMP={purge}"),
            )
            self.slurm.move_job(job_id, name)
            self._take_out_of_pool(spare)
        except SlurmError as exc:
            self._event(spare, Severity.WARN, f"hand-over of {spare} to job {job_id} failed:"
                        f" {exc}", action=FAILED, **evidence)  # fmt: skip
            return HandOver(job_id, "", f"not handed: {exc}", name)
        why = f"{decision.why} (job {job_id} was on {old or '?'})"
        self._event(spare, Severity.WARN, f"spare {spare} handed to job {job_id}: {why}",
                    action=HANDED, **evidence)  # fmt: skip
        return HandOver(job_id, spare, why, name)

    def _decide(self, job_id: str, key: str) -> tuple[SpareDecision, str, str]:
        handed = self.handed_keys()
        if self.settings.size <= 0 or key in handed:
            return decide_spare(key, [], 0, handed, size=self.settings.size), "", ""
        jobs = self.slurm.jobs([job_id])
        user = jobs[0].user if jobs else ""
        old = jobs[0].nodes if jobs else ""
        try:
            was_on = set(expand_hostlist(old)) if old else set()
        except ValueError:
            was_on = set()
        reservations = self.slurm.reservations()
        pool_names = set(reservations.get(self.settings.reservation, ()))
        reserved = {n for nodes in reservations.values() for n in nodes}
        nodes = self.slurm.nodes()
        pool = [n for n in nodes if n.name in pool_names]
        free = sum(
            1
            for n in nodes
            if n.name not in reserved
            and n.name not in was_on
            and n.name != self.node
            and n.state == "IDLE"
            and not n.drained
            and not n.down
        )
        decision = decide_spare(key, pool, free, handed, size=self.settings.size)
        if decision.node and not user:
            return SpareDecision("", f"job {job_id} not found: not handed"), "", old
        return decision, user, old

    # ---- bound to the run -----------------------------------------------------------------

    def open_handovers(self) -> tuple[list[OpenHandOver], bool, list[dict[str, object]]]:
        """Hand-overs of this daemon's node (the spare) neither released nor given back;
        whether the node may be handed any moment (its last spare event: it joined); and
        the evidence of each refusal that drained it since its drain was last lifted
        (newest first): the spare stays watched until it is lifted. One read of the store."""
        since = dt.datetime.now(dt.UTC) - HANDED_LOOKBACK
        last: dict[str, OpenHandOver] = {}
        events = self.store.events(node=self.node, since=since, kind=EVENT_KIND)
        in_pool = bool(events) and events[0].evidence.get("action") == JOINED  # newest first
        refusals: list[dict[str, object]] = []
        for e in events:
            action = e.evidence.get("action")
            if action == REFUSAL_LIFTED:
                break
            if action == REFUSED_JOB and e.evidence.get("drained"):
                refusals.append(dict(e.evidence))
        for e in events:
            name = str(e.evidence.get("reservation") or "")
            if not name.startswith(JOB_RESERVATION_PREFIX) or name in last:
                continue
            if e.evidence.get("action") == REFUSED_JOB:  # not a step of the hand-over itself
                continue
            last[name] = OpenHandOver(str(e.evidence.get("job_id") or ""), self.node, name,
                                      str(e.evidence.get("action") or ""), e.at)  # fmt: skip
        handovers = [h for h in last.values() if h.job_id and h.action in OPEN_ACTIONS]
        return handovers, in_pool, refusals

    def tend(self) -> list[SpareTending]:
        """Each open hand-over of this node, the spare, by its own daemon (healthy, and idle
        while the faulty node's daemon repairs or reboots), as `decide_spare_tending` says:
        other jobs refused, the reservation released once the bound job runs, or given back
        once the bound job is not in it. The store is read every loop while the node is in
        the pool or handed, else every IDLE_LOOK_SECONDS (and at once after a restart).
        Never raises SlurmError: the next loop tries again. No pool, or a node not listed
        in `nodes` (when some are): nothing to tend, the store is not read (PURGE_COMP
        still deletes a reservation no job is in)."""
        with _tend_lock:
            return self._tend()

    def guard_launch(self, job_id: str) -> Finding | None:
        """A job's prolog on this node, which may be handed: tend now, before its verdict.
        Another job of a handed spare's reservation is refused there: the spare is drained
        with Medic's reason (recorded first) and the finding returned makes the gate refuse
        the launch, so the prolog fails and Slurm never starts the job's script (a requeue
        during the prolog left it running in 2 of 5 lab runs). None: the job may start."""
        if not self.watching():
            return None
        with _tend_lock:
            done = self._tend(launching=job_id)
        refusal = next((d for d in done if d.refuse == job_id), None)
        if refusal is None:
            return None
        log.warning("%s: job %s refused in its prolog: %s", self.node, job_id, refusal.why)
        return Finding(
            check="spares",
            status=Status.CRITICAL,
            fault_class=REFUSAL_FAULT,
            target=f"job:{job_id}",
            message=f"spare {self.node} is handed to another run: job {job_id} refused",
        )

    def _tend(self, launching: str = "") -> list[SpareTending]:
        listed = not self.settings.nodes or self.node in self.settings.nodes
        if self.settings.size <= 0 or not listed:
            _next_look.pop(self.node, None)
            return []
        if time.monotonic() < _next_look.get(self.node, 0.0):
            return []
        try:
            handovers, in_pool, refusals = self.open_handovers()
        except Exception as exc:  # the store down: a watched spare stays watched (looked at
            # again next loop, its launches still guarded), any other node a minute away
            log.warning("%s: open hand-overs not read: %s", self.node, exc)
            if _next_look.get(self.node) != 0.0:
                _next_look[self.node] = time.monotonic() + IDLE_LOOK_SECONDS
            return []
        watch = handovers or in_pool or refusals
        _next_look[self.node] = 0.0 if watch else time.monotonic() + IDLE_LOOK_SECONDS
        done = []
        refused = {str(r.get("refused") or "") for r in refusals}  # Slurm requeues those
        unread = []
        for handover in handovers:
            try:
                done.append(self._tend_one(handover, launching, refused))
            except SlurmError as exc:
                log.warning("%s: tending %s failed: %s", self.node, handover.reservation, exc)
                unread.append(handover)
        unseen = decide_unseen_launch({h.job_id for h in handovers}, launching) if unread else None
        if unseen is not None and not any(d.refuse for d in done):
            self._refuse_in_prolog(unread[0], unseen.refuse)
            done.append(unseen)
        if refusals and not any(d.refuse for d in done):
            try:
                self._lift_refusal(refusals)
            except SlurmError as exc:
                log.warning("%s: the refusal's drain not lifted yet: %s", self.node, exc)
        return done

    def _refuse_in_prolog(self, h: OpenHandOver, job_id: str) -> None:
        """Drain the spare with Medic's reason, recorded before Slurm is asked, so that the
        drain the prolog's failure brings stays Medic's to lift (a drain already there, an
        admin's or another episode's, is kept as it is and never lifted by a refusal)."""
        reason = format_reason(REFUSAL_FAULT, f"job:{h.job_id}", f"refused job {job_id}")
        book = DrainBook.of(self.store)
        try:
            outcome = drain_if_allowed(self.slurm, self.node, reason, book, actor=SPARES)
            said = outcome.value
        except SlurmError as exc:  # the refusal stands: the prolog fails all the same
            outcome, said = None, f"not drained: {str(exc).strip().splitlines()[0][:200]}"
        drained = outcome is DrainOutcome.DRAINED
        self._event(h.spare, Severity.WARN, f"job {job_id} refused in its prolog on spare"
                    f" {h.spare}, handed to job {h.job_id} ({said})",
                    action=REFUSED_JOB, job_id=h.job_id, spare=h.spare,
                    reservation=h.reservation, by=self.node, actor=ACTOR, refused=job_id,
                    drained=drained, reason=as_slurm_stores(reason))  # fmt: skip

    def _lift_refusal(self, refusals: Sequence[dict[str, object]]) -> None:
        """Lift the refusal's drain once no refused job is on the spare
        (remediation.decide_spares.decide_refusal_lift), through the one resume path."""
        reason = str(refusals[0].get("reason") or "")
        info = self.slurm.node(self.node)
        matches = info is not None and (info.drained or info.down) and info.reason == reason
        refused = [str(r.get("refused") or "") for r in refusals]
        states = [(j.state, tuple(_nodes(j.nodes))) for j in self.slurm.jobs(refused)]
        why = decide_refusal_lift(states, self.node, matches)
        if why and matches:
            return  # the refused job is still in its prolog or being requeued
        outcome = "its drain is no longer the refusal's: left as it is"
        if matches:
            book = DrainBook.of(self.store)
            note = f"refused job(s) {', '.join(refused)} off the spare"
            outcome = give_back(self.slurm, book, self.node, actor=SPARES, note=note).text
        self._event(self.node, Severity.INFO, f"spare {self.node}: the refusal's drain: {outcome}",
                    action=REFUSAL_LIFTED, job_id=str(refusals[0].get("job_id") or ""),
                    by=self.node, actor=ACTOR, refused=refused)  # fmt: skip

    def watching(self) -> bool:
        """This node may be handed any moment, or is handed: its daemon's ladder loops at
        its busy pace, so another job on the spare is refused sooner."""
        return _next_look.get(self.node) == 0.0

    def _tend_one(
        self, h: OpenHandOver, launching: str = "", refused: Collection[str] = ()
    ) -> SpareTending:
        evidence = {"job_id": h.job_id, "spare": h.spare, "reservation": h.reservation,
                    "by": self.node, "actor": ACTOR}  # fmt: skip
        if not self.slurm.reservation_exists(h.reservation):
            gone = SpareTending((), (), False, f"{h.reservation} is gone (purged by Slurm)")
            self._event(h.spare, Severity.INFO, f"spare {h.spare} given back: {gone.why}",
                        action=GIVEN_BACK, **evidence)  # fmt: skip
            return gone
        moved = h.action != HANDING or dt.datetime.now(dt.UTC) - h.at > MOVE_GRACE
        jobs = self.slurm.reservation_jobs(h.reservation)
        decision = decide_spare_tending(
            h.job_id,
            h.spare,
            jobs,
            moved=moved,
            launching=launching,
            refused=refused,
            in_prolog=self._maybe_in_prolog(h, jobs),
        )
        if decision.refuse:  # before anything else: the job's prolog is waiting for it
            self._refuse_in_prolog(h, decision.refuse)
            try:  # the refusal stands whatever else fails: the next loop tries the rest
                return self._carry_out(h, decision, evidence)
            except SlurmError as exc:
                log.warning("%s: tending %s failed: %s", self.node, h.reservation, exc)
                return decision
        return self._carry_out(h, decision, evidence)

    def _maybe_in_prolog(self, h: OpenHandOver, jobs: Sequence[ReservedJob]) -> set[str]:
        """Other jobs seen started on the spare for less than `prolog_grace`."""
        now = time.monotonic()
        started = {(h.reservation, j.job_id) for j in jobs
                   if j.job_id != h.job_id and j.state != "PENDING"}  # fmt: skip
        for key in [k for k in _started_seen if k[0] == h.reservation and k not in started]:
            del _started_seen[key]
        for key in started:
            _started_seen.setdefault(key, now)
        return {job for (name, job), at in _started_seen.items()
                if name == h.reservation and now - at < self.prolog_grace}  # fmt: skip

    def _carry_out(
        self, h: OpenHandOver, decision: SpareTending, evidence: dict[str, str]
    ) -> SpareTending:
        # Requeued before it is cleared: a crash in between leaves it pending in the
        # reservation (cleared at the next loop), never running on the spare unseen.
        for job_id in decision.requeue:
            note = "requeued"
            try:
                self.slurm.requeue(job_id)
            except SlurmError as exc:  # --no-requeue: it may not keep the spare either
                still = self.slurm.reservation_jobs(h.reservation)
                if any(j.job_id == job_id and j.state != "PENDING" for j in still):
                    self.slurm.cancel(job_id)
                    note = f"cancelled (not requeued: {exc})"
                else:
                    note = "left the spare meanwhile"
            self._event(h.spare, Severity.WARN, f"job {job_id} refused on spare {h.spare},"
                        f" handed to job {h.job_id}: {note}", action=REFUSED_JOB,
                        **{**evidence, "refused": job_id})  # fmt: skip
        for job_id in decision.unbind:
            self.slurm.unbind(job_id)
            if job_id not in (h.job_id, decision.refuse, *decision.requeue):
                self._event(h.spare, Severity.WARN, f"job {job_id} refused on spare {h.spare},"
                            f" handed to job {h.job_id}: cleared of {h.reservation}",
                            action=REFUSED_JOB, **{**evidence, "refused": job_id})  # fmt: skip
        if decision.delete:
            self.slurm.delete_reservation(h.reservation)
            action = RELEASED if h.job_id in decision.unbind else GIVEN_BACK
            self._event(h.spare, Severity.INFO, f"spare {h.spare}: {decision.why}",
                        action=action, **evidence)  # fmt: skip
        return decision

    def _take_out_of_pool(self, spare: str) -> None:
        name = self.settings.reservation
        rest = [n for n in self.slurm.reservations().get(name, ()) if n != spare]
        if rest:
            self.slurm.set_reservation_nodes(name, rest)
        else:
            self.slurm.delete_reservation(name)

    # ---- refill --------------------------------------------------------------------------

    def wants(self, node: str) -> str:
        """Why `node` may not join the pool now ("" if it may): pool off, not listed,
        already in, or the pool is full."""
        if self.settings.size <= 0:
            return "no spare pool"
        if self.settings.nodes and node not in self.settings.nodes:
            return "not listed in [remediation.spares] nodes"
        held = self.slurm.reservations()
        pool = held.get(self.settings.reservation, ())
        if node in pool:
            return "already a spare"
        if any(node in nodes for nodes in held.values()):
            return "in another reservation"
        if len(pool) >= self.settings.size:
            return f"the pool is full ({len(pool)}/{self.settings.size})"
        return ""

    def join(self, node: str, deep: Callable[[], Sequence[Finding]]) -> str:
        """`node` joins the pool if the pool wants it and it passes the deep tier (`deep`);
        then Medic's drain on it is lifted (inside the reservation). "" when it did not
        join: the caller gives the node back as usual."""
        why = self.wants(node)
        if why:
            return ""
        blocking = [f for f in deep() if f.status in (Status.CRITICAL, Status.UNKNOWN)]
        if blocking:
            first = blocking[0]
            self._event(node, Severity.WARN, f"{node} not taken as a spare: deep tier"
                        f" {first.status.value}: {first.check} {first.message}",
                        action="refused", check=first.check)  # fmt: skip
            return ""
        name = self.settings.reservation
        pool = list(self.slurm.reservations().get(name, ()))
        if pool:
            self.slurm.set_reservation_nodes(name, [*pool, node])
        else:
            self.slurm.create_reservation(
                name, node, self.settings.hold_days * 24 * 60, invoking_user()
            )
        book = DrainBook.of(self.store)  # called at the ladder's give-back of its episode
        outcome = give_back(self.slurm, book, node, actor=SPARES, resolving_its_episode=True).text
        self._event(node, Severity.INFO, f"{node} joined the spare pool {name} after the deep"
                    f" tier ({len(pool) + 1}/{self.settings.size}); {outcome}", action=JOINED,
                    pool=[*pool, node])  # fmt: skip
        _next_look[node] = 0.0  # may be handed from now on: watched every loop
        return f"joined the spare pool {name}; {outcome}"


def idle_in_service(node: NodeInfo | None) -> bool:
    return node is not None and node.state == "IDLE" and not node.drained and not node.down


def _nodes(hostlist: str) -> list[str]:
    try:
        return expand_hostlist(hostlist) if hostlist else []
    except ValueError:
        return []
