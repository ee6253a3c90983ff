"""The prolog's slow path: the daemon refused the node, or did not answer.

Everything here keeps to the prolog's one deadline (slurm_hooks.prolog): the inline launch
tier gets only what is left of it, and recording the verdict must be done by ACTIONS_GRACE
past it. A refusal's drain and releaser get REFUSAL_GRACE from the verdict, however late it
came: the refused job cannot start here anyway, and without Medic's drain Slurm drains the
node itself with the reason "Prolog error", which names no fault and which Medic does not
own (a CI run's loaded machine took longer than the 0.3 s past the deadline it once had).
Work still going then is left behind: the exit status, what Slurm acts on, is decided."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from healthd.inline import run_inline
from medic_core.config import MedicConfig
from medic_core.drain_reason import BURN_IN
from medic_core.settings import BurnInSettings, HookSettings
from medic_core.status import Status
from medic_core.vocabulary import Finding, Recommendation, Verdict
from remediation.actions import observe_only, record_gate, refuse_launch
from remediation.burn_in_marker import refusal
from remediation.decide import SPARE_REFUSAL, GateDecision
from remediation.decide import decide_launch as decide
from remediation.observe import observed_gate
from slurm_hooks.job_place import job_place

# remediation.burn_in.CONDITION, spelt out: that module costs the prolog ~7 ms to import.
BURN_IN_CONDITION = "burn_in"
SKIPPED = "skipped"  # the verdict's source when [hooks] skip_launch_* ran no launch check
ACTIONS_GRACE = 0.3  # seconds past the deadline for recording the verdict
REFUSAL_GRACE = 10.0  # seconds from the verdict for a refusal's drain and releaser


def finish_by(work: dict[str, tuple[Callable[[], None], float]]) -> list[str]:
    """Run each piece of `work` (a call and the monotonic time it must be done by) in its
    own daemon thread, all at once, and wait for each until its time; returns what is still
    going then (one line on stderr each): the process may not wait for it."""
    threads = {
        what: (threading.Thread(target=call, name=f"prolog-{what}", daemon=True), by)
        for what, (call, by) in work.items()
    }
    for thread, _ in threads.values():
        thread.start()
    for thread, by in threads.values():
        thread.join(max(0.0, by - time.monotonic()))
    left = [what for what, (thread, _) in threads.items() if thread.is_alive()]
    for what in left:
        print(f"medic-prolog: {what} still going at the launch deadline; left", file=sys.stderr)
    return left


def burn_in_refusal(config: MedicConfig) -> Finding | None:
    """With `[remediation.burn_in] new_node` on, a node whose state dir holds no burn-in
    pass of its own (remediation/burn_in_marker.py) takes no job without its daemon: the
    finding is Medic's burn-in drain, which the daemon, once it runs, burns in and gives
    back. Burn-in off: nothing is read. A pass file that does not read is no pass."""
    checks = BurnInSettings.from_config(config).new_node
    if not checks:
        return None
    why = refusal(config.paths.state_dir, config.node_name)
    if why is None:
        return None
    message = f"not passed (new_node: {' '.join(checks)}): {why}"
    return Finding(BURN_IN_CONDITION, Status.CRITICAL, BURN_IN, "", message, Recommendation.DRAIN)


def spare_refusal(job_id: str, reservation: str) -> Finding:
    """A job in a handed spare's reservation that is not the run it was handed to, judged
    without the spare's daemon (which did not answer): refused, as the daemon would."""
    message = f"{reservation} is handed to another run: job {job_id} refused (no daemon answer)"
    return Finding("spares", Status.CRITICAL, SPARE_REFUSAL, f"job:{job_id}", message)


def exit_now(code: int) -> NoReturn:
    """End the process at once: interpreter shutdown would wait for (or finalise under) the
    threads left behind, an import of SQLAlchemy among them."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def gate_slow_path(
    config: MedicConfig,
    settings: HookSettings,
    job_id: str,
    reply: dict[str, Any],
    deadline: float,
) -> int:
    work: dict[str, tuple[Callable[[], None], float]] = {}
    recorded_by = deadline + ACTIONS_GRACE
    if reply.get("allow") is None:  # no daemon: judge here, and record it ourselves
        unburnt = burn_in_refusal(config)
        skip = settings.skips_launch_checks(**job_place())
        handed = str(reply.get("spare") or "")  # slurm_hooks.prolog: a foreign spare run
        if handed:  # fails closed: the daemon that knows the hand-over did not answer
            found = spare_refusal(job_id, handed)
            verdict = Verdict(Status.CRITICAL, (found,), "prolog", 0.0, str(reply.get("note", "")))
        elif unburnt is not None:  # no check can stand in for the deep tier: not even run
            note = str(reply.get("note", ""))
            verdict = Verdict(Status.CRITICAL, (unburnt,), "prolog", 0.0, note)
        elif skip:  # the admin listed the job's partition or account: no check is run
            verdict = Verdict(Status.OK, (), SKIPPED, 0.0, f"launch checks skipped: {skip}")
        else:
            inline = run_inline(config, deadline - time.monotonic())
            note = "; ".join(n for n in (str(reply.get("note", "")), inline.note) if n)
            verdict = Verdict(inline.status, inline.findings, "inline", inline.seconds, note)
        decision = observed_gate(decide(verdict, settings), observe_only(config))
        work["recording"] = (lambda: record_gate(config, job_id, verdict, decision), recorded_by)
    else:  # the daemon decided (and recorded) a refusal: it stands, with its reasons
        verdict = Verdict.from_reply(reply, "healthd", float(reply.get("seconds", 0.0)))
        decision = decide(verdict, settings)
        blocking = reply.get("blocking")
        if observe_only(config):  # a daemon not yet reloaded into observe-only mode
            decision = observed_gate(decision, True)
            blocking = None
        if decision.allow and isinstance(blocking, list):  # e.g. an RMA ticket
            findings = tuple(Finding.from_json(b) for b in blocking if isinstance(b, dict))
            why = str(reply.get("why") or "refused by medic-healthd")
            refused = Finding("gate", Status.CRITICAL, "gate.refused", "", why)
            decision = GateDecision(False, Status.CRITICAL, findings or (refused,), why)
    messages: list[str] = []
    if not decision.allow:
        work["the refusal's drain"] = (
            lambda: messages.append(refuse_launch(config, settings, job_id, decision)),
            max(recorded_by, time.monotonic() + REFUSAL_GRACE),
        )
    left = finish_by(work) if work else []
    code = 0
    if not decision.allow:
        why = decision.first.message if decision.first else decision.why
        message = messages[0] if messages else f"{config.node_name} refused job {job_id}: {why}"
        print(f"medic-prolog: {message}", file=sys.stderr)
        code = 1
    if left:
        exit_now(code)
    return code
