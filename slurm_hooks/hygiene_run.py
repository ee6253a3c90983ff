"""The epilog's post-job hygiene (`[hygiene] enabled`): find what the ended job left
(slurm_hooks.hygiene), clean it within `[hygiene] budget`, and when something survives,
let the decision core (remediation.user_problem) drain the node as `user_problem`: recorded
as Medic's drain before Slurm is asked, what is left written to the node's hygiene record,
and a detached watcher started that gives the node back once it is clean
(slurm_hooks.hygiene_watch; the HealthCheckProgram does the same at each run).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medic_core import proc
from medic_core.config import MedicConfig
from medic_core.hygiene_settings import HygieneSettings
from slurm_hooks import hygiene as hy

if TYPE_CHECKING:
    from medic_core.slurm import SlurmClient

EVENT_KIND = "hygiene"


@dataclass(frozen=True)
class HygieneOutcome:
    found: hy.Leftovers
    left: hy.Leftovers
    line: str  # one line for the epilog's stderr (slurmd's log)
    drained: bool = False
    seconds: float = 0.0


def job_owner(env: Mapping[str, str], node: str) -> hy.JobOwner | str:
    """The ended job as slurmd names it to the epilog, or why it cannot be known."""
    job_id, uid = env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_UID", "")
    if not job_id.isdigit():
        return "SLURM_JOB_ID is not a job id"
    if not uid.isdigit():
        return "SLURM_JOB_UID is not set"
    return hy.JobOwner(job_id, int(uid), env.get("SLURM_JOB_USER", ""), node)


def other_jobs(
    config: MedicConfig, job: hy.JobOwner, client: SlurmClient | None = None
) -> bool | None:
    """Slurm shows another job of the user on this node (None: it cannot tell). slurmd's
    own view first (a live step's socket in its spool, as healthd.jobs reads it): with no
    other job there, no question to slurmctld; else slurmctld names those jobs' users."""
    from medic_core.settings import DaemonSettings
    from medic_core.slurm import SlurmError

    template = DaemonSettings.from_config(config).slurmd_spool_dir
    spool = Path(template.replace("%n", job.node).replace("{node}", job.node))
    prefix = f"{job.node}_"
    try:  # `<node>_<job>.<step>`: one per live step (as healthd.jobs reads it, without imports)
        steps = [n[len(prefix) :].split(".") for n in os.listdir(spool) if n.startswith(prefix)]
        here = {s[0] for s in steps if len(s) == 2 and s[0].isdigit() and s[1].isdigit()}
    except OSError:
        here = {"?"}  # cannot tell: ask slurmctld
    if not here - {job.job_id}:
        return False
    try:
        client = client if client is not None else slurm_reader(config)
        on_node = client.jobs_on(job.node)
    except SlurmError:
        return None
    return any(j.user == job.user and j.job_id != job.job_id for j in on_node)


def slurm_reader(config: MedicConfig) -> SlurmClient:
    from medic_core.settings import HookSettings
    from remediation.actions import slurm_client

    return slurm_client(config, HookSettings.from_config(config), actor="epilog")


def scope_of(job: hy.JobOwner, others: bool | None, settings: HygieneSettings) -> hy.Scope:
    alone = others is False and bool(job.user)
    return hy.Scope(
        job,
        by_user=alone and job.uid != 0 and job.uid >= settings.min_uid,
        user_files=alone and job.uid >= settings.min_uid,
    )


def clean(
    config: MedicConfig, settings: HygieneSettings, scope: hy.Scope, deadline: float
) -> tuple[hy.Leftovers, hy.Leftovers]:
    """(found, left) for this job."""
    proc_root, shm_root = settings.proc_root(config), settings.shm_root(config)
    uid = scope.job.uid
    spare = hy.ancestors(proc_root, os.getpid())
    processes = tuple(hy.find_processes(proc_root, scope, spare))
    shm = tuple(hy.find_shm(shm_root, uid)) if scope.user_files else ()
    procs_left = hy.end_processes(
        processes,
        lambda p: hy.alive(proc_root, p),
        hy.pidfd_signaller(proc_root),
        grace=settings.term_grace,
        kill_wait=settings.kill_wait,
        deadline=deadline,
    )
    procs_left = [hy.as_now(proc_root, p) for p in procs_left]
    shm_left = hy.remove_shm(shm_root, shm, uid)
    scratch_found: list[str] = []
    scratch_left: list[str] = []
    for path in hy.scratch_paths(settings.scratch_dirs, scope.job, scope.user_files):
        found, left = hy.empty_owned(path, uid, deadline)
        scratch_found += found
        scratch_left += left
    return (
        hy.Leftovers(processes, shm, tuple(scratch_found)),
        hy.Leftovers(tuple(procs_left), tuple(shm_left), tuple(scratch_left)),
    )


def gpu_pids(config: MedicConfig, budget: float) -> set[int]:
    """Compute processes on the node's GPUs, as the daemon's gpu_processes check reads
    them (NVML is the daemon's); empty when it cannot tell."""
    from medic_core.api import HealthdUnavailable, ask

    try:
        reply = ask(
            config.paths.socket,
            {"op": "check", "checks": ["gpu_processes"], "budget": budget},
            timeout=budget + 1.0,
        )
    except HealthdUnavailable:
        return set()
    pids = set()
    for result in reply.get("results") or []:
        for item in (result.get("evidence") or {}).get("processes") or []:
            if isinstance(item, Mapping) and isinstance(item.get("pid"), int):
                pids.add(item["pid"])
    return pids


def record_path(config: MedicConfig) -> Path:
    return config.paths.state_dir / "hygiene" / f"{config.node_name}.json"


def save_record(config: MedicConfig, job: hy.JobOwner, left: hy.Leftovers, reason: str) -> None:
    """Add what `job` left to what the watcher and the HealthCheckProgram look for again
    (root's, 0600): one entry per job, so a second job's leftovers on a node already
    drained as user_problem keep it out too."""
    path = record_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [e for e in read_entries(config) if e["job"]["job_id"] != job.job_id]
    entries.append({"job": asdict(job), "left": asdict(left), "reason": reason, "at": time.time()})
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"entries": entries}, f)
    os.replace(tmp, path)


