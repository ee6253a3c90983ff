"""The ladder's single-GPU isolation (remediation.isolator, `[remediation.isolation]`): a
GPU-reset episode's GPU taken out of the node's GRES while the node serves jobs on the
others, and given back once repaired and re-qualified; a failure is a human's to look at."""

from __future__ import annotations

import logging
from collections.abc import Callable

from medic_core.drain_book import LADDER
from medic_core.drain_reason import drain_if_allowed, format_reason
from medic_core.slurm import SlurmError
from remediation import episodes as ep
from remediation.isolation import RESTORED, RESTORING, gres_count, recorded
from remediation.isolator import IsolationError, Isolator
from remediation.ladder_service import LadderService

log = logging.getLogger("medic.remediation")


class LadderIsolation(LadderService):
    """What `Ladder` does for an isolated GPU. Its attributes are `Ladder`'s."""

    isolation: Callable[[], Isolator] | None
    _not_isolated: set[int]

    def _resolve(self, episode: ep.Episode, outcome: str | None = None) -> ep.Episode:
        raise NotImplementedError  # the ladder's own (its progress)

    # ---- single-GPU isolation (remediation.isolator) ----------------------------------

    def _isolate(self, episode: ep.Episode) -> ep.Episode | None:
        """The episode's GPU out of the node's GRES if `[remediation.isolation]` allows; None:
        not isolated (the ladder goes on as before, the node drained whole)."""
        isolator = self.isolation() if self.isolation is not None else None
        if isolator is None or not isolator.settings.enabled or episode.id in self._not_isolated:
            return None
        try:
            info = self.slurm.node(self.node)
        except SlurmError as exc:
            log.warning("%s: no isolation: cannot read Slurm: %s", self.node, exc)
            return None
        total = gres_count(info.gres) if info is not None else None
        try:
            done = isolator.isolate(episode, total) if total else None
        except (IsolationError, SlurmError) as exc:
            return self._isolation_failed(episode, exc)
        if done is None:  # decided once per episode (a GPU still busy retries the reset only)
            self._not_isolated.add(episode.id)
        return done

    def _isolation_recover(self, episode: ep.Episode, state: str) -> ep.Episode:
        """A record left at `intent` (the apply command may not have run) is carried out
        again; one at `restoring` once the node is idle, then the episode resolves."""
        assert self.isolation is not None
        jobs = state == RESTORING and self.host.jobs_running()
        try:
            episode = self.isolation().recover(episode, jobs)
        except (IsolationError, SlurmError) as exc:
            return self._isolation_failed(episode, exc)
        return self._resolved_if_restored(episode)

    def _restore(self, episode: ep.Episode, isolator: Isolator) -> ep.Episode:
        """Repaired and re-qualified: the isolated GPU(s) come back; the node is drained
        until idle (tick's recover finishes it), then resumed by the isolator."""
        try:
            episode = isolator.restore(episode, self.host.jobs_running())
        except (IsolationError, SlurmError) as exc:
            return self._isolation_failed(episode, exc)
        return self._resolved_if_restored(episode)

    def _resolved_if_restored(self, episode: ep.Episode) -> ep.Episode:
        """The episode resolved once its isolation record says the GPU(s) are back."""
        after = recorded(episode.evidence)
        if after is not None and after.state == RESTORED:
            return self._resolve(episode, f"GPU(s) {list(after.gpus)} back in the GRES")
        return episode

    def _drain_whole(self, episode: ep.Episode) -> None:
        reason = format_reason(episode.fault_class, episode.target, "isolated GPU: next rung")
        try:
            drain_if_allowed(
                self.slurm, self.node, reason, self.book, actor=LADDER, episode_id=episode.id
            )
        except SlurmError as exc:
            log.warning("%s: could not drain the node for the next rung: %s", self.node, exc)

    def _isolation_failed(self, episode: ep.Episode, exc: Exception) -> ep.Episode:
        """The apply command failed or Slurm did not show the count: the node's Slurm
        configuration may be half-changed, which is a human's to look at."""
        why = f"single-GPU isolation failed: {str(exc)[:300]}"
        self.host.event(
            why, severity="CRITICAL", fault_class=episode.fault_class, target=episode.target
        )
        return self.store.update(
            episode.id, state=ep.NEEDS_HUMAN, message=f"{episode.message}; {why}"
        )
