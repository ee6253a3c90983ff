"""Burn-in on the node's own daemon: gather the facts, let remediation.burn_in decide, act.

Ticked by the ladder's thread before the ladder. The order of writes makes a crash safe:
the drain comes before the record (a restart finds the drain Medic's and runs the checks),
the record says `running` before the checks start (a restart runs them again, counting the
runs), and `passed` is written before the resume (a restart finds it qualified and only
resumes). A failure is admitted to the ladder as a sweep's is; its episode id is written
into the record, and until it is, the hand-over is retried.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from medic_core.drain_book import BURN_IN as BURN_IN_ACTOR
from medic_core.drain_reason import (
    BURN_IN,
    DrainOutcome,
    drain_if_allowed,
    is_burn_in_reason,
)
from medic_core.settings import BurnInSettings
from medic_core.slurm import SlurmError
from medic_core.status import Status
from medic_core.vocabulary import Finding
from remediation import burn_in as bi
from remediation.burn_in_record import mirror, read_record, write_record
from remediation.decide import NodeFacts
from remediation.ladder import Ladder

log = logging.getLogger("medic.burn_in")

SLURM_RETRY = 30.0  # seconds between tries while Slurm cannot be read or refuses the drain


class BurnInRunner:
    def __init__(
        self,
        ladder: Ladder,
        settings: Callable[[], BurnInSettings],
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        state_dir: Callable[[], Path] | None = None,
    ) -> None:
        self.ladder = ladder
        # The node's state dir (read at each use: a reload may move it), where the record's
        # pass is mirrored for the prolog without the daemon (remediation/burn_in_marker.py).
        self.state_dir = state_dir
        self.node = ladder.node
        self.store = ladder.store.store
        self.settings = settings
        self.clock = clock
        self.now = now
        self._retry_at = 0.0
        # The settings under which there was nothing left to do (passed, handed to the
        # ladder, or off): Slurm is not asked again every tick until a reload changes them.
        self._settled: BurnInSettings | None = None

    # ---- the record ------------------------------------------------------------------------

    def record(self) -> bi.Record | None:
        return read_record(self.store, self.node)

    def write(self, record: bi.Record, message: str) -> None:
        state_dir = self.state_dir() if self.state_dir is not None else None
        write_record(self.store, self.node, record, message, self.now(), state_dir)

    def mirror(self) -> None:
        """The pass file brought in line with the record (the daemon's start): a node that
        passed before the file existed gets it, one whose record is gone loses it."""
        if self.state_dir is not None:
            mirror(self.state_dir(), self.node, self.record(), keep=True)

    def _passed_before(self, checks: Sequence[str]) -> bool:
        if not checks:
            return False
        for check in checks:
            found = self.store.conditions(self.node, type=check)
            if not found or any(c.status is not Status.OK for c in found):
                return False
        return True

    # ---- the tick --------------------------------------------------------------------------

    def facts(self, settings: BurnInSettings) -> bi.BurnInFacts:
        from remediation import tickets

        info = self.ladder.slurm.node(self.node)
        own = self.ladder.book.ownership(self.node, info)
        slurm = (
            NodeFacts(True, info.drained, info.down, info.reason, own.recorded, own.held)
            if info is not None
            else NodeFacts(known=False)
        )
        episode = self.ladder.store.open_for(self.node)
        record = self.record()
        return bi.BurnInFacts(
            record=record,
            checks=tuple(settings.new_node),
            slurm=slurm,
            jobs_running=self.ladder.host.jobs_running(),
            open_episode=episode.id if episode is not None else None,
            rma_open=tuple(tickets.open_tickets(self.store, self.node)),
            passed_before=record is None and self._passed_before(settings.new_node),
            max_attempts=settings.max_attempts,
        )

    def tick(self) -> bi.BurnInDecision | None:
        """One step; None while waiting out a Slurm failure, or when settled."""
        if self.clock() < self._retry_at:
            return None
        settings = self.settings()
        if settings is self._settled:
            return None
        try:
            decision = self._step(settings)
            if decision.step is bi.Step.DRAIN:  # drained: carry on at once (run, or wait)
                decision = self._step(settings)
        except SlurmError as exc:
            self._retry_at = self.clock() + SLURM_RETRY
            log.warning("%s: burn-in waits for Slurm: %s", self.node, exc)
            return None
        if decision.step is bi.Step.NOTHING:
            self._settled = settings
        return decision

    def settled(self) -> bool:
        """Nothing left to do under the settings in force (tick() returns None at once)."""
        return self._settled is not None and self._settled is self.settings()

    def drain_first(self) -> bool:
        """Only the drain, at once: the daemon calls it before it tells systemd it is ready,
        and systemd starts slurmd after that (Before=slurmd.service), so a node never burnt
        in is out of service before Slurm can place a job on it. Never runs the checks
        (they take minutes: the ladder's thread does). True when it drained. The pass file
        is brought in line with the record first."""
        settings = self.settings()
        self.mirror()
        try:
            if (
                self._off(settings)
                or bi.decide_burn_in(self.facts(settings)).step is not bi.Step.DRAIN
            ):
                return False
            self._step(settings, drain_only=True)
        except SlurmError as exc:
            log.warning("%s: burn-in drain at start-up failed (the first tick tries): %s",
                        self.node, exc)  # fmt: skip
            return False
        return True

    def _off(self, settings: BurnInSettings) -> bool:
        """new_node off and no record: nothing to do, and Slurm is not asked (the daemon asks
        Slurm nothing before a fault when burn-in is off)."""
        return not settings.new_node and self.record() is None

    def _step(self, settings: BurnInSettings, drain_only: bool = False) -> bi.BurnInDecision:
        if self._off(settings):
            return bi.BurnInDecision(bi.Step.NOTHING, "new_node burn-in is off")
        facts = self.facts(settings)
        decision = bi.decide_burn_in(facts)
        step, record = decision.step, facts.record
        if drain_only and step is not bi.Step.DRAIN:
            return decision
        if step is bi.Step.ADOPT:
            self.write(bi.Record(bi.Phase.PASSED, bi.NEW_NODE, facts.checks, note="adopted"),
                       "burn-in checks passed here before: adopted")  # fmt: skip
            self._event(f"burn-in adopted: {' '.join(facts.checks)} passed here before", "INFO")
        elif step is bi.Step.DRAIN:
            reason = bi.drain_reason(bi.NEW_NODE, facts.checks)
            outcome = drain_if_allowed(
                self.ladder.slurm, self.node, reason, self.ladder.book, actor=BURN_IN_ACTOR
            )
            if outcome is DrainOutcome.DRAINED:
                self._event(f"never burnt in: drained ({reason})", "WARN")
            if record is None:  # pending: switching new_node off gives the node back
                self.write(bi.Record(bi.Phase.RUNNING, bi.NEW_NODE, facts.checks),
                           "burn-in pending: drained, waiting to run")  # fmt: skip
        elif step is bi.Step.RUN:
            self._run(facts, record)
        elif step is bi.Step.FAIL:
            assert record is not None
            finding = Finding(
                bi.CONDITION, Status.CRITICAL, f"{bi.CONDITION}.interrupted", "", decision.why
            )
            self._failed(record, [finding], settings)
        elif step is bi.Step.HAND:
            assert record is not None
            self._hand(record, settings)
        elif step is bi.Step.WAIVE:
            self.write(bi.Record(bi.Phase.WAIVED, bi.NEW_NODE, note="new_node = []"),
                       "burn-in switched off while the node waited")  # fmt: skip
            self._event("new_node burn-in switched off: waived", "INFO")
            self._resume_if_burn_in()
        elif step is bi.Step.RESUME:
            from remediation.give_back import give_back

            done = give_back(
                self.ladder.slurm,
                self.ladder.book,
                self.node,
                actor=BURN_IN_ACTOR,
                open_episode=facts.open_episode,
                rma_open=facts.rma_open,
            )
            self._event(f"burnt in: {done.text}", "INFO")
        return decision

    def _run(self, facts: bi.BurnInFacts, record: bi.Record | None) -> None:
        attempts = (record.attempts if record is not None else 0) + 1
        running = bi.Record(bi.Phase.RUNNING, bi.NEW_NODE, facts.checks, attempts)
        self.write(running, f"burn-in run {attempts}: {' '.join(facts.checks)}")
        self._event(f"burn-in run {attempts} started: {' '.join(facts.checks)}", "INFO")
        started = self.clock()
        findings = self.ladder.host.verify(facts.checks)
        seconds = self.clock() - started
        if bi.blocking(findings):
            self._failed(running, findings, self.settings())
            return
        passed = bi.Record(bi.Phase.PASSED, bi.NEW_NODE, facts.checks, attempts)
        self.write(passed, f"burn-in passed in {seconds:.1f}s: {' '.join(facts.checks)}")
        self._event(f"burn-in passed in {seconds:.1f}s", "INFO")
        # Given back at once when nothing else holds it (the next tick would too).
        self._step(self.settings())

    def _failed(self, record: bi.Record, findings: list[Finding], settings: BurnInSettings) -> None:
        first = bi.blocking(findings)[0]
        failed = bi.Record(bi.Phase.FAILED, record.reason, record.checks, record.attempts)
        self.write(failed, f"burn-in failed: {first.check} {first.status.value}: {first.message}")
        self._event(
            f"burn-in failed: {first.check} {first.status.value}: {first.message}", "CRITICAL"
        )
        self._hand(failed, settings, findings)

    def _hand(
        self,
        record: bi.Record,
        settings: BurnInSettings,
        findings: list[Finding] | None = None,
    ) -> None:
        """The ladder's own admission, as a sweep's failure (remediation/sweep/runner.py):
        the node is Medic's already, so nothing new is drained and the cap holds nothing."""
        if findings is None:
            findings = [
                Finding(bi.CONDITION, Status.CRITICAL, f"{bi.CONDITION}.{record.reason}", "",
                        f"burn-in failed: {' '.join(record.checks)}")
            ]  # fmt: skip
        admission = self.ladder.admit(bi.for_ladder(findings, settings.failure_rung))
        if admission.drain:  # put back in service meanwhile: out again, with the fault's reason
            episode = admission.episode.id if admission.episode is not None else None
            outcome = drain_if_allowed(
                self.ladder.slurm,
                self.node,
                admission.decision.reason,
                self.ladder.book,
                actor=BURN_IN_ACTOR,
                episode_id=episode,
            )
            self.ladder.drained(admission, outcome.value)
        if admission.episode is None:
            log.warning("%s: burn-in failure not recorded by the ladder: %s", self.node,
                        admission.store_down or admission.why)  # fmt: skip
            return
        self.write(
            bi.Record(bi.Phase.FAILED, record.reason, record.checks, record.attempts,
                      admission.episode.id),
            f"burn-in failed: handed to the ladder, episode {admission.episode.id}",
        )  # fmt: skip
        self._event(f"burn-in failed: episode {admission.episode.id} ({admission.why})", "WARN")

    def _resume_if_burn_in(self) -> None:
        info = self.ladder.slurm.node(self.node)
        if info is None or not is_burn_in_reason(info.reason):
            return
        self._step(self.settings())

    def _event(self, message: str, severity: str) -> None:
        self.ladder.host.event(message, severity=severity, fault_class=BURN_IN, target="")
