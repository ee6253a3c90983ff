"""The decision core: pure functions, state in, decision out. Every path that touches a
node (the daemon's fault response, the prolog's refusal, the HealthCheckProgram, the sweep,
the epilog, the CLI) asks here and goes through the same rails: the drain cap, the pause,
ownership of drains (Medic only resumes what Medic drained, judged on the reason Slurm
stores) and a resilient job's restart budget.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from medic_core.drain_book import as_recorded
from medic_core.drain_reason import format_reason, is_not_a_fault_reason
from medic_core.settings import HookSettings
from medic_core.slurm import NodeInfo
from medic_core.status import Status
from medic_core.status import worst as worst_status
from medic_core.vocabulary import Component, ComponentKind, Finding, Recommendation, Verdict
from remediation.policy import Rung, drain_cap, first_rung

# A handed spare refusing another job in its prolog (remediation.spares): about the
# allocation, not the node's health, so the drain cap never keeps it in service.
SPARE_REFUSAL = "spare.handed"


@dataclass(frozen=True)
class GateDecision:
    allow: bool
    status: Status
    blocking: tuple[Finding, ...] = field(default=())
    why: str = ""

    @property
    def first(self) -> Finding | None:
        return self.blocking[0] if self.blocking else None


def decide_launch(
    verdict: Verdict,
    settings: HookSettings,
    *,
    rma_open: Sequence[int] = (),
    cap_held: str = "",
    isolated_gpus: Collection[int] = (),
) -> GateDecision:
    """May a job start here? Never with an open RMA ticket (whatever Slurm shows); CRITICAL
    never, unless the drain cap keeps the fault in service (`cap_held`, its reason: a
    refusal would have Slurm drain the node past the cap, "Prolog error"); UNKNOWN only
    with on_unknown = "open". Findings on a GPU Medic took out of the node's GRES
    (`isolated_gpus`, from its isolation record: no job can be given it) are left out. A
    handed spare's refusal of another job (SPARE_REFUSAL) always refuses."""
    if rma_open:
        why = f"RMA ticket {rma_open[0]} is open"
        ticket = Finding("rma", Status.CRITICAL, "rma.open", "", why, Recommendation.DRAIN)
        return GateDecision(False, Status.CRITICAL, (ticket,), why)
    findings = tuple(f for f in verdict.findings if not on_gpus(f, isolated_gpus))
    if len(findings) < len(verdict.findings):
        status = worst_status(f.status for f in findings) if findings else Status.OK
        verdict = Verdict(status, findings, verdict.source, verdict.seconds, verdict.note)
    critical = tuple(f for f in verdict.findings if f.status is Status.CRITICAL)
    refusals = tuple(f for f in critical if f.fault_class == SPARE_REFUSAL)
    if refusals:  # the spare is already drained by Medic for it: no cap to keep
        return GateDecision(False, Status.CRITICAL, refusals, refusals[0].message)
    if critical and cap_held:
        return GateDecision(
            True, Status.CRITICAL, critical, f"fault left in service by the drain cap: {cap_held}"
        )
    if critical:
        return GateDecision(False, Status.CRITICAL, critical, "CRITICAL fault on this node")
    unknown = tuple(f for f in verdict.findings if f.status is Status.UNKNOWN)
    if unknown and settings.on_unknown == "closed":
        return GateDecision(
            False, Status.UNKNOWN, unknown, "a launch check could not tell (on_unknown=closed)"
        )
    return GateDecision(True, verdict.status, (), "")


def on_gpus(finding: Finding, gpus: Collection[int]) -> bool:
    """The finding is on one of these GPUs (its target is that index)."""
    t = finding.target
    return bool(gpus) and t.isascii() and t.isdigit() and int(t) in gpus


# --- a fault on a node: drain, requeue, episode, pause ----------------------------------------

# Job states in which a job still runs on the node (COMPLETING: already on its way out).
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING"})
# ...and those whose processes may still hold its GPUs (a GPU reset waits for them).
HOLDING_STATES = RUNNING_STATES | {"COMPLETING", "SUSPENDED", "STOPPED"}
LEDGER_TAG = "medic-ledger:"
LEDGER_KEYS_KEPT = 8


