"""Single-GPU isolation carried out: the site's apply command, Slurm's confirmation, and
Medic's record of it in the episode's evidence (remediation.isolation decides and plans).

Every transition is written before it is acted on, and the apply command sets a state (the
node's GRES without these GPUs), so a daemon that dies half-way runs it again after its
restart (`recover`) and never takes a second decision. Only GPUs in Medic's own record are
ever put back. Both transitions need the node without running jobs: Slurm 22.05 kills a job
whose node's GPU count changes under it ("gres/gpu count mismatch"), so the node stays
drained (Medic's reason) until it is idle.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from medic_core import proc
from medic_core.drain_book import ISOLATOR, DrainBook
from medic_core.drain_reason import drain_if_allowed, format_reason
from medic_core.settings import IsolationSettings
from medic_core.slurm import SlurmClient
from medic_core.slurm_release import gres_change_env
from remediation import episodes as ep
from remediation.isolation import (
    APPLIED,
    EVIDENCE_KEY,
    INTENT,
    RESTORED,
    RESTORING,
    IsolationRecord,
    decide_isolation,
    gres_count,
    plan,
    recorded,
)

log = logging.getLogger("medic.isolation")

Event = Callable[[str, str], None]  # (message, severity)
RESTORE_FAULT = "gpu.isolation.restore"


class IsolationError(RuntimeError):
    """The apply command failed or Slurm did not show the new count in time."""


def _log_event(message: str, severity: str) -> None:
    log.log(logging.WARNING if severity != "INFO" else logging.INFO, "%s", message)


@dataclass
class Isolator:
    node: str
    store: ep.EpisodeStore
    slurm: SlurmClient
    settings: IsolationSettings
    event: Event = field(default=_log_event)
    run: Callable[..., proc.CommandResult] = field(default=proc.run)
    sleep: Callable[[float], None] = field(default=time.sleep)
    # Medic's drain records (medic_core.drain_book); None: the episode store's, no journal.
    book: DrainBook | None = None

    @property
    def drains(self) -> DrainBook:
        return self.book if self.book is not None else DrainBook.of(self.store.store)

    # ---- take a GPU out ------------------------------------------------------------------

    def isolate(self, episode: ep.Episode, gpus_total: int) -> ep.Episode | None:
        """Isolate the episode's GPU if policy allows: None when it does not (the node stays
        drained and the ladder goes on as before). Call with the node idle."""
        mine = recorded(episode.evidence)
        already = mine.gpus if mine and mine.state in (INTENT, APPLIED) else ()
        decision = decide_isolation(
            episode.fault_class,
            episode.target,
            gpus_total=gpus_total,
            isolated=already,
            settings=self.settings,
        )
        if not decision.isolate:
            self.event(f"no isolation: {decision.why}", "INFO")
            return None
        if mine and mine.state == APPLIED and mine.gpus == decision.gpus:
            return episode
        record = IsolationRecord(decision.gpus, gpus_total, INTENT)
        episode = self._write(episode, record)  # the intent, before anything is done
        self.event(f"isolating GPU(s) {list(decision.gpus)}: {decision.why}", "WARN")
        return self._carry_out(episode, record)

    # ---- put it back ---------------------------------------------------------------------

    def restore(self, episode: ep.Episode, jobs_running: bool) -> ep.Episode:
        """After the GPU's repair and re-qualification, every GPU Medic isolated returns.
        First the node is drained (a count change would kill its jobs); once no job runs
        the apply command runs and the drain is lifted. Call again until RESTORED."""
        mine = recorded(episode.evidence)
        if mine is None or mine.state == RESTORED:
            return episode  # nothing of Medic's to undo
        if mine.state in (INTENT, APPLIED):
            reason = format_reason(RESTORE_FAULT, "gpu" + ",".join(str(g) for g in mine.gpus))
            outcome = drain_if_allowed(
                self.slurm, self.node, reason, self.drains, actor=ISOLATOR, episode_id=episode.id
            )
            mine = mine.moved(RESTORING)
            episode = self._write(episode, mine)
            self.event(f"GPU(s) {list(mine.gpus)} repaired: drain to restore ({outcome})", "INFO")
        if jobs_running:
            return episode
        return self._carry_out(episode, mine)

    # ---- after a crash -------------------------------------------------------------------

    def recover(self, episode: ep.Episode, jobs_running: bool) -> ep.Episode:
        """A transition that was recorded but not confirmed is carried out again (the same
        state: the command sets it, so a second run changes nothing more)."""
        mine = recorded(episode.evidence)
        if mine is None or mine.state in (APPLIED, RESTORED):
            return episode
        if mine.state == RESTORING and jobs_running:
            return episode
        return self._carry_out(episode, mine)

    # ---- inside --------------------------------------------------------------------------

    def _write(self, episode: ep.Episode, record: IsolationRecord) -> ep.Episode:
        evidence = {**episode.evidence, EVIDENCE_KEY: record.to_json()}
        return self.store.update(episode.id, evidence=evidence)

    def _carry_out(self, episode: ep.Episode, record: IsolationRecord) -> ep.Episode:
        out = record.gpus if record.state == INTENT else ()
        target = plan(record.gpus_total, out)
        argv = target.argv(self.settings.apply, self.node)
        # How the new count takes effect on the release Slurm says it is (restart or
        # reconfigure: medic_core.slurm_release), for the command to follow.
        env = {**os.environ, **gres_change_env(self.slurm)}
        result = self.run(argv, timeout=self.settings.apply_timeout, env=env)
        if not result.ok:
            self.event(f"isolation apply failed: {result.describe_failure()}", "CRITICAL")
            raise IsolationError(f"{' '.join(argv)}: {result.describe_failure()}")
        self._settle(target.count)
        done = record.moved(APPLIED if record.state == INTENT else RESTORED)
        episode = self._write(episode, done)
        from remediation.give_back import give_back

        given = give_back(
            self.slurm,
            self.drains,
            self.node,
            actor=ISOLATOR,
            episode_id=episode.id,
            resolving=episode.id,
        )
        self.event(
            f"{self.node} offers {target.gres} (isolated: {list(out)}); resume: {given.text}",
            "WARN" if out else "INFO",
        )
        return episode

    def _settle(self, count: int) -> None:
        """Wait until Slurm shows the node registered again with `count` GPUs."""
        deadline = time.monotonic() + self.settings.settle_timeout
        seen = "nothing"
        while True:
            info = self.slurm.node(self.node)
            if info is not None:
                seen = f"Gres={info.gres} State={'+'.join(sorted(info.states))}"
                # Registered again (a node still UNKNOWN after slurmctld's restart refuses
                # `state=resume`) with a count Slurm accepted (not INVAL).
                invalid = any(s.startswith("INVAL") for s in info.states)
                registered = info.state != "UNKNOWN" and "NOT_RESPONDING" not in info.flags
                if gres_count(info.gres) == count and registered and not invalid:
                    return
            if time.monotonic() > deadline:
                raise IsolationError(
                    f"{self.node}: Slurm does not show gpu:{count} after"
                    f" {self.settings.settle_timeout:.0f}s (last seen: {seen})"
                )
            self.sleep(0.1)