def read_entries(config: MedicConfig) -> list[dict[str, Any]]:
    """The record's entries as written; [] when there is none or it does not parse."""
    try:
        data = json.loads(record_path(config).read_text())
        entries = data["entries"]
        return [e for e in entries if isinstance(e, dict) and isinstance(e.get("job"), dict)]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def run_hygiene(config: MedicConfig, env: Mapping[str, str], started: float) -> HygieneOutcome:
    """The epilog's hygiene for the job in `env`, within `[hygiene] budget` of `started`."""
    settings = HygieneSettings.from_config(config)
    job = job_owner(env, config.node_name)
    if isinstance(job, str):
        return HygieneOutcome(hy.Leftovers(), hy.Leftovers(), f"no hygiene: {job}")
    deadline = started + settings.budget
    # Only the user's own things need to know whether they have another job here.
    wide = job.uid >= settings.min_uid
    scope = scope_of(job, other_jobs(config, job) if wide else True, settings)
    found, left = clean(config, settings, scope, deadline)
    if found.empty:
        return HygieneOutcome(found, left, "", seconds=time.monotonic() - started)
    budget = max(0.5, min(3.0, deadline - time.monotonic()))
    lines = left.lines(gpu_pids(config, budget) if left.processes else ())
    outcome = _drain(config, slurm_reader(config), settings, job, left, lines) if lines else ""
    seconds = time.monotonic() - started
    cleaned = "; ".join(found.lines()) or "nothing"
    line = f"cleaned {cleaned} in {seconds:.2f} s" + (f"; {outcome}" if outcome else "")
    drained = outcome.startswith("drained")
    _record(config, job, found, left, line, drained=drained, seconds=seconds)
    return HygieneOutcome(found, left, line, drained, seconds)