@dataclass(frozen=True)
class Ledger:
    """A resilient job's restarts that Medic charged, kept in the job's AdminComment (only
    admins and Slurm can write it, it travels with the job across nodes and requeues):
    `medic-ledger:restarts=N;charged=KEY,KEY`. Slurm's own restart count also counts a
    prolog refusal (the job never ran a step), so the budget is counted here instead."""

    restarts: int = 0
    charged: tuple[str, ...] = ()

    @classmethod
    def parse(cls, admin_comment: str) -> Ledger:
        at = admin_comment.rfind(LEDGER_TAG)
        words = admin_comment[at + len(LEDGER_TAG) :].split() if at >= 0 else []
        if not words:
            return cls()
        fields = dict(p.split("=", 1) for p in words[0].split(";") if "=" in p)
        count = fields.get("restarts", "0")
        restarts = int(count) if count.isascii() and count.isdigit() else 0
        charged = tuple(k for k in fields.get("charged", "").split(",") if k)
        return cls(min(restarts, 10_000), charged[-LEDGER_KEYS_KEPT:])

    def charge(self, key: str) -> Ledger:
        if key in self.charged:
            return self
        return Ledger(self.restarts + 1, (*self.charged, key)[-LEDGER_KEYS_KEPT:])

    def text(self) -> str:
        return f"{LEDGER_TAG}restarts={self.restarts};charged={','.join(self.charged)}"


@dataclass(frozen=True)
class JobFacts:
    job_id: str
    state: str
    budget: int | None  # N of `medic:resilient=N`; None: not resilient
    requeue: bool  # Slurm will requeue it (Requeue=1)
    pinned: bool  # `-w` names this node: requeued, it would wait for it for ever
    ledger: Ledger = Ledger()
    slurm_restarts: int = 0  # Slurm's own count (prolog refusals too): for the releaser
    # The GPU indices the job holds on this node (Slurm's GRES index); None: not known (no
    # GRES, an unreadable entry), so the job counts as holding every GPU.
    gpus: frozenset[int] | None = None

    def holds(self, component: Component) -> bool:
        """A fault on `component` touches this job: a GPU it holds (or may hold), the job
        itself, or anything of the host's or the fabric's."""
        if component.kind is ComponentKind.JOB:
            return component.name == self.job_id
        index = component.gpu_index
        if index is None:
            return True
        return self.gpus is None or index in self.gpus


def jobs_hit(
    component: Component, jobs: Sequence[JobFacts], node_wide: bool
) -> tuple[JobFacts, ...]:
    """The jobs a fault on `component` touches. A repair that takes the whole node
    (`node_wide`: a driver reload, a reboot) touches every job on it; otherwise a GPU's
    fault touches only the jobs holding that GPU, a job's fault only that job, and a host or
    fabric fault every job."""
    if node_wide and component.kind is not ComponentKind.JOB:
        return tuple(jobs)
    return tuple(j for j in jobs if j.holds(component))


def decide_reset_beside_jobs(
    gpu: int | None,
    jobs: Sequence[JobFacts] | None,
    *,
    enabled: bool,
    whole_node_checks: Sequence[str] = (),
) -> str:
    """Why a GPU's reset on a drained node with jobs still running must wait for all of
    them to end ("" when it may go now, beside them). NVIDIA resets one GPU while the
    others run work; a job on the node's other GPUs is not touched by it, so only the jobs
    holding that GPU (Slurm's allocation; a job whose GPUs are unknown holds them all) hold
    the reset up. `whole_node_checks`: what re-qualification after it runs (a deep tier, a
    burn-in) when that is more than the GPU's own checks: it needs the whole node."""
    if not enabled:
        return "gpu_reset_in_service is off"
    if gpu is None:
        return "not a single GPU's fault"
    if whole_node_checks:
        return f"re-qualification runs {', '.join(whole_node_checks)} on the whole node"
    if jobs is None:
        return "the jobs' GPUs are not known (Slurm did not answer)"
    present = [j for j in jobs if j.state in HOLDING_STATES]
    holders = jobs_hit(Component(ComponentKind.GPU, str(gpu)), present, node_wide=False)
    if holders:
        return f"GPU {gpu} is held by job {', '.join(j.job_id for j in holders)}"
    return ""


