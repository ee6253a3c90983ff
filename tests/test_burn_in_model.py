"""Burn-in as a state machine (hypothesis): one node's daemon (its burn-in runner and its
ladder, tests/test_burn_in.py's world) under any order of ticks, daemon crashes mid-check,
jobs, admin drains and resumes, deep checks that fail or pass, burn-in switched off and on,
and reboots the ladder asks for. After every step:

* a job only ever starts on a node that passed its burn-in, unless a human put the node in
  service or switched burn-in off;
* Medic never lifts nor rewrites an admin's drain;
* a node Medic drained for burn-in is not in service while its record is not qualified.
"""

from __future__ import annotations

import shutil
import tempfile
import types
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from medic_core.drain_reason import is_burn_in_reason
from medic_core.store import open_store
from remediation import ladder as ladder_module
from tests.test_burn_in import BurnWorld
from tests.test_ladder_unit import Crash, World

ADMIN = "admin: cabling"
_TEMPLATE: list[Path] = []


def template() -> Path:
    """A migrated store, made once per process and copied for each sequence."""
    if not _TEMPLATE:
        path = Path(tempfile.mkdtemp(prefix="burn-in-model-")) / "template.db"
        with open_store(f"sqlite:///{path}"):
            pass
        _TEMPLATE.append(path)
    return _TEMPLATE[0]


class BurnInModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="burn-in-seq-"))
        db = self.dir / "medic.db"
        shutil.copyfile(template(), db)
        self.w = World(db)
        self.bw = BurnWorld(self.w)
        self._saved = (ladder_module.time, ladder_module.proc)
        ladder_module.time = types.SimpleNamespace(monotonic=self.w.clock.monotonic)  # type: ignore[assignment]
        ladder_module.proc = types.SimpleNamespace(run=self.w.run_command)  # type: ignore[assignment]
        self.admin = False  # an admin's drain stands
        self.excused = False  # a human resumed the node, or burn-in was switched off
        self.jobs = 0
        # systemd starts medic-healthd before slurmd (Before=slurmd.service): Slurm places
        # no job on the node before the daemon's first tick.
        self.started = False

    def teardown(self) -> None:
        ladder_module.time, ladder_module.proc = self._saved  # type: ignore[assignment]
        self.w.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def slurm_node(self):  # type: ignore[no-untyped-def]
        return self.w.slurm.by_name["n1"]

    def qualified(self) -> bool:
        record = self.bw.record("n1")
        return record is not None and record.qualified

    # ---- the daemon -------------------------------------------------------------------------

    @rule()
    def tick(self) -> None:
        asked = self.slurm_node.reboot_next
        self.bw.burn("n1")
        try:
            self.w.tick("n1")
        except Crash:
            self.w.restart("n1")
        if asked and self.slurm_node.reboot_next and not self.w.slurm.running_on("n1"):
            self.w.reboot_happens("n1")
        self.w.clock.advance(20.0)
        self.started = True

    @rule()
    def crash_in_the_next_check(self) -> None:
        self.w.crasher.armed = "verifying"

    @rule()
    def restart_daemon(self) -> None:
        self.w.restart("n1")

    @rule(bad=st.booleans())
    def deep_checks(self, bad: bool) -> None:
        self.bw.node("n1").deep_bad = bad

    @rule(on=st.booleans())
    def new_node_setting(self, on: bool) -> None:
        self.bw.configure(new_node=("deep_dcgm",) if on else ())
        if not on:
            self.excused = True

    # ---- the cluster ------------------------------------------------------------------------

    @precondition(lambda self: self.started and not self.w.slurm.running_on("n1"))
    @rule()
    def submit_a_job(self) -> None:
        """Slurm starts a job only on a node in service."""
        if not self.slurm_node.in_service:
            return
        assert self.qualified() or self.excused, "a job started on a node never burnt in"
        self.jobs += 1
        self.w.slurm.start_job(f"j{self.jobs}", "n1")

    @precondition(lambda self: self.w.slurm.running_on("n1"))
    @rule()
    def job_ends(self) -> None:
        self.w.slurm.end_job(f"j{self.jobs}")

    @rule()
    def admin_drains(self) -> None:
        self.w.slurm.admin_drain("n1", ADMIN)
        self.admin = True

    @precondition(lambda self: self.admin)
    @rule()
    def admin_resumes(self) -> None:
        self.w.slurm.admin_resume("n1")
        self.admin = False
        self.excused = True

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def an_admins_drain_stands(self) -> None:
        if self.admin:
            # Out of service with the admin's reason (a reboot the ladder asked before the
            # admin's drain leaves the node DOWN, the reason kept).
            assert not self.slurm_node.in_service and self.slurm_node.reason == ADMIN

    @invariant()
    def a_burn_in_drain_holds_until_qualified(self) -> None:
        if is_burn_in_reason(self.slurm_node.reason):
            assert not self.slurm_node.in_service


BurnInModel.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBurnInModel = BurnInModel.TestCase
