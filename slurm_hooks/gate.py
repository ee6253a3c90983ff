"""The prolog's slow path: the daemon refused the node, or did not answer.

Everything here keeps to the prolog's one deadline (slurm_hooks.prolog): the inline launch
tier gets only what is left of it, and what follows the verdict (recording it, the
refusal's drain and releaser) must be done by ACTIONS_GRACE past it; work still going then is
left behind (the exit status, which is what Slurm acts on, is already decided; without
Medic's drain Slurm drains the node itself, reason "Prolog error")."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from healthd.inline import run_inline
from medic_core.config import MedicConfig
from medic_core.settings import HookSettings
from medic_core.vocabulary import Verdict
from remediation.decide import decide_launch as decide
from slurm_hooks.actions import record_gate, refuse_launch

ACTIONS_GRACE = 0.3  # seconds past the deadline for recording and the refusal's actions


def finish_by(deadline: float, what: str, work: Callable[[], None]) -> bool:
    """Run `work` in a daemon thread and wait for it until `deadline` (monotonic); False
    (and one line on stderr) when it is still going then: the process may exit without it."""
    thread = threading.Thread(target=work, name=f"prolog-{what}", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        print(f"medic-prolog: {what} still going at the launch deadline; left", file=sys.stderr)
        return False
    return True


def gate_slow_path(
    config: MedicConfig,
    settings: HookSettings,
    job_id: str,
    reply: dict[str, Any],
    deadline: float,
) -> int:
    actions_by = deadline + ACTIONS_GRACE
    if reply.get("allow") is None:  # no daemon: judge here, and record it ourselves
        inline = run_inline(config, deadline - time.monotonic())
        note = "; ".join(n for n in (str(reply.get("note", "")), inline.note) if n)
        verdict = Verdict(inline.status, inline.findings, "inline", inline.seconds, note)
        decision = decide(verdict, settings)
        finish_by(actions_by, "recording", lambda: record_gate(config, job_id, verdict, decision))
    else:  # the daemon decided (and recorded) a refusal
        verdict = Verdict.from_reply(reply, "healthd", float(reply.get("seconds", 0.0)))
        decision = decide(verdict, settings)
    if decision.allow:
        return 0
    messages: list[str] = []
    finish_by(
        actions_by,
        "the refusal's drain",
        lambda: messages.append(refuse_launch(config, settings, job_id, decision)),
    )
    why = decision.first.message if decision.first else decision.why
    message = messages[0] if messages else f"{config.node_name} refused job {job_id}: {why}"
    print(f"medic-prolog: {message}", file=sys.stderr)
    return 1