@dataclass(frozen=True)
class NodeFacts:
    """What Slurm stores about the node (the one truth every node can read), and whether
    Medic's drain records hold its drain (medic_core.drain_book)."""

    known: bool = True
    drained: bool = False
    down: bool = False
    reason: str = ""
    # An open drain record of Medic's matches what Slurm shows (node out, the same reason):
    # True; the records were read and none does: False; neither the store nor the journal
    # could tell: None (the reason's prefix then decides drains, never a resume).
    recorded: bool | None = None
    held: str = ""  # the record waits for a human (a needs-human episode closed): why
    drain_episode: int | None = None  # the episode the record's drain was made for

    @property
    def owner(self) -> str:
        """Whose the node's out-of-service reason is: "medic", "other" or "" (in service,
        or out of service without a word of why). "medic" only with a record, or, while
        the records are unreachable, for a reason with Medic's prefix."""
        if not (self.drained or self.down) or not self.reason:
            return ""
        if self.recorded is None:
            return "medic" if self.reason.startswith("medic: ") else "other"
        return "medic" if self.recorded else "other"


@dataclass(frozen=True)
class Rails:
    """The fleet's rails, each a reason when it holds, "" when it does not."""

    paused: str = ""  # repairs paused by a human (drains and requeues go on)
    cap: str = ""  # the drain cap is reached in one of the node's partitions
    signature: str = ""  # the same fault on many nodes at once: pause repairs


@dataclass(frozen=True)
class FaultFacts:
    node: str
    slurm: NodeFacts
    jobs: tuple[JobFacts, ...] = ()
    rails: Rails = Rails()
    open_episode: int | None = None  # the node's open episode, joined by any new fault
    handed_over: int | None = None  # the same fault's episode just closed (human, RMA)
    lemon: str = ""  # why the faulty part is a lemon (remediation.policy.LemonScore), "" if not
    # Why the part is latched (remediation.policy.StrikeScore: it came back by itself too
    # often), "" if not: a standing fault, the node kept out for a human.
    strikes: str = ""
    enabled: bool = True  # [remediation] enabled
    requeue_resilient: bool = True  # [hooks] requeue_resilient
    first_rung: Mapping[str, str] = field(default_factory=dict)  # [remediation] first_rung
    # The same daemon answers this fault again because Slurm failed its first answer (its
    # job actions did not happen): a handed-over episode does not make them stand.
    answer_again: bool = False
    # [remediation] max_restarts: the most restarts a job's comment may ask for (None: no
    # cap); a job asking more gets the cap, and its AdminComment says so.
    max_restarts: int | None = None


class EpisodeMove(StrEnum):
    NONE = "none"  # no episode (restart_app, report only)
    JOIN = "join"
    OPEN = "open"


@dataclass(frozen=True)
class JobDecision:
    job_id: str
    action: str  # requeue, not_resilient, budget_spent, pinned, cap, left
    note: str  # for the job's AdminComment and the event
    ledger: Ledger | None = None  # the job's ledger after a requeue charged it
    slurm_restarts: int = 0


@dataclass(frozen=True)
class FaultDecision:
    drain: bool
    reason: str  # Medic's drain reason for the fault
    why: str
    episode: EpisodeMove
    episode_id: int | None = None  # joined
    state: str = ""  # of the episode opened
    rung: Rung | None = None
    pause: str = ""  # set the fleet-wide pause with this reason
    jobs: tuple[JobDecision, ...] = ()
    # The recommendation the episode acts on: the finding's, or its follow-up (XID 94: the
    # application restarts now, the GPU is reset once the node is idle).
    recommendation: Recommendation | None = None

    @property
    def requeued(self) -> tuple[str, ...]:
        return tuple(j.job_id for j in self.jobs if j.action == "requeue")


# Episode states (the same words as remediation.episodes; kept here so this stays pure).
WAITING_IDLE = "waiting_idle"
VERIFYING = "verifying"
PAUSED = "paused"
NEEDS_HUMAN = "needs_human"
WAITING_CAP = "waiting_cap"


def primary(findings: Sequence[Finding]) -> Finding:
    """The finding a response is about: the most severe, then the strongest remedy."""
    return max(findings, key=lambda f: (f.status.severity, RECOMMENDATION_WEIGHT[f.recommendation]))


RECOMMENDATION_WEIGHT = {r: i for i, r in enumerate(Recommendation)}


def fault_key(slurm_restarts: int) -> str:
    """What one charge is for: the job's run, as Slurm counts its runs. Every fault and
    every node that would restart the same run (two findings of one fault, two nodes of a
    multi-node job) charge it once; the run after a requeue is a new one, so a fault that
    recurs there is charged again."""
    return f"run{slurm_restarts}"


