"""What the hooks and the daemon do to Slurm once a decision is made: drain with Medic's
reason, release a job Medic's gate got held, requeue resilient jobs off a faulty node, and
record each of these as an event. Every Slurm call goes through the Slurm client (argv,
timeout); a failure is logged with Slurm's own message and never raised into a hook.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medic_core import proc
from medic_core.api import HealthdUnavailable, ask
from medic_core.config import ConfigError, MedicConfig
from medic_core.drain_reason import (
    DrainOutcome,
    drain_if_allowed,
    format_reason,
    take_over_drain,
)
from medic_core.resilient import parse_resilient
from medic_core.settings import HookSettings, RemediationSettings
from medic_core.slurm import CliSlurm, JobInfo, SlurmClient, SlurmError, expand_hostlist
from medic_core.vocabulary import Finding, Verdict
from remediation.decide import (
    FaultDecision,
    FaultFacts,
    GateDecision,
    JobFacts,
    Ledger,
    NodeFacts,
    Rails,
    cap_reason,
    decide_fault,
)
from remediation.observe import EventSink, Observer, ObservingSlurm, observer_of, would_refuse

if TYPE_CHECKING:
    import datetime as dt

    from medic_core.drain_book import DrainBook
    from medic_core.store import Store

log = logging.getLogger("medic.hooks")


def slurm_env(config: MedicConfig) -> dict[str, str]:
    """Hooks get no PATH and HealthCheckProgram no SLURM_CONF: supply both."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    conf = config.table("slurm").get("conf") or os.environ.get("SLURM_CONF")
    if conf:
        env["SLURM_CONF"] = str(conf)
    return env


def slurm_client(
    config: MedicConfig,
    settings: HookSettings,
    *,
    actor: str = "hook",
    record: EventSink | None = None,
    observing: Callable[[], bool] | None = None,
) -> SlurmClient:
    """The Slurm client of every automatic action, and the one place observe-only mode is
    decided (remediation.observe): with `[remediation] observe_only` on, changes are
    recorded as what `actor` would have done (through `record`, else `record_event`) and not
    made. `observing`: read at every change (the daemon's, which reloads); without it, the
    configuration's setting now."""
    client = CliSlurm(env=slurm_env(config), timeout=settings.slurm_timeout)
    if observing is None:
        if not RemediationSettings.from_config(config).observe_only:
            return client
        observing = lambda: True  # noqa: E731 (a hook's configuration does not change)
    sink = record if record is not None else (lambda event: record_event(config, event))
    return ObservingSlurm(client, Observer(actor, sink, observing))


def observe_only(config: MedicConfig) -> bool:
    """`[remediation] observe_only`, for the books and gates that read it."""
    return RemediationSettings.from_config(config).observe_only


def drain_reason_for(finding: Finding) -> str:
    return format_reason(finding.fault_class or finding.check, finding.target, finding.message)


# --- recording -------------------------------------------------------------------------------


def record_event(config: MedicConfig, event: Mapping[str, Any]) -> None:
    """Write-ahead into the node's journal (medic_core.journal), then through the daemon
    (cheap: no database import in a hook), or straight into the store when the daemon is
    down; the journal entry is dropped once either took the event. When neither did (the
    store down or its disk full), the entry stays and is replayed, with its time, when the
    store is back (`replay_journal`). Recording never fails a hook: one line on stderr."""
    import datetime as dt

    from medic_core import journal

    at = dt.datetime.now(dt.UTC)
    try:
        entry: Path | None = journal.write_ahead(config.paths, config.node_name, event, at)
    except journal.JournalFull as exc:
        entry = None
        kept = f"not kept locally either ({exc})"
    try:
        ask(config.paths.socket, {"op": "event", **event}, timeout=2.0)
        why = ""
    except HealthdUnavailable as exc:
        why = str(exc)
    if why:
        try:
            from medic_core.store import open_configured_store

            with open_configured_store(config) as store:
                _add(store, config.node_name, at, event)
            why = ""
        except Exception as exc:  # the store is down too: the journal keeps it
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if not why:
        if entry is not None:
            journal.delivered(entry)
        return
    if entry is not None:
        kept = f"kept in {entry}, replayed when the store is back"
    print(f"medic: could not record {event.get('kind')}: {why}; {kept}", file=sys.stderr)


