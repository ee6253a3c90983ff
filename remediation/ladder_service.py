"""The ladder's part in a node's service (one of remediation.ladder's concerns, beside
admission and isolation): keeping a node out of service while an RMA ticket is open or
until a reboot is verified, giving it back through the one resume path
(remediation.give_back; a short spare pool may take it instead), and the burn-in checks and
marker of a node coming back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from medic_core.drain_book import LADDER
from medic_core.drain_reason import (
    DrainOutcome,
    as_slurm_stores,
    drain_if_allowed,
    format_reason,
    parse_reason,
)
from medic_core.settings import BurnInSettings
from medic_core.slurm import SlurmError
from remediation import episodes as ep
from remediation.ladder_admission import LadderAdmission
from remediation.policy import Rung
from remediation.step import REFUSED, rma_redrain_reason

if TYPE_CHECKING:
    from pathlib import Path


log = logging.getLogger("medic.remediation")

UNEXPECTED_REBOOT = "slurm.unexpected_reboot"  # an adopted drain: burnt in as after a reboot


class LadderService(LadderAdmission):
    """What `Ladder` does to keep a node out of service or give it back. Its attributes
    are `Ladder`'s."""

    spares: Callable[[], str] | None
    burn_in: Callable[[], BurnInSettings] | None
    burn_in_state_dir: Callable[[], Path] | None

    def _keep_rma_out(self) -> None:
        """Called while the node has an open RMA ticket, which keeps it unschedulable: a
        reboot rung's DOWN, then ReturnToService, or a human's resume must not put it back.
        Drain it again."""
        try:
            info = self.slurm.node(self.node)
            if info is None or info.drained:
                return
            own = self.book.ownership(self.node, info) if info.reason else None
            reason = rma_redrain_reason(
                info.reason,
                own.recorded if own is not None else None,
                parse_reason(info.reason) is not None,
                format_reason("rma.open", "", "RMA ticket open"),
            )
            if reason is None:
                return
            self.book.record_drain(self.node, as_slurm_stores(reason), actor=LADDER)
            self.slurm.drain(self.node, reason)
        except SlurmError as exc:
            log.warning("%s: could not keep the RMA node drained: %s", self.node, exc)
            return
        self.host.event(
            "RMA ticket open: node drained again",
            severity="WARN",
            fault_class="rma.open",
            target="",
        )

    def _keep_out_until_verified(self, episode: ep.Episode) -> None:
        """Slurm may put a rebooted node back in service before Medic verified it:
        `ReturnToService=2` returns a DOWN node that registers (a reboot past ResumeTimeout
        loses Medic's reason to "reboot timed out" first). Drain it again until verified."""
        reason = format_reason(episode.fault_class, episode.target, "rebooted, verifying")
        try:
            outcome = drain_if_allowed(
                self.slurm, self.node, reason, self.book, actor=LADDER, episode_id=episode.id
            )
        except SlurmError as exc:
            log.warning("%s: could not keep the rebooted node out: %s", self.node, exc)
            return
        if outcome is DrainOutcome.DRAINED:
            self.host.event(
                "rebooted: Slurm put the node back in service before it was verified; drained"
                " again until it is",
                severity="WARN",
                fault_class=episode.fault_class,
                target=episode.target,
            )

    def _give_back(self, episode: ep.Episode) -> str:
        """Resume the node through the decision core (remediation.give_back): only a drain
        Medic's records hold, never with an RMA ticket open."""
        from remediation import tickets
        from remediation.give_back import give_back

        rma_open = tickets.open_tickets(self.store.store, self.node)
        if rma_open:
            return "kept out: an RMA ticket is open"
        if self.spares is not None:  # a short spare pool takes it (remediation.spares)
            joined = self.spares()
            if joined:
                return joined
        done = give_back(
            self.slurm,
            self.book,
            self.node,
            actor=LADDER,
            episode_id=episode.id,
            resolving=episode.id,
            rma_open=rma_open,
        )
        return done.text

    def _burn_in_checks(self, episode: ep.Episode) -> tuple[str, tuple[str, ...]]:
        """(reason, checks) of burn-in this verification adds (remediation.burn_in)."""
        if self.burn_in is None:
            return "", ()
        from remediation.burn_in_record import ladder_checks

        rebooted = episode.fault_class == UNEXPECTED_REBOOT or any(
            s.action == Rung.REBOOT.word and not s.output.startswith(REFUSED)
            for s in self.store.steps(episode.id)
        )
        return ladder_checks(self.burn_in(), self.store.store, self.node, episode.id, rebooted)

    def _burnt_in(self, reason: str, checks: Sequence[str]) -> None:
        if checks:
            from remediation.burn_in_record import record_pass

            state_dir = self.burn_in_state_dir() if self.burn_in_state_dir else None
            record_pass(self.store.store, self.node, reason, checks, state_dir)