def decide_fault(findings: Sequence[Finding], facts: FaultFacts) -> FaultDecision:
    """A fresh fault on `facts.node`: whether to drain it, which jobs to requeue, what the
    ladder's episode becomes. The same answer whichever path saw the fault."""
    first = primary(findings)
    rec = first.recommendation
    reason = format_reason(first.fault_class or first.check, first.target, first.message)
    restarts: tuple[JobDecision, ...] | None = None
    if _restarts_app(first):
        # The application must restart: requeue the jobs on the faulty GPU (every job for a
        # host fault). The node is fine (no drain, no episode) unless the catalog names a
        # follow-up, which goes on as a fault of its own.
        # Only the findings that restart an application name whose: another GPU's warning
        # reported in the same answer restarts nothing.
        hit = _hit([f for f in findings if _restarts_app(f)], facts, node_wide=False)
        restarts = _jobs(facts, hit, first, reason, keep_running=False)
        word = first.evidence.get("follow_up")
        follow_up = Recommendation.parse(word) if word else Recommendation.NONE
        if follow_up in (Recommendation.NONE, Recommendation.RESTART_APP):
            return FaultDecision(
                False, reason, "restart the application", EpisodeMove.NONE, jobs=restarts
            )
        rec = follow_up
    if rec is Recommendation.NONE and first.status is not Status.CRITICAL:
        return FaultDecision(False, reason, "report only", EpisodeMove.NONE)
    # Drain: never over another's reason, never past the cap (a node already Medic's
    # stays Medic's: re-asserting it costs no cap).
    owner = facts.slurm.owner
    capped = bool(facts.rails.cap) and owner != "medic"
    drain = facts.slurm.known and owner == "" and not capped
    # Running jobs finish untouched (DRAINING): a reset once idle, a rising trend.
    when_idle = rec in (Recommendation.GPU_RESET_WHEN_IDLE, Recommendation.DRAIN_AFTER_JOB)
    # Requeue only off a node that will not run it again: drained now, or already out.
    out = drain or owner != ""
    # Which jobs the fault touches: those on the faulty GPU, unless the repair takes the
    # whole node (a driver reload, a reboot: XID 79), which stops every job on it.
    start = first_rung(first.fault_class, rec.value, facts.first_rung)
    hit = _hit(findings, facts, node_wide=start in (Rung.DRIVER_RELOAD, Rung.REBOOT))
    if facts.open_episode is not None:
        episode, episode_id, state, rung = EpisodeMove.JOIN, facts.open_episode, "", None
        why = f"joins episode {facts.open_episode}"
    elif facts.handed_over is not None:
        # The same fault reported twice (a sweep and the node's daemon): the first
        # report's job actions stand; the drain is decided again from what Slurm shows
        # (already Medic's, past the cap, or put back in service by a human meanwhile).
        why = f"joins episode {facts.handed_over} (handed over)"
        again = _jobs(facts, hit, first, reason, keep_running=not out) if facts.answer_again else ()
        return FaultDecision(
            drain, reason, why, EpisodeMove.JOIN, facts.handed_over, jobs=() if when_idle else again
        )
    else:
        episode, episode_id = EpisodeMove.OPEN, None
        rung = first_rung(first.fault_class, rec.value, facts.first_rung)
        state, why = WAITING_IDLE, f"starts at {rung.word}" if rung else ""
        if not facts.enabled:
            state, why = NEEDS_HUMAN, "remediation disabled in [remediation] enabled"
        elif facts.strikes:
            state, why = NEEDS_HUMAN, f"latched, a standing fault: {facts.strikes}"
        elif rec is Recommendation.RECHECK:  # a link that may come back: re-check it
            state, why = VERIFYING, "re-checked until it recovers, then a human"
        elif rung is None:
            state, why = NEEDS_HUMAN, f"no ladder rung for {rec.value!r}: a human looks"
        elif facts.lemon:
            rung, why = Rung.RMA, f"lemon: {facts.lemon}"
        if owner == "other":
            state, why = NEEDS_HUMAN, f"drained by someone else ({facts.slurm.reason}): kept"
        elif capped:
            state, why = WAITING_CAP, facts.rails.cap
        elif state in (WAITING_IDLE, VERIFYING) and (facts.rails.paused or facts.rails.signature):
            state, why = PAUSED, facts.rails.signature or facts.rails.paused
    jobs: tuple[JobDecision, ...] = ()
    if restarts is not None:
        jobs = restarts
    elif not when_idle:
        jobs = _jobs(facts, hit, first, reason, keep_running=not out)
    elif app_restarts := [f for f in findings if _restarts_app(f)]:
        # Running jobs finish untouched, except those whose application must restart (an
        # XID 94 reported with the pending remap it left: one answer, both findings).
        app = primary(app_restarts)
        why_app = format_reason(app.fault_class or app.check, app.target, app.message)
        jobs = _jobs(facts, _hit(app_restarts, facts, False), app, why_app, keep_running=False)
    return FaultDecision(
        drain=drain,
        reason=reason,
        why=why,
        episode=episode,
        episode_id=episode_id,
        state=state,
        rung=rung,
        pause=facts.rails.signature if episode is EpisodeMove.OPEN else "",
        jobs=jobs,
        recommendation=rec,
    )