def _add(store: Store, node: str, at: dt.datetime, event: Mapping[str, Any]) -> None:
    from medic_core.journal import store_fields

    store.add_event(**store_fields(node, at, event, source="hook"))


def replay_journal(config: MedicConfig, limit: int = 1000) -> str:
    """Deliver what the journal kept into the store (the health check calls it every
    interval; cheap when there is nothing: one directory listing). One line, or ""."""
    from medic_core import journal

    if not journal.pending(config.paths):
        return ""
    try:
        from medic_core.store import open_configured_store

        store = open_configured_store(config)
    except Exception as exc:
        left = len(journal.pending(config.paths))
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"journal: {left} events wait for the store ({first})"
    with store:
        done = journal.replay(
            config.paths, lambda e: _add(store, e.node, e.at, e.event), limit=limit
        )
    line = f"journal: {done.delivered} events replayed into the store, {done.left} left"
    if done.stopped:
        line += f" ({done.stopped})"
    for aside in done.set_aside:
        line += f"; set aside {aside}"
    return line


def record_gate(config: MedicConfig, job_id: str, verdict: Verdict, decision: GateDecision) -> None:
    first = decision.first
    record_event(
        config,
        {
            "kind": "gate",
            "severity": "INFO" if decision.allow else "CRITICAL",
            "source": "prolog",
            "target": f"job:{job_id}",
            "fault_class": first.fault_class if first else "",
            "message": (
                f"job {job_id} allowed ({verdict.status.value})"
                + (f": {decision.why}" if would_refuse(decision) else "")
                + (f": {verdict.note}" if verdict.source == "skipped" else "")
                if decision.allow
                else f"job {job_id} refused: {first.message if first else decision.why}"
            ),
            "evidence": {
                "job_id": job_id,
                "allow": decision.allow,
                "status": verdict.status.value,
                "verdict_source": verdict.source,
                "would_refuse": would_refuse(decision),
                "seconds": round(verdict.seconds, 4),
                "note": verdict.note,
                "blocking": [f.__dict__ | {"status": f.status.value} for f in decision.blocking],
            },
        },
    )


# --- the prolog's refusal --------------------------------------------------------------------


def drain_through_core(
    client: SlurmClient,
    config: MedicConfig,
    findings: Sequence[Finding],
    book: DrainBook | None = None,
) -> tuple[FaultDecision, DrainOutcome | None]:
    """A hook's drain (the prolog's refusal, the HealthCheckProgram's backstop): the same
    decision core and rails as the daemon's, with the facts Slurm holds (cap) and Medic's
    drain records (owner; the drain is recorded before Slurm is asked); jobs are the
    daemon's to requeue, so none are touched here."""
    from medic_core.drain_book import HOOK, node_book

    book = book if book is not None else node_book(config)
    me = client.node(config.node_name)
    own = book.ownership(config.node_name, me) if me is not None and me.reason else None
    recorded = own.recorded if own is not None else False
    slurm = NodeFacts(True, me.drained, me.down, me.reason, recorded) if me else NodeFacts(False)
    cap = ""
    if slurm.known and slurm.owner == "":
        # Only a drain of our own can pass the cap, and the cap counts Medic's drains across
        # the node's partitions: that needs the whole node table, one node cannot tell. A
        # node already out (Medic's, an admin's) never reads it.
        remediation = RemediationSettings.from_config(config)
        cap = cap_reason(
            client.nodes(), config.node_name, remediation.max_drained_share, remediation.min_drained
        )
    facts = FaultFacts(node=config.node_name, slurm=slurm, rails=Rails(cap=cap))
    decision = decide_fault(findings, facts)
    drained = (
        drain_if_allowed(client, config.node_name, decision.reason, book, actor=HOOK)
        if decision.drain
        else None
    )
    return decision, drained


def refuse_launch(
    config: MedicConfig, settings: HookSettings, job_id: str, decision: GateDecision
) -> str:
    """Drain this node through the decision core and start the releaser; one line."""
    first = decision.first
    assert first is not None
    client = slurm_client(config, settings, actor="prolog")
    outcome = ""
    try:
        fault, drained = drain_through_core(client, config, decision.blocking)
        outcome = drained.value if drained else f"not drained: {fault.why or 'already out'}"
    except (SlurmError, ConfigError) as exc:
        print(f"medic-prolog: drain failed: {exc}", file=sys.stderr)
    if settings.release_held and job_id:
        restarts = os.environ.get("SLURM_JOB_RESTART_COUNT", "0")  # absent on a first run
        start_releaser(config, job_id, int(restarts) if restarts.isdigit() else 0)
    kept = f" (drain: {outcome})" if outcome else ""
    return f"{config.node_name} refused job {job_id}: {drain_reason_for(first)}{kept}"


