"""The releaser makes a requeued job eligible once slurmctld's clock has left the second of the
requeue, and never before: slurmd kills a job whose new credential carries the second in
which it revoked the old one (Slurm's cred_revoked: `cred->ctime <= j->revoked`)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medic_core.slurm import JobInfo
from medic_core.slurm_clock import parse_sdiag_time
from slurm_hooks import release
from tests.fakes import FakeSlurm


class FakeTime:
    """time.monotonic, time.time and time.sleep on one fake clock (the node's)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class Controller(FakeSlurm):
    """slurmctld whose clock runs `skew` seconds off the node's and which notes its own
    clock at the releaser's start_now."""

    def __init__(self, clock: FakeTime, skew: float) -> None:
        super().__init__(["n1", "n2"], clock=lambda: clock.now + skew)
        self.started_at: float | None = None

    def start_now(self, job_id: str) -> None:
        self.started_at = self.clock()
        super().start_now(job_id)


def requeued_job(slurm: FakeSlurm) -> None:
    slurm.start_job("7", "n1")
    slurm.requeue("7")  # PENDING, reason BeginTime, one more restart


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    clock = FakeTime(1_000_000.3)
    monkeypatch.setattr(release, "time", clock)
    return clock


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(min_value=0, max_value=1, exclude_max=True),
    skew=st.floats(min_value=-0.9, max_value=0.9),
)
def test_eligible_only_in_a_later_controller_second(start: float, skew: float) -> None:
    clock = FakeTime(1_000_000 + start)
    original = release.time
    release.time = clock  # type: ignore[assignment]
    try:
        slurm = Controller(clock, skew)
        requeued_job(slurm)
        requeued_second = int(slurm.clock())
        action, _ = release.release_when_held(
            slurm, "7", wait=30, restarts_before=0, after_requeue=True
        )
    finally:
        release.time = original
    assert action == "made_eligible"
    assert slurm.started_at is not None
    assert int(slurm.started_at) > requeued_second
    # At most the rest of that second, a poll and the first look's margin: not a fixed 2 s.
    assert slurm.started_at - (1_000_000 + start + skew) <= 1.0 + 0.1 + 0.011


def test_a_second_already_passed_needs_no_wait_beyond_it(fake_time: FakeTime) -> None:
    slurm = Controller(fake_time, skew=0.0)
    requeued_job(slurm)
    action, line = release.release_when_held(
        slurm, "7", wait=30, restarts_before=0, after_requeue=True
    )
    assert action == "made_eligible", line
    assert slurm.started_at is not None
    assert 1_000_001.0 <= slurm.started_at <= 1_000_001.1
    assert ("start_now", "7") in slurm.calls


def test_without_the_controllers_clock_it_waits_the_grace(fake_time: FakeTime) -> None:
    slurm = Controller(fake_time, skew=0.0)
    slurm.fail("controller_time", times=None)  # sdiag refused or unreadable, every time
    requeued_job(slurm)
    action, _ = release.release_when_held(
        slurm, "7", wait=30, restarts_before=0, after_requeue=True
    )
    assert action == "made_eligible"
    assert slurm.started_at is not None
    assert slurm.started_at - 1_000_000.3 >= release.REVOKE_GRACE


def test_a_job_held_for_the_prolog_is_released_at_once_and_made_eligible_later(
    fake_time: FakeTime,
) -> None:
    slurm = Controller(fake_time, skew=0.0)
    slurm.start_job("7", "n1")
    job = slurm.jobs_["7"]
    job.state, job.node, job.reason = "PENDING", "", "launch_failed_requeued_held"
    action, _ = release.release_when_held(
        slurm, "7", wait=30, restarts_before=0, after_requeue=True
    )
    assert action == "released"
    writes = [c for c in slurm.calls if c[0] in ("release", "start_now")]
    assert writes == [("release", "7"), ("start_now", "7")]
    assert slurm.started_at is not None and int(slurm.started_at) > 1_000_000


def test_a_controller_clock_that_never_moves_ends_at_the_deadline(
    fake_time: FakeTime,
) -> None:
    slurm = Controller(fake_time, skew=0.0)
    slurm.clock = lambda: 1_000_000.5  # a stuck answer: never a later second
    requeued_job(slurm)
    action, line = release.release_when_held(
        slurm, "7", wait=10, restarts_before=0, after_requeue=True
    )
    assert action == "left_alone" and "not held within 10s" in line
    assert slurm.started_at is None
    assert fake_time.now - 1_000_000.3 <= 10 + 0.2


SDIAG_2205 = """*******************************************************
sdiag output at Sat Nov 28 17:05:01 2026 (1795885501)
Data since      Sat Nov 28 16:58:53 2026 (1795885133)
*******************************************************
Server thread count:  3
"""


def test_sdiag_time_as_slurm_prints_it() -> None:
    assert parse_sdiag_time(SDIAG_2205) == 1795885501
    assert parse_sdiag_time("sdiag: error: Unable to contact slurm controller") is None
    assert parse_sdiag_time("") is None
    # A later "Data since" line is never taken for the first.
    assert parse_sdiag_time(SDIAG_2205.replace("sdiag output at", "output at")) is None


@given(st.text(max_size=300))
def test_sdiag_time_never_raises_on_odd_text(text: str) -> None:
    second = parse_sdiag_time(text)
    assert second is None or second >= 0


def test_a_second_read_right_after_the_requeue_is_the_one_waited_past(
    fake_time: FakeTime,
) -> None:
    """The daemon's releaser reads slurmctld's second before its imports: when the job is
    seen requeued the controller may already be a second on, and nothing more is waited."""
    slurm = Controller(fake_time, skew=0.0)
    requeued_job(slurm)
    fake_time.now += 0.9  # the releaser's imports on a loaded node
    action, _ = release.release_when_held(
        slurm, "7", wait=30, restarts_before=0, requeued_second=1_000_000, after_requeue=True
    )
    assert action == "made_eligible"
    assert slurm.started_at is not None and slurm.started_at < 1_000_001.3


class HeldAMomentLater(Controller):
    """A prolog's refusal as 22.05 shows it: requeued (BeginTime) first, held a moment later."""

    def __init__(self, clock: FakeTime, held_at: float) -> None:
        super().__init__(clock, skew=0.0)
        self.held_at = held_at

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]:
        job = self.jobs_["7"]
        if self.clock() >= self.held_at and job.reason == "BeginTime" and not self.released:
            job.reason = "launch_failed_requeued_held"
        return super().jobs(ids)

    released = False

    def release(self, job_id: str) -> None:
        self.released = True
        self.jobs_[job_id].reason = "BeginTime"
        super().release(job_id)


def test_a_refused_job_seen_requeued_before_it_is_held_is_released(fake_time: FakeTime) -> None:
    """The prolog's releaser (no --requeued): a job that shows BeginTime a moment before
    Slurm holds it is released, not only made eligible and left held for ever."""
    slurm = HeldAMomentLater(fake_time, held_at=1_000_000.3 + 1.0)
    requeued_job(slurm)
    action, line = release.release_when_held(slurm, "7", wait=30, restarts_before=0)
    assert action == "released", line
    assert [c[0] for c in slurm.calls if c[0] in ("release", "start_now")] == [
        "release",
        "start_now",
    ]