def _restarts_app(finding: Finding) -> bool:
    return (
        finding.recommendation is Recommendation.RESTART_APP
        and finding.status is not Status.CRITICAL
    )


def _hit(findings: Sequence[Finding], facts: FaultFacts, node_wide: bool) -> tuple[JobFacts, ...]:
    """The node's jobs that any of the fault's findings touches (`jobs_hit`)."""
    hit = {
        job.job_id
        for finding in findings
        for job in jobs_hit(finding.component, facts.jobs, node_wide)
    }
    return tuple(j for j in facts.jobs if j.job_id in hit)


def capped_budget(asked: int, max_restarts: int | None) -> int:
    return asked if max_restarts is None else min(asked, max_restarts)


def _jobs(
    facts: FaultFacts,
    jobs: Sequence[JobFacts],
    first: Finding,
    reason: str,
    keep_running: bool,
) -> tuple[JobDecision, ...]:
    node = facts.node
    what = reason.removeprefix("medic: ")
    out = []
    for job in jobs:
        if job.state not in RUNNING_STATES:
            continue
        key = fault_key(job.slurm_restarts)
        budget = capped_budget(job.budget, facts.max_restarts) if job.budget is not None else None
        capped = (
            f" (asked {job.budget}, capped by [remediation] max_restarts)"
            if budget is not None and job.budget is not None and budget < job.budget
            else ""
        )
        if job.budget is None or not job.requeue:
            note = f"medic: {node} {what}; not resilient, not requeued"
            out.append(JobDecision(job.job_id, "not_resilient", note))
        elif keep_running:
            why = facts.rails.cap or "the node stays in service"
            note = f"medic: {node} {what}; not requeued: {why}"
            out.append(JobDecision(job.job_id, "cap", note))
        elif not facts.requeue_resilient:
            note = f"medic: {node} {what}; requeue_resilient is off"
            out.append(JobDecision(job.job_id, "left", note))
        elif budget is not None and key not in job.ledger.charged and job.ledger.restarts >= budget:
            note = (
                f"medic: restart budget spent ({job.ledger.restarts}/{budget}{capped});"
                f" {node} fault left to the job"
            )
            out.append(JobDecision(job.job_id, "budget_spent", note))
        else:
            ledger = job.ledger.charge(key)
            note = (
                f"medic: requeued off {node} ({first.fault_class});"
                f" restart {ledger.restarts}/{budget}{capped}"
            )
            if job.pinned:  # -w names the node: it waits until Medic gives the node back
                note += f"; the job asks for {node} (-w) and waits for it: resubmit without"
            out.append(JobDecision(job.job_id, "requeue", note, ledger, job.slurm_restarts))
    # Every note replaces the job's AdminComment (carry_out): one that is not a requeue
    # carries the ledger too, or the restarts charged so far are forgotten and spent again.
    ledgers = {job.job_id: job.ledger for job in jobs}
    return tuple(
        d
        if d.action == "requeue" or ledgers[d.job_id] == Ledger()
        else JobDecision(d.job_id, d.action, f"{d.note} {ledgers[d.job_id].text()}")
        for d in out
    )