def _drain(
    config: MedicConfig,
    client: SlurmClient,
    settings: HygieneSettings,
    job: hy.JobOwner,
    left: hy.Leftovers,
    lines: list[str],
) -> str:
    from medic_core.drain_book import HOOK, node_book
    from medic_core.drain_reason import DrainOutcome, drain_if_allowed
    from medic_core.slurm import SlurmError
    from remediation.give_back import node_facts
    from remediation.user_problem import decide_user_problem

    book = node_book(config)
    try:
        facts, _ = node_facts(client, book, config.node_name)
        decision = decide_user_problem(lines, facts, drain_enabled=settings.drain)
        if decision.already:  # this node's user_problem drain: keep it out for these too
            save_record(config, job, left, facts.reason)
        if not decision.drain:
            return decision.why
        save_record(config, job, left, decision.reason)
        done = drain_if_allowed(client, config.node_name, decision.reason, book, actor=HOOK)
    except (SlurmError, OSError) as exc:
        return f"left: {'; '.join(lines)}; not drained: {exc}"
    if done is DrainOutcome.DRAINED:
        start_watch(config)
        return f"drained as user_problem: {decision.why}"
    return f"{done.value}: {decision.why}"


def start_watch(config: MedicConfig) -> int:
    """The detached watcher that gives the node back once it is clean."""
    from remediation.actions import slurm_env

    log_dir = config.paths.state_dir
    return proc.spawn(
        [sys.executable, "-m", "slurm_hooks.hygiene_watch"],
        log_path=log_dir / f"hygiene-watch-{config.node_name}.log",
        env={**os.environ, **slurm_env(config), "SLURM_SCRIPT_CONTEXT": "medic_hygiene_watch"},
    )


def _record(
    config: MedicConfig,
    job: hy.JobOwner,
    found: hy.Leftovers,
    left: hy.Leftovers,
    line: str,
    *,
    drained: bool,
    seconds: float,
) -> None:
    event = {
        "kind": EVENT_KIND,
        "severity": "WARN" if drained else "INFO",
        "message": f"job {job.job_id}: {line}",
        "fault_class": "user_problem" if drained else "",
        "target": f"job:{job.job_id}",
        "evidence": {
            "job_id": job.job_id,
            "user": job.user,
            "uid": job.uid,
            "found": _counts(found),
            "left": _counts(left),
            "drained": drained,
            "seconds": round(seconds, 3),  # from the epilog's start (interpreter up)
            "processes": [asdict(p) for p in found.processes[:20]],
        },
    }
    record(config, event)


def record(config: MedicConfig, event: dict[str, Any]) -> None:
    """Through the daemon (cheap: no store or remediation import), kept in the node's journal
    until it took it; remediation.actions.record_event when the daemon is away."""
    import datetime as dt

    from medic_core import journal
    from medic_core.api import HealthdUnavailable, ask

    try:
        entry = journal.write_ahead(config.paths, config.node_name, event, dt.datetime.now(dt.UTC))
    except journal.JournalFull:
        entry = None
    try:
        reply = ask(config.paths.socket, {"op": "event", **event}, timeout=2.0)
    except HealthdUnavailable:
        if entry is not None:
            journal.delivered(entry)  # record_event keeps an entry of its own
        from remediation.actions import record_event

        record_event(config, event)
        return
    if "error" in reply:  # not taken: the journal entry stays, replayed into the store
        print(f"medic-epilog: hygiene event not recorded: {reply['error']}", file=sys.stderr)
    elif entry is not None:
        journal.delivered(entry)


def _counts(left: hy.Leftovers) -> dict[str, int]:
    return {"processes": len(left.processes), "shm": len(left.shm), "scratch": len(left.scratch)}