def start_releaser(config: MedicConfig, job_id: str, restarts: int, requeued: bool = False) -> None:
    """A detached `python -m slurm_hooks.release`: it must outlive the prolog, which Slurm
    waits for before it requeues (and holds) the job, and a daemon a reboot stops.
    `requeued`: Slurm has already requeued the job (the daemon's requeue returned)."""
    log_dir = config.paths.state_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **slurm_env(config)}
    argv = ["--job", job_id, "--restarts", str(restarts), *(["--requeued"] if requeued else [])]
    proc.spawn(
        [sys.executable, "-m", "slurm_hooks.release", *argv],
        log_path=log_dir / f"release-{job_id}.log",
        env=env,
    )


# --- mid-job faults ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobAction:
    job_id: str
    action: str  # requeued, requeue_failed, and the decision core's: not_resilient, ...
    detail: str
    # When Slurm's requeue returned, before the job was made eligible again: the job's next
    # prolog can only come after it (medic report's isolated_at). None: no requeue was asked.
    at: dt.datetime | None = None


def job_facts(client: SlurmClient, node: str) -> list[JobFacts]:
    """The jobs on `node` as the decision core needs them. One job's odd text (a comment
    that is not a valid tag) makes that job not resilient, never stops the others."""
    return [job_fact(job, node) for job in client.jobs_on(node)]


def job_fact(job: JobInfo, node: str) -> JobFacts:
    """One job as the decision core needs it (see `job_facts`)."""
    try:
        required = set(expand_hostlist(job.required_nodes)) if job.required_nodes else set()
    except ValueError:
        required = set()
    return JobFacts(
        job_id=job.job_id,
        state=job.state,
        budget=parse_resilient(job.comment),
        requeue=job.requeue,
        pinned=node in required,
        ledger=Ledger.parse(job.admin_comment),
        slurm_restarts=job.restart_count,
        gpus=job.gpus_by_node.get(node),
    )


def carry_out(
    client: SlurmClient,
    node: str,
    decision: FaultDecision,
    after_requeue: Callable[[str, int], None] | None = None,
    *,
    book: DrainBook | None = None,
    episode_id: int | None = None,
) -> tuple[DrainOutcome | None, list[JobAction]]:
    """Do what the decision core decided: drain (Medic's reason, never over another's;
    recorded in `book` first, with the episode), requeue, and tell each job's owner why in
    its AdminComment (with the restart ledger)."""
    drained = None
    if decision.drain:
        drained = drain_if_allowed(
            client, node, decision.reason, book, actor="daemon", episode_id=episode_id
        )
    elif episode_id is not None and book is not None:
        take_over_drain(client, node, book, actor="daemon", episode_id=episode_id)
    actions: list[JobAction] = []
    observed = observer_of(client) is not None  # observe only: the requeues are recorded
    for job in decision.jobs:
        if job.action != "requeue":
            _comment(client, job.job_id, job.note)
            actions.append(JobAction(job.job_id, job.action, job.note))
            continue
        # The ledger first: a crash after the requeue must not let the restart go uncounted.
        ledger = job.ledger.text() if job.ledger is not None else ""
        _comment(client, job.job_id, f"{job.note} {ledger}".strip())
        try:
            client.requeue(job.job_id)
        except SlurmError as exc:
            actions.append(JobAction(job.job_id, "requeue_failed", str(exc)))
            continue
        requeued_at = dt.datetime.now(dt.UTC)
        note = job.note.removeprefix("medic: ")
        if observed:  # never requeued: nothing to make eligible, no spare to hand
            actions.append(JobAction(job.job_id, "would_requeue", note, requeued_at))
            continue
        if after_requeue is not None:
            after_requeue(job.job_id, job.slurm_restarts)
        actions.append(JobAction(job.job_id, "requeued", note, requeued_at))
    return drained, actions


def _comment(client: SlurmClient, job_id: str, text: str) -> None:
    try:
        client.set_admin_comment(job_id, text)
    except SlurmError as exc:
        log.warning("job %s: could not set the admin comment: %s", job_id, exc)
