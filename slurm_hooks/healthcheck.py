"""`medic-healthcheck`: Slurm's HealthCheckProgram (every HealthCheckInterval, as root, with
nothing but SLURMD_NODENAME in its environment).

* A CRITICAL node is drained with Medic's reason (a backstop: the daemon drains at once when
  a fault appears; this catches a daemon that could not reach slurmctld at the time).
* A node Medic drained is resumed once it re-qualifies: a fresh run of the launch and
  periodic tiers with nothing CRITICAL or UNKNOWN, and no remediation episode owning the
  node (the ladder returns its nodes itself). Whose a drain is comes from Medic's drain
  records (medic_core.drain_book), never from the reason's text: a drain with no record
  (an admin's `medic: x` too) is never touched, and a drain made for an episode (the
  ladder's, or one a human closed) is the ladder's or a human's to give back, not this
  program's. Every resume goes through the decision core (remediation.give_back) and is
  recorded with the actor `hook` before Slurm is asked.
* The daemon being down is reported (exit 1, which slurmd logs) and the launch tier runs
  inline instead, so a CRITICAL node is still drained.
* Events the hooks could not record (the store down or its disk full) wait in the node's
  journal (medic_core.journal); each run replays them into the store once it takes writes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.settings import HookSettings
from medic_core.slurm import NodeInfo, SlurmClient

if TYPE_CHECKING:
    from medic_core.drain_book import DrainBook


@dataclass(frozen=True)
class HealthCheckOutcome:
    daemon_up: bool
    # "none", "drained", "would_drain" (observe only), "resumed", "kept", "not_ours",
    # "owned_by_ladder", "adopted"
    action: str
    message: str


def _adopt(
    config: MedicConfig, info: NodeInfo | None, book: DrainBook
) -> HealthCheckOutcome | None:
    """Slurm's own drain on this node ("Kill task failed", ...: remediation.decide.SLURM_DRAINS)
    with no record of Medic's: the daemon is asked to adopt it (it reads Slurm again and
    decides); None when there is nothing of the kind."""
    from medic_core.api import HealthdUnavailable, ask
    from remediation.decide import SLURM_DRAINS

    if info is None or not (info.drained or info.down) or info.reason not in SLURM_DRAINS:
        return None
    if book.ownership(config.node_name, info).recorded is not False:
        return None  # Medic's already, or its records cannot tell
    try:
        reply = ask(config.paths.socket, {"op": "adopt"}, timeout=30.0)
    except HealthdUnavailable as exc:
        return HealthCheckOutcome(False, "kept", f"Slurm's {info.reason!r} not adopted: {exc}")
    said = str(reply.get("adopt") or reply.get("error") or "no answer")
    action = "adopted" if said.startswith("adopted") else "kept"
    return HealthCheckOutcome(True, action, f"Slurm's {info.reason!r}: {said}")


def health_check(
    config: MedicConfig, settings: HookSettings, client: SlurmClient
) -> HealthCheckOutcome:
    from healthd.inline import run_inline
    from medic_core.api import HealthdUnavailable, ask
    from medic_core.drain_book import HOOK, node_book
    from medic_core.drain_reason import DrainOutcome, is_medic_reason, is_user_problem_reason
    from medic_core.status import Status
    from medic_core.vocabulary import Finding, Verdict
    from remediation.actions import drain_through_core
    from remediation.decide_resume import decide_resume
    from remediation.give_back import facts_of, give_back
    from slurm_hooks.hygiene_watch import resume_if_clean
    from slurm_hooks.ownership import remediation_owns

    node = config.node_name
    daemon_up = True
    try:
        reply = ask(config.paths.socket, {"op": "status"}, timeout=5.0)
        verdict = Verdict.from_reply(reply, "healthd", 0.0)
    except HealthdUnavailable as exc:
        daemon_up = False
        verdict = run_inline(config, settings.launch_budget)
        verdict = Verdict(verdict.status, verdict.findings, "inline", verdict.seconds, str(exc))
    down = "" if daemon_up else f" (medic-healthd unreachable: {verdict.note})"
    info = client.node(node)
    book = node_book(config)
    adopted = _adopt(config, info, book) if daemon_up else None
    if adopted is not None:
        return adopted
    # The store is opened (the records read) only for a node Slurm shows drained.
    own = book.ownership(node, info) if info is not None and info.drained else None
    reason = info.reason if info is not None else ""
    medic_drained = own is not None and (
        own.recorded is True or (own.recorded is None and is_medic_reason(reason))
    )
    critical = [f for f in verdict.findings if f.status is Status.CRITICAL]
    if critical and not medic_drained:
        decision, drained = drain_through_core(client, config, critical, book)
        said = drained.value if drained else f"not drained: {decision.why or 'already out'}"
        label = {None: "kept", DrainOutcome.WOULD_DRAIN: "would_drain"}.get(drained, "drained")
        return HealthCheckOutcome(daemon_up, label, f"{said}{down}")
    if not medic_drained:
        return HealthCheckOutcome(daemon_up, "none", f"{verdict.status.value}{down}")
    if not settings.resume or not daemon_up:
        return HealthCheckOutcome(daemon_up, "kept", f"medic drain kept{down}")
    # Before the fresh run: a drain kept for a human or an episode is not this program's.
    assert own is not None
    if is_user_problem_reason(reason):  # post-job hygiene's: given back once clean
        look = resume_if_clean(config, client, book)
        return HealthCheckOutcome(daemon_up, look.action, look.message)
    ahead = decide_resume(facts_of(info, own))
    if not ahead.resume:
        return HealthCheckOutcome(daemon_up, "kept", ahead.why)
    owner = remediation_owns(config, node)
    if owner:
        return HealthCheckOutcome(daemon_up, "owned_by_ladder", owner)
    # Re-qualify: a fresh run of both tiers, not the cached results.
    fresh: list[Finding] = []
    for tier in ("launch", "periodic"):
        reply = ask(
            config.paths.socket,
            {"op": "check", "tier": tier, "budget": settings.launch_budget},
            timeout=settings.launch_budget * 3,
        )
        fresh += Verdict.from_reply(reply, "healthd", 0.0).findings
    blocking = [f for f in fresh if f.status in (Status.CRITICAL, Status.UNKNOWN)]
    if blocking:
        first = blocking[0]
        return HealthCheckOutcome(
            daemon_up, "kept", f"still {first.status.value}: {first.check} {first.message}"
        )
    # The node as Slurm stores it now (a human may have changed it meanwhile), its drain
    # record read again: the decision core decides, the resume is recorded first.
    done = give_back(client, book, node, actor=HOOK)
    if not done.resumed:
        return HealthCheckOutcome(daemon_up, "kept", done.why)
    return HealthCheckOutcome(daemon_up, "resumed", f"re-qualified: {done.text}")


def main() -> int:
    try:
        config = load_config()
        settings = HookSettings.from_config(config)
    except ConfigError as exc:
        print(f"medic-healthcheck: {exc}", file=sys.stderr)
        return 1
    from remediation.actions import slurm_client

    try:
        outcome = health_check(
            config, settings, slurm_client(config, settings, actor="healthcheck")
        )
    except ConfigError as exc:  # [healthd], [checks.*] or [remediation]: read on the way
        print(f"medic-healthcheck: {exc}", file=sys.stderr)
        return 1
    print(f"medic-healthcheck: {config.node_name}: {outcome.message}")
    from remediation.actions import replay_journal

    replayed = replay_journal(config)  # events the hooks kept while the store was away
    if replayed:
        print(f"medic-healthcheck: {config.node_name}: {replayed}")
    return 0 if outcome.daemon_up else 1
