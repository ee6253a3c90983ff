"""The launch gate: the prolog's question "may a job start here?", the gate decision recorded
for the job, the hooks' own records, and the epilog's post-job checks and job summary.

It reads the daemon's latest results and runs checks through it (`GateHost`); it knows
nothing of the socket that asks, nor of the remediation ladder.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from healthd.checks.base import Result, Status, Tier, worst
from healthd.gate_recorder import EventRecorder
from healthd.results import result_json
from healthd.runner import Runner, RunnerBusy, RunReport
from medic_core.config import MedicConfig
from medic_core.settings import DaemonSettings, HookSettings, RemediationSettings
from medic_core.store import Severity, Store

if TYPE_CHECKING:
    from medic_core.vocabulary import Finding
    from remediation.tickets.rails import NodeRails

log = logging.getLogger("medic.healthd")

# What the epilog's job_end runs: the GPUs still there and clean after the job.
POST_JOB_CHECKS = ("gpu_count", "gpu_xid", "gpu_ecc", "gpu_retired_pages", "gpu_remapped_rows")
HOOK_EVENT_KINDS = ("gate", "job_summary", "job_action", "observed", "hygiene")
GATE_FLUSH = 1.0  # seconds job_summary waits for queued gate decisions to reach the store
# The gate's rails (open RMA tickets, the drain cap's hold, the GPUs isolation took out) for a
# verdict that is not CRITICAL come from memory when read within RAILS_MAX_AGE seconds (by the
# gate, or by the ladder's tick, which hands them over: observe_rails), else
# from the store before the reply; once older than RAILS_FRESH they are read again after the
# reply, at most once per RAILS_FRESH seconds whatever the launch rate (one read, a single
# transaction, costs ~0.2 ms of CPU: at one job start a second, every 5 s, not every start).
# A CRITICAL verdict reads them before the reply. So an RMA ticket opened for a node Slurm
# still has in service (`medic rma open` does not drain) may let jobs start there for up to
# RAILS_MAX_AGE seconds; the ladder's keep-out drains such a node at its next look (within
# 5 s), after which Slurm places no new job there, so the gate's bound matters when the
# ladder cannot drain it (slurmctld does not answer, a repair step under way). Ten seconds is
# also the checks' own interval: how late a fault of the node is seen at worst.
RAILS_FRESH, RAILS_MAX_AGE = 5.0, 10.0


class GateHost(Protocol):
    """What the gate needs of the daemon: its latest results and a way to run checks."""

    @property
    def node(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def config(self) -> MedicConfig: ...

    @property
    def settings(self) -> DaemonSettings: ...

    @property
    def checks(self) -> Runner: ...

    def latest(self, name: str) -> tuple[float, tuple[Result, ...]] | None:
        """(monotonic time of the check's last run, its condition results), or None."""

    def run_checks(
        self,
        names: Iterable[str] | None = None,
        *,
        tier: Tier | None = None,
        budget: float | None = None,
        wait: float | None = None,
    ) -> RunReport: ...


# What the hook's reply carries of the verdict (the results only with a refusal: the prolog
# drains for them; an allowed job needs none, and all of them made each reply ~27 KB).
HOOK_REPLY_KEYS = ("node", "tier", "status", "ran", "seconds")


class LaunchGate:
    def __init__(self, host: GateHost) -> None:
        self.host = host
        self._recorder: EventRecorder | None = None
        self._recorder_lock = threading.Lock()
        # (monotonic, open RMA tickets, the drain cap's hold, the GPUs isolation took out)
        self._rails_seen: tuple[float, list[int], str, tuple[int, ...]] | None = None
        # Called with the job's id before its verdict (the ladder thread's `guard_launch`:
        # a handed spare refuses another job in its prolog, so its script never starts): a
        # finding to refuse the launch for, or None; never raises here.
        self.before_launch: Callable[[str], Finding | None] | None = None

    @property
    def recorder(self) -> EventRecorder:
        """Made at first use: the daemon builds its gate before its configuration is set."""
        with self._recorder_lock:
            if self._recorder is None:
                host = self.host
                self._recorder = EventRecorder(lambda: host.store, host.config.paths, host.node)
            return self._recorder

    def launch_budget(self) -> float:
        """The one launch budget (`[hooks] launch_budget`): a request's budget is capped by it."""
        return HookSettings.from_config(self.host.config).launch_budget

    def launch(
        self,
        budget: float,
        *,
        fresh_only: bool = False,
        job_id: str | None = None,
        partition: str = "",
        account: str = "",
    ) -> dict[str, Any]:
        """The launch verdict, every result in it; with `job_id` (the hook's request), the
        gate decision instead: the verdict's status, allow, why, and with a refusal what
        blocks (and the results that are not OK). The decision is recorded for the job
        after the reply, not before (gate_recorder)."""
        if job_id is not None and self.before_launch is not None:
            refusal = None
            try:
                refusal = self.before_launch(job_id)
            except Exception:  # the spare's loop tends it again; the job's launch goes on
                log.exception("job %s: the check before its launch failed", job_id)
            if refusal is not None:  # no check can change this answer: none is run
                reply = {"node": self.host.node, "tier": Tier.LAUNCH.value,
                         "status": Status.CRITICAL.value, "ran": [], "seconds": 0.0}  # fmt: skip
                found = [refusal.as_json()]
                return {**reply, **self.gate(job_id, {**reply, "results": found}),
                        "results": found}  # fmt: skip
        hooks = HookSettings.from_config(self.host.config)
        skip = hooks.skips_launch_checks(partition, account) if job_id is not None else ""
        if job_id is not None and skip:  # no check runs; an RMA ticket still refuses
            reply = {"node": self.host.node, "tier": Tier.LAUNCH.value,
                     "status": Status.OK.value, "ran": [], "seconds": 0.0}  # fmt: skip
            return {**reply, **self.gate(job_id, {**reply, "results": []}, skipped=skip)}
        verdict = self._verdict(budget, fresh_only=fresh_only)
        if "status" not in verdict:  # "stale: ask again"
            return verdict
        results: list[Result] = verdict["results"]
        if job_id is None:
            return {**verdict, "results": [result_json(r) for r in results]}
        # The decision needs only what is not OK (decide_launch); the status is the verdict's.
        not_ok = [result_json(r) for r in results if r.status is not Status.OK]
        reply = {k: verdict[k] for k in HOOK_REPLY_KEYS}
        reply.update(self.gate(job_id, {**reply, "results": not_ok}))
        if not reply["allow"]:
            reply["results"] = not_ok
        return reply

    def launch_verdict(self, budget: float, *, fresh_only: bool = False) -> dict[str, Any]:
        """The launch verdict with every result (see _verdict)."""
        verdict = self._verdict(budget, fresh_only=fresh_only)
        if "results" in verdict:
            verdict["results"] = [result_json(r) for r in verdict["results"]]
        return verdict

    def _verdict(self, budget: float, *, fresh_only: bool = False) -> dict[str, Any]:
        """The prolog's question: may a job start here? Current launch-tier results younger
        than launch_max_age are reused; the stale ones are run now. Waiting for the runner
        (a periodic run in progress) and the run itself fit in `budget` together: a check
        that could not answer in time is UNKNOWN. With `fresh_only` (the compiled front,
        which waits only a fixed short time) stale results are not run: the reply names
        them instead of carrying a status, and the Python prolog asks again with a budget."""
        host = self.host
        lock_step, min_run = 0.05, 0.01  # seconds
        start = time.monotonic()
        deadline = start + budget
        names = host.checks.selected(tier=Tier.LAUNCH)
        max_age = host.settings.launch_max_age

        def stale_now() -> list[str]:
            now = time.monotonic()
            return [n for n in names if now - (host.latest(n) or (-1e18, ()))[0] > max_age]

        stale = stale_now()
        if stale and fresh_only:
            return {"node": host.node, "tier": Tier.LAUNCH.value, "stale": stale}
        ran, busy = list(stale), ""
        while stale:
            left = deadline - time.monotonic()
            if left <= min_run:
                busy = f"the runner was busy for the whole {budget:g}s launch budget"
                break
            # Queue for the runner in short steps, each run capped by what is left after its
            # step, so wait + run <= budget; a periodic run that ends meanwhile may have
            # refreshed some of the stale checks, which are then reused.
            step = min(lock_step, left / 2)
            try:
                host.run_checks(stale, budget=left - step, wait=step)
                stale = []
            except RunnerBusy:
                stale = stale_now()
        results: list[Result] = []
        for name in names:
            entry = host.latest(name)
            if entry is None or name in stale:
                results.append(
                    Result(
                        name,
                        Status.UNKNOWN,
                        "check.busy",
                        None,
                        f"{name}: no fresh result ({busy or 'never ran'})",
                    )
                )
            else:
                results.extend(entry[1])
        return {
            "node": host.node,
            "tier": Tier.LAUNCH.value,
            "status": worst([r.status for r in results]).value,
            "ran": [n for n in ran if n not in stale],
            "seconds": round(time.monotonic() - start, 4),
            "results": results,  # Result objects: the callers choose what to send
        }

    def record_hook_event(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A hook's own record (a gate decision, a job summary, a job action), as an event."""
        kind = str(request.get("kind", ""))
        if kind not in HOOK_EVENT_KINDS:
            return {"error": f"event kind {kind!r} is not one of {', '.join(HOOK_EVENT_KINDS)}"}
        event = self.host.store.add_event(
            node=self.host.node,
            at=dt.datetime.now(dt.UTC),
            kind=kind,
            severity=Severity(request.get("severity", "INFO")),
            source=str(request.get("source", "hook")),
            message=str(request.get("message", "")),
            fault_class=str(request.get("fault_class", "")),
            target=str(request.get("target", "")),
            evidence=dict(request.get("evidence") or {}),
        )
        return {"node": self.host.node, "event_id": event.id}

    def gate(self, job_id: str, verdict: Mapping[str, Any], skipped: str = "") -> dict[str, Any]:
        """The prolog's decision on a launch verdict, with the `[hooks]` policy, recorded
        for the job (an event of kind "gate", queued: written after the reply). `skipped`:
        why no launch check ran ([hooks] skip_launch_*)."""
        from medic_core.vocabulary import Finding, Verdict
        from remediation.decide import decide_launch as decide
        from remediation.observe import observed_gate, would_refuse

        found = verdict.get("results", [])
        seen = Verdict(
            Status(verdict["status"]),
            tuple(Finding.from_json(r) for r in found),
            "healthd",
            float(verdict.get("seconds", 0.0)),
        )
        # A CRITICAL verdict reads them now: the drain cap's hold changes with the very fault
        # the verdict found, and a refusal is the slow path anyway.
        rails = self._cached_rails(now=seen.status is Status.CRITICAL)
        rma_open, cap_held, isolated, rails_age = rails
        decision = decide(
            seen,
            HookSettings.from_config(self.host.config),
            rma_open=rma_open,
            cap_held=cap_held,
            isolated_gpus=isolated,
        )
        observe = RemediationSettings.from_config(self.host.config).observe_only
        decision = observed_gate(decision, observe)  # observe only: allowed, recorded
        first = decision.first
        self.recorder.record(
            {
                "kind": "gate",
                "severity": Severity.INFO if decision.allow else Severity.CRITICAL,
                "source": "prolog",
                "message": (
                    f"job {job_id} allowed ({seen.status.value})"
                    + (f": {decision.why}" if would_refuse(decision) else "")
                    + (f": launch checks skipped: {skipped}" if skipped else "")
                    if decision.allow
                    else f"job {job_id} refused: {first.message if first else decision.why}"
                ),
                "fault_class": first.fault_class if first else "",
                "target": f"job:{job_id}",
                "evidence": {
                    "job_id": job_id,
                    "allow": decision.allow,
                    "status": seen.status.value,
                    "verdict_source": "healthd",
                    "would_refuse": would_refuse(decision),
                    "skipped": skipped,
                    "ran": list(verdict.get("ran", [])),
                    "seconds": verdict.get("seconds"),
                },
            },
            after=self._refresh_rails if rails_age > RAILS_FRESH else None,
        )
        reply: dict[str, Any] = {"allow": decision.allow, "why": decision.why}
        if not decision.allow:  # what the prolog's refusal drains for
            reply["blocking"] = [f.as_json() for f in decision.blocking]
        return reply

    def _cached_rails(self, now: bool = False) -> tuple[list[int], str, tuple[int, ...], float]:
        """The rails and their age in seconds: from memory when read within RAILS_MAX_AGE,
        else (or with `now`) from the store now."""
        seen = self._rails_seen
        if now or seen is None or time.monotonic() - seen[0] > RAILS_MAX_AGE:
            seen = self._read_rails()
        return seen[1], seen[2], seen[3], time.monotonic() - seen[0]

    def _refresh_rails(self) -> None:
        """After a reply: read the rails again unless they were read within RAILS_FRESH (the
        events of several launches may be written together, each asking for a read)."""
        seen = self._rails_seen
        if seen is None or time.monotonic() - seen[0] > RAILS_FRESH:
            self._read_rails()

    def _read_rails(self) -> tuple[float, list[int], str, tuple[int, ...]]:
        at = time.monotonic()
        rma_open, cap_held, isolated = self._rails()
        self._rails_seen = (at, rma_open, cap_held, isolated)
        return self._rails_seen

    def observe_rails(self, rails: NodeRails) -> None:
        """The rails as someone else just read them (the ladder, at each tick): the gate's
        own read after a reply is then seldom due."""
        self._rails_seen = (time.monotonic(), *_gate_rails(rails))

    def _rails(self) -> tuple[list[int], str, tuple[int, ...]]:
        """This node's open RMA tickets, the episode the drain cap keeps in service (its
        why) and the GPUs its open episode's isolation record took out of the GRES, as the
        store knows them; nothing when it does not answer (the verdict alone decides then,
        and the ladder's keep-out still drains an RMA node)."""
        from remediation import tickets

        try:
            rails = tickets.read_rails(self.host.store, self.host.node)
        except Exception as exc:  # a store that fails must not stop a job start
            log.warning("launch gate: RMA tickets and episodes unknown: %s", exc)
            return [], "", ()
        return _gate_rails(rails)

    def after_job(self, job_id: str) -> None:
        """Post-job checks and the job's health summary (an event of kind "job_summary");
        a CRITICAL finding goes the usual way (drain, ladder) through the daemon's record().
        The summary is written like the gate's records (the recorder, flushed at once): a
        store that refuses it (down, full) leaves it in the node's journal, replayed with
        its time once the store is back (issue 23, finding 6: it was lost)."""
        host = self.host
        at = dt.datetime.now(dt.UTC)
        try:
            summary = self.job_summary(job_id, host.settings.launch_budget)
        except Exception:
            log.exception("post-job checks for job %s failed", job_id)
            return
        critical = [r for r in summary["results"] if r["status"] == "CRITICAL"]
        self.recorder.record(
            {
                "kind": "job_summary",
                "severity": Severity.CRITICAL if critical else Severity.INFO,
                "source": "epilog",
                "message": summary["message"],
                "fault_class": critical[0]["fault_class"] or "" if critical else "",
                "target": f"job:{job_id}",
                "evidence": {k: v for k, v in summary.items() if k != "results"},
            },
            at=at,
        )
        self.recorder.flush(GATE_FLUSH)

    def job_summary(self, job_id: str, budget: float) -> dict[str, Any]:
        """For the epilog: the post-job checks now, and what this node saw during the job
        (events since the job's gate decision, or the last day when there was none). The
        checks are the daemon's own (POST_JOB_CHECKS), never a caller's: a peer of the
        socket group must not start root's deep tier (issue 23, finding 1). With the store
        down the checks still run; "store" says why the events are missing."""
        host = self.host
        self.recorder.flush(GATE_FLUSH)  # the job's gate decision, queued at its start
        now = dt.datetime.now(dt.UTC)
        store_down = ""
        try:
            gates = [
                e for e in host.store.events(host.node, kind="gate") if e.target == f"job:{job_id}"
            ]
        except Exception as exc:  # the checks matter more than the history
            gates, store_down = [], (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        since = gates[0].at if gates else now - dt.timedelta(days=1)
        names = [n for n in POST_JOB_CHECKS if n in host.checks.specs]
        report = host.run_checks(names, budget=budget)
        during = []
        if not store_down:
            try:
                during = [
                    e
                    for e in host.store.events(host.node, since=since, limit=1000)
                    if e.severity != "INFO" and e.kind not in HOOK_EVENT_KINDS
                ]
            except Exception as exc:
                store_down = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        faults = sorted({e.fault_class for e in during if e.fault_class})
        bad = [r for r in report.results if r.status.severity >= Status.WARN.severity]
        faults += sorted({r.fault_class for r in bad if r.fault_class} - set(faults))
        message = f"job {job_id} on {host.node}: " + (
            f"faults {', '.join(faults)}" if faults else "no faults seen"
        )
        summary: dict[str, Any] = {
            "node": host.node,
            "job_id": job_id,
            "since": since.isoformat(),
            "message": message,
            "faults": faults,
            "events": [
                {
                    "at": e.at.isoformat(),
                    "kind": e.kind,
                    "fault_class": e.fault_class,
                    "target": e.target,
                    "message": e.message,
                }
                for e in during[:50]
            ],
            "status": worst([r.status for r in report.results]).value,
            "results": [result_json(r) for r in report.results],
        }
        if store_down:
            summary["store"] = f"unavailable: {store_down[:200]}"
        return summary


def _gate_rails(rails: NodeRails) -> tuple[list[int], str, tuple[int, ...]]:
    """What the gate takes of the rails: the open tickets, the drain cap's hold (its why) and
    the GPUs isolation took out."""
    from remediation import episodes as ep
    from remediation.isolation import out_of_gres, recorded

    rma_open, episode = rails.open_tickets, rails.episode
    isolated = out_of_gres(recorded(episode.evidence)) if episode is not None else ()
    if episode is not None and episode.state == ep.WAITING_CAP:
        return rma_open, f"episode {episode.id} waits for the drain cap", isolated
    return rma_open, "", isolated
