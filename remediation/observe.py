"""Observe-only mode (`[remediation] observe_only = true`): Medic decides as always and
changes nothing in Slurm.

Every automatic Slurm client (the daemon's answers to faults, its ladder, burn-in and
isolator, the prolog's refusal, the HealthCheckProgram, the releaser) is made by one function,
remediation.actions.slurm_client; with observe_only on it is an `ObservingSlurm`: reads go to
Slurm, and each change (drain, resume, reboot, requeue, release, hold, start now) is recorded
as an event of kind OBSERVED, with the actor and the decision, instead of being made; a job's
AdminComment is left as it is. Medic's drain records (medic_core.drain_book) are not written
either: Medic owns no drain it did not make. What is not a Slurm call is recorded the same
way through `would`: the ladder's repair rung and RMA ticket (remediation.step), and the
prolog's refusal (remediation.decide.decide_launch allows the job).

The same decision is recorded once per REPEAT_SECONDS per process: the daemon, which sees
its node still in service, decides the same drain again at every look.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from medic_core.slurm import JobInfo, NodeInfo, SlurmClient
from remediation.decide import GateDecision

if TYPE_CHECKING:
    from remediation.episode_types import Episode

log = logging.getLogger("medic.observe")

OBSERVED = "observed"  # the event kind: what Medic would have done
REPEAT_SECONDS = 300.0
# The decisions an observed event names (evidence["action"]).
ACTIONS = (
    "drain", "resume", "reboot", "requeue", "release", "hold", "start_now",
    "gpu_reset", "driver_reload", "rma", "refuse_launch",
)  # fmt: skip

EventSink = Callable[[dict[str, Any]], None]


def observed_event(
    actor: str,
    action: str,
    subject: str,
    detail: str,
    *,
    fault_class: str = "",
    evidence: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The event recording that `actor` would have done `action` to `subject` (a node, or
    `job:<id>`), with why (`detail`)."""
    return {
        "kind": OBSERVED,
        "severity": "INFO",
        "source": actor,
        "message": f"would {action.replace('_', ' ')} {subject}"
        + (f": {detail}" if detail else ""),
        "fault_class": fault_class,
        "target": subject,
        "evidence": {
            **(evidence or {}),
            "actor": actor,
            "action": action,
            "subject": subject,
            "decision": detail,
        },
    }


@dataclass
class Observer:
    """Records what `actor` would have done while `active()` says observe-only is on (read
    at every change: a reload applies at the next)."""

    actor: str
    record: EventSink
    active: Callable[[], bool]
    clock: Callable[[], float] = time.monotonic
    _seen: dict[tuple[str, str, str], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def would(
        self,
        action: str,
        subject: str,
        detail: str = "",
        *,
        fault_class: str = "",
        evidence: Mapping[str, Any] | None = None,
    ) -> bool:
        """Record the decision (not again within REPEAT_SECONDS); False when it was a
        repeat. Recording never raises into the caller."""
        key, now = (action, subject, detail), self.clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < REPEAT_SECONDS:
                return False
            self._seen[key] = now
        log.warning("observe only: %s would %s %s: %s", self.actor, action, subject, detail)
        try:
            self.record(
                observed_event(
                    self.actor, action, subject, detail, fault_class=fault_class, evidence=evidence
                )
            )
        except Exception:  # never fails the decision it records
            log.exception("observe only: recording what %s would have done failed", self.actor)
        return True


def observer_of(client: object) -> Observer | None:
    """The client's observer while observe-only is on, else None (the client acts)."""
    observer = getattr(client, "observer", None)
    return observer if isinstance(observer, Observer) and observer.active() else None


def observing(configured: bool, client: object) -> bool:
    """Observe-only mode: as configured, or as the Slurm client says now (the daemon's
    reads its configuration at every change)."""
    return configured or observer_of(client) is not None


def would(client: object, action: str, node: str, episode: Episode) -> bool:
    """The ladder's step in observe-only mode (StepDecision.observed: a rung's word, "rma"),
    recorded through the client's observer; False with no action or no observer."""
    observer = observer_of(client)
    if not action or observer is None:
        return False
    detail = f"episode {episode.id}: {episode.fault_class} {episode.target}".rstrip()
    evidence = {"episode": episode.id}
    observer.would(action, node, detail, fault_class=episode.fault_class, evidence=evidence)
    return True


class ObservingSlurm:
    """A SlurmClient that reads Slurm and, while its observer is active, changes nothing:
    each change is recorded as what Medic would have done."""

    def __init__(self, client: SlurmClient, observer: Observer) -> None:
        self.client = client
        self.observer = observer
        self._comments: dict[str, str] = {}  # job: the AdminComment a change would have set

    @property
    def observing(self) -> bool:
        """Changes are recorded, not made (medic_core.drain_reason.observing)."""
        return self.observer.active()

    def nodes(self) -> list[NodeInfo]:
        return self.client.nodes()

    def node(self, name: str) -> NodeInfo | None:
        return self.client.node(name)

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]:
        return self.client.jobs(ids)

    def jobs_on(self, node: str) -> list[JobInfo]:
        return self.client.jobs_on(node)

    def drain(self, node: str, reason: str) -> None:
        if self.observer.active():
            self.observer.would("drain", node, reason)
        else:
            self.client.drain(node, reason)

    def resume(self, node: str) -> None:
        if self.observer.active():
            self.observer.would("resume", node)
        else:
            self.client.resume(node)

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        if self.observer.active():
            self.observer.would("reboot", node, f"{reason} (nextstate={nextstate})")
        else:
            self.client.reboot(node, reason, nextstate)

    def requeue(self, job_id: str) -> None:
        if self.observer.active():
            self.observer.would("requeue", f"job:{job_id}", self._comments.pop(job_id, ""))
        else:
            self.client.requeue(job_id)

    def release(self, job_id: str) -> None:
        if self.observer.active():
            self.observer.would("release", f"job:{job_id}")
        else:
            self.client.release(job_id)

    def hold(self, job_id: str) -> None:
        if self.observer.active():
            self.observer.would("hold", f"job:{job_id}")
        else:
            self.client.hold(job_id)

    def start_now(self, job_id: str) -> None:
        if self.observer.active():
            self.observer.would("start_now", f"job:{job_id}")
        else:
            self.client.start_now(job_id)

    def controller_time(self) -> int:
        return self.client.controller_time()

    def set_admin_comment(self, job_id: str, text: str) -> None:
        # Not a decision of its own: the text (why) goes with the requeue that follows.
        if self.observer.active():
            self._comments[job_id] = text
        else:
            self.client.set_admin_comment(job_id, text)


WOULD_REFUSE = "observe only: would have refused"


def observed_gate(decision: GateDecision, observe_only: bool) -> GateDecision:
    """The prolog's refusal in observe-only mode: the job is allowed, and the decision
    says what would have refused it (its blocking findings kept for the gate's record)."""
    if decision.allow or not observe_only:
        return decision
    first = decision.first
    why = f"{WOULD_REFUSE}: {first.message if first is not None else decision.why}"
    return replace(decision, allow=True, why=why)


def would_refuse(decision: GateDecision) -> bool:
    return decision.allow and decision.why.startswith(WOULD_REFUSE)
