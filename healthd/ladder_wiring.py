"""Builds the remediation ladder's thread for a daemon: the ladder with the daemon as its host
and Slurm as the hooks see it, and its parts, each reading its settings from the daemon's
configuration at every use (a reload applies at the next): hot spares, burn-in, single-GPU
isolation, evidence bundles, and the watch over the jobs' progress heartbeats.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from healthd.ladder_host import DaemonLadderHost
from healthd.ladder_thread import LadderDaemon, LadderThread
from healthd.observing import automatic_slurm, observe_only
from healthd.progress_answers import ProgressAnswers, watch_hangs
from healthd.slurm_seen import SlurmSeen
from medic_core.settings import HookSettings, RemediationSettings, SpareSettings, WebhookSettings
from medic_core.slurm import SlurmError
from remediation.episodes import EpisodeStore
from remediation.ladder import Ladder

if TYPE_CHECKING:  # imported when used: a node without spares never loads them
    from remediation.spares import SparePool

log = logging.getLogger("medic.healthd")


def attach_ladder(daemon: LadderDaemon) -> LadderThread:
    """The ladder for this node, with the daemon as its host and Slurm as the hooks see it."""
    settings = RemediationSettings.from_config(daemon.config)
    webhook = WebhookSettings.from_config(daemon.config)
    hooks = HookSettings.from_config(daemon.config)
    episodes = EpisodeStore(daemon.store)
    seen = SlurmSeen(daemon.node)
    ladder = Ladder(
        daemon.node,
        episodes,
        seen.wrap(automatic_slurm(daemon, hooks, "ladder")),
        DaemonLadderHost(daemon, episodes),
        settings,
    )
    from medic_core.drain_book import DrainBook

    # Medic's drain records, read by the give-back, the isolator and Slurm view
    ladder.book = DrainBook.of(daemon.store, daemon.config.paths, lambda: observe_only(daemon))
    seen.owns = lambda info: ladder.book.ownership(daemon.node, info).recorded
    thread = LadderThread(daemon, ladder, episodes, webhook, seen=seen)
    attach_spares(daemon, ladder, thread)
    attach_burn_in(daemon, ladder, thread)
    attach_isolation(daemon, ladder)
    from healthd.evidence_sources import attach_evidence

    attach_evidence(daemon, ladder)  # bundles on RMA and needs-human (remediation.evidence)
    thread.hangs = watch_hangs(daemon, ProgressAnswers(thread))
    return thread


def attach_burn_in(daemon: LadderDaemon, ladder: Ladder, thread: LadderThread) -> None:
    """Burn-in (remediation.burn_in), `[remediation.burn_in]` read at every use."""
    from medic_core.settings import BurnInSettings
    from remediation.burn_in_runner import BurnInRunner

    def settings() -> BurnInSettings:
        return BurnInSettings.from_config(daemon.config)

    def state_dir() -> Path:
        return daemon.config.paths.state_dir

    ladder.burn_in = settings
    ladder.burn_in_state_dir = state_dir
    thread.burn_in = BurnInRunner(ladder, settings, state_dir=state_dir)


def attach_isolation(daemon: LadderDaemon, ladder: Ladder) -> None:
    """Single-GPU isolation (remediation.isolator), `[remediation.isolation]` read at every
    use: off (the default), the ladder decides none; a record already made is still
    recovered and restored (only GPUs in Medic's own record)."""
    from medic_core.settings import IsolationSettings
    from remediation.isolator import Isolator

    def event(message: str, severity: str) -> None:
        ladder.host.event(message, severity=severity, fault_class="gpu.isolation", target="")

    def isolator() -> Isolator:
        settings = IsolationSettings.from_config(daemon.config)
        return Isolator(
            daemon.node, ladder.store, ladder.slurm, settings, event=event, book=ladder.book
        )

    ladder.isolation = isolator


def attach_spares(daemon: LadderDaemon, ladder: Ladder, thread: LadderThread) -> None:
    """Hot spares (remediation.spares), with `[remediation.spares]` read at every use (a
    reload applies at the next): the thread hands spares and fills the pool from listed
    nodes; the ladder offers a repaired node to a short pool before giving it back."""
    from remediation.actions import slurm_env
    from remediation.spares import SparePool, SparesSlurm

    def pool() -> SparePool:
        hooks = HookSettings.from_config(daemon.config)
        slurm = SparesSlurm(env=slurm_env(daemon.config), timeout=hooks.slurm_timeout)
        grace = hooks.launch_budget + 5.0  # the prolog's budget, its actions, slurmctld
        return SparePool(SpareSettings.from_config(daemon.config), slurm, daemon.store,
                         daemon.node, prolog_grace=grace)  # fmt: skip

    def offer() -> str:
        spares = pool()
        if spares.settings.size <= 0:
            return ""
        try:
            return spares.join(daemon.node, thread.deep_findings)
        except SlurmError as exc:  # given back as usual
            log.warning("%s: not taken as a spare: %s", daemon.node, exc)
            return ""

    thread.spares = pool
    ladder.spares = offer
