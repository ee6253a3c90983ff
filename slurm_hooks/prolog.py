"""`medic-prolog`: Slurm's Prolog. A job never starts on a node Medic judges sick.

Slurm runs it as root on every allocated node (with `PrologFlags=Alloc`, at allocation
time), with SLURMD_NODENAME and SLURM_JOB_ID but no PATH, usually through the compiled front
(medic-hook), which answers the common case (fresh results, allowed) itself.

One deadline: the front's start (MEDIC_LAUNCH_STARTED) plus `[hooks] launch_budget`, or this
process's start without the front. Everything below gets only what is left of it: the daemon
(asked for a verdict within the rest, less REPLY_RESERVE for its answer to arrive), then the
launch tier inline when the daemon did not answer (NVML's initialisation included), then the
refusal's actions (slurm_hooks.gate). A verdict not reached in time is UNKNOWN, which
`[hooks] on_unknown` decides. On CRITICAL (or UNKNOWN with `on_unknown = "closed"`):

1. drain the node with Medic's reason (first, so Slurm's own "Prolog error" drain does not
   replace it: a node already drained keeps its reason);
2. start a detached releaser: Slurm requeues the job but holds it
   (launch_failed_requeued_held); the releaser releases it so it runs elsewhere, no human;
3. exit 1, which is what makes Slurm requeue the job.

A broken configuration lets the job run (exit 0, error on stderr): a typo must not stop a
whole cluster.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# Without the front, the deadline counts from here: before Medic's own imports (the
# interpreter's start-up before this line is not counted; ~20 ms).
LOADED = time.monotonic()

# Seconds of the budget kept for the daemon's reply to reach us (it records the gate
# decision before it answers); the daemon is asked for the rest.
REPLY_RESERVE = 0.2
# The compiled front's start is believed only if it is this recent (else: ours).
MAX_FRONT_AGE = 60.0


def launch_started(now: float) -> float:
    """When this launch began: the compiled front's CLOCK_MONOTONIC stamp (the clock
    time.monotonic() reads, the same in every process), else `now`."""
    text = os.environ.pop("MEDIC_LAUNCH_STARTED", "")
    try:
        started = float(text)
    except ValueError:
        return now
    return started if now - MAX_FRONT_AGE <= started <= now else now


def _reply_from_front() -> dict[str, Any] | None:
    """The daemon's answer when the compiled front (medic-hook) already asked and was not
    told "allow": asking again would record the gate decision twice. A reply naming stale
    results (the front asks without a budget) is not a verdict: None, ask again."""
    text = os.environ.pop("MEDIC_LAUNCH_REPLY", "")
    if not text:
        return None
    try:
        reply = json.loads(text)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) and "stale" not in reply else None


def main() -> int:
    started = launch_started(LOADED)
    from medic_core.api import HealthdUnavailable, ask
    from medic_core.config import ConfigError, load_config
    from medic_core.spare_names import foreign_spare_run
    from slurm_hooks.job_place import job_place, job_reservation_env

    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        config = load_config()
        from medic_core.settings import HookSettings

        settings = HookSettings.from_config(config)
    except ConfigError as exc:
        print(f"medic-prolog: {exc} (job {job_id} allowed)", file=sys.stderr)
        return 0
    deadline = started + settings.launch_budget  # the one deadline, from here on down
    no_reply = os.environ.pop("MEDIC_LAUNCH_NOREPLY", "")
    reply = _reply_from_front()
    # Another job in a handed spare's reservation: only the spare's daemon may let it start
    # (it knows the hand-over), so it is asked again with all that is left, however busy.
    handed_elsewhere = foreign_spare_run(job_id, job_reservation_env())
    if reply is None and no_reply and not handed_elsewhere:
        # The front's question, answered in a millisecond by a working daemon, went
        # unanswered: judge here with all that is left rather than wait for it again.
        reply = {"allow": None, "note": f"medic-healthd: {no_reply}"}
    if reply is None:
        left = deadline - time.monotonic()
        try:
            request = {"op": "launch", "budget": max(0.0, left - REPLY_RESERVE), "job_id": job_id}
            reply = ask(config.paths.socket, request | job_place(), timeout=max(0.001, left))
        except HealthdUnavailable as exc:
            reply = {"allow": None, "note": str(exc)}
    if reply.get("allow") is True:
        return 0
    from slurm_hooks.gate import gate_slow_path

    if handed_elsewhere and reply.get("allow") is None:
        reply = {**reply, "spare": job_reservation_env()}
    try:
        return gate_slow_path(config, settings, job_id, reply, deadline)
    except ConfigError as exc:  # a table only the inline launch tier reads ([healthd], [checks.*])
        print(f"medic-prolog: {exc} (job {job_id} allowed)", file=sys.stderr)
        return 0