def cap_reason(
    nodes: Sequence[NodeInfo],
    node: str,
    share: float,
    minimum: int,
    pending: Collection[str] = (),
    records: Mapping[str, str | None] | None = None,
) -> str:
    """Why draining `node` would pass the drain cap in one of its partitions ("" if it
    would not). Medic's drains are counted from its drain records where the store holds a
    node's (`records`: Store.drain_holdings, the open record's reason or None), else from
    the reasons Slurm stores, the one truth every node can read whatever the store (a node
    keeping a store of its own); `pending` adds nodes admitted a moment ago whose drain
    Slurm does not show yet. A burn-in or user_problem drain (never a hardware fault) does
    not count."""
    held = records or {}

    def medics(n: NodeInfo) -> bool:
        if n.name in held:
            recorded = held[n.name]
            return recorded is not None and as_recorded(n.reason, recorded)
        return n.reason.startswith("medic: ")

    me = next((n for n in nodes if n.name == node), None)
    if me is None:
        return ""
    for partition in me.partitions or ("",):
        members = [n for n in nodes if partition in n.partitions or not partition]
        cap = drain_cap(len(members), share, minimum)
        ours = {
            n.name
            for n in members
            if n.name != node
            and (n.drained or n.down)
            and medics(n)
            and not is_not_a_fault_reason(n.reason)
        }
        ours |= {n.name for n in members if n.name in pending and n.name != node}
        if len(ours) >= cap:
            return (
                f"drain cap reached in partition {partition or '-'}: {len(ours)} of"
                f" {len(members)} nodes drained by Medic (cap {cap}); left in service"
            )
    return ""


# --- Slurm's own drains, adopted ----------------------------------------------------------------

# The reasons slurmctld itself puts on a node, as it stores them (22.05-26.05), and what each
# becomes when Medic adopts it: its fault class, NVIDIA-style word and the `[remediation]
# adopt` name that switches it on. "Kill task failed": a step's processes did not die within
# UnkillableStepTimeout (a hung GPU or file system; only a reboot frees them). "Node
# unexpectedly rebooted": it came back from a reboot nobody asked for (ReturnToService=1):
# re-qualified (and burnt in per after_reboot) before it returns. "Not responding": slurmd
# did not answer; once it does, re-qualified.
SLURM_DRAINS: Mapping[str, tuple[str, str, Recommendation]] = {
    "Kill task failed": ("kill_task_failed", "slurm.kill_task_failed", Recommendation.REBOOT),
    "Node unexpectedly rebooted": (
        "unexpected_reboot", "slurm.unexpected_reboot", Recommendation.RECHECK,
    ),
    "Not responding": ("not_responding", "slurm.not_responding", Recommendation.RECHECK),
}  # fmt: skip
ADOPTABLE = tuple(name for name, _, _ in SLURM_DRAINS.values())


@dataclass(frozen=True)
class AdoptDecision:
    adopt: bool
    why: str
    finding: Finding | None = None  # the fault the adopted drain stands for


def decide_adopt(
    node: NodeFacts, *, enabled: Collection[str], open_episode: int | None
) -> AdoptDecision:
    """Whether Medic takes over the drain Slurm put on this node itself: only one of
    SLURM_DRAINS, switched on in `enabled`, on a node no record of Medic's holds and no
    episode of Medic's is about. From then on it is Medic's: recorded, repaired and given
    back through the ladder like its own. An admin's drain, whatever its text, is never
    one of Slurm's reasons and is never adopted; with the records unreachable Medic cannot
    tell whose the drain is and leaves it."""
    if not node.known or not (node.drained or node.down):
        return AdoptDecision(False, "in service")
    if node.recorded is None:
        return AdoptDecision(False, "Medic's drain records are unreachable")
    if node.recorded:
        return AdoptDecision(False, "already Medic's drain")
    if open_episode is not None:
        return AdoptDecision(False, f"episode {open_episode} is open")
    entry = SLURM_DRAINS.get(node.reason)
    if entry is None:
        return AdoptDecision(False, f"not one of Slurm's own drains: {node.reason!r}")
    name, fault_class, rec = entry
    if name not in enabled:
        return AdoptDecision(False, f"[remediation] adopt leaves {name} to a human")
    finding = Finding(
        "slurm", Status.CRITICAL, fault_class, "",
        f"Slurm put the node out ({node.reason!r}): adopted by Medic", rec,
        evidence={"slurm_reason": node.reason, "adopted": name},
    )  # fmt: skip
    return AdoptDecision(True, f"adopts Slurm's {node.reason!r}", finding)
