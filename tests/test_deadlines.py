"""healthd.deadlines, the one mechanism under the check runner's lanes and the NVML client's
sweeps and calls (issue 25, point 4), driven as both drive it: random sequences of items
(returning, raising, hanging) over a random number of lanes, with a new lane for the rest
after each overrun. The model: an item is answered if and only if it returns before its
deadline; and a stall of the whole process (the caller waking late) is not a hang."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.deadlines import STALL_SLACK, Abandoned, Item, Lane, Timekeeper
from healthd.workers import WorkerPool

QUICK_TIMEOUT = 30.0  # an item that returns at once never meets it, however loaded CI is


@dataclass
class Drive:
    """A run as the runner makes one: a queue of items, lanes that pull from it."""

    kinds: list[str]
    keeper: Timekeeper[int]
    release: threading.Event
    queue: deque[int] = field(default_factory=deque)
    answered: list[int] = field(default_factory=list)
    raised: list[int] = field(default_factory=list)
    ran_on: dict[int, int] = field(default_factory=dict)  # item -> lane number
    lane_numbers: dict[int, int] = field(default_factory=dict)  # id(lane) -> number

    def start_lane(self) -> None:
        self.keeper.start(self.lane, "test-lane")

    def lane(self, lane: Lane[int]) -> None:
        with self.keeper.cond:
            number = self.lane_numbers.setdefault(id(lane), len(self.lane_numbers))
        while True:
            with self.keeper.cond:
                if lane.abandoned or not self.queue:
                    return
                index = self.queue.popleft()
            kind = self.kinds[index]
            timeout = 0.02 if kind == "hang" else QUICK_TIMEOUT
            try:
                with self.keeper.item(lane, f"item{index}", index, timeout):
                    self.ran_on[index] = number
                    if kind == "hang":
                        self.release.wait(60)
                    elif kind == "raise":
                        raise ValueError(index)
            except ValueError:
                with self.keeper.cond:
                    self.raised.append(index)
                continue
            with self.keeper.cond:
                self.answered.append(index)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(["ok", "ok", "raise", "hang"]), max_size=12),
    lanes=st.integers(min_value=1, max_value=4),
)
def test_an_item_is_answered_if_and_only_if_it_returns_in_time(
    kinds: list[str], lanes: int
) -> None:
    release = threading.Event()
    drive = Drive(kinds, Timekeeper(WorkerPool("test")), release)
    drive.queue.extend(range(len(kinds)))
    overran: list[Item[int]] = []
    try:
        with drive.keeper.cond:
            for _ in range(min(lanes, len(kinds))):
                drive.start_lane()
            for lane, item in drive.keeper.overran():
                assert lane.abandoned and not item.ended
                overran.append(item)
                if drive.queue:
                    drive.start_lane()
        assert not drive.keeper.lanes  # overran() returns once every lane is over
        hung = sorted(i for i, k in enumerate(kinds) if k == "hang")
        assert sorted(item.tag for item in overran) == hung
        assert sorted(drive.answered) == [i for i, k in enumerate(kinds) if k == "ok"]
        assert sorted(drive.raised) == [i for i, k in enumerate(kinds) if k == "raise"]
        # A lane whose item overran takes no other item after it; every item ran once.
        assert sorted(drive.ran_on) == list(range(len(kinds)))
        for index in hung:
            lane = drive.ran_on[index]
            assert not [i for i, n in drive.ran_on.items() if n == lane and i > index]
        # One lane more per overrun at most: a hang costs one thread.
        assert len(drive.lane_numbers) <= min(lanes, len(kinds)) + len(hung)
    finally:
        release.set()


def test_a_hung_item_returning_late_is_abandoned_not_answered() -> None:
    keeper: Timekeeper[int] = Timekeeper(WorkerPool("test"))
    release, after = threading.Event(), []

    def body(lane: Lane[int]) -> None:
        try:
            with keeper.item(lane, "late", 0, 0.02):
                release.wait(60)
        except Abandoned:
            after.append("abandoned")
            raise

    with keeper.cond:
        keeper.start(body, "test-lane")
        found = [item.name for _, item in keeper.overran()]
    assert found == ["late"]
    release.set()
    deadline = time.monotonic() + 30
    while not after and time.monotonic() < deadline:
        with keeper.cond:
            keeper.cond.wait(0.01)
    assert after == ["abandoned"]


def test_a_deadline_that_passed_while_the_process_was_stopped_is_not_a_hang() -> None:
    """CI: a SIGSTOP'd daemon woke to find the call in progress past its deadline; its
    worker, stopped too, had not had its turn. Here the clock jumps 10 s while the item runs
    (a stop), and the item returns only once the caller has seen the jump: it is answered,
    given STALL_GRACE, not reported hung. Without the jump it would have returned in time."""
    offset = [0.0]
    keeper: Timekeeper[int] = Timekeeper(
        WorkerPool("test"), clock=lambda: time.monotonic() + offset[0]
    )
    answered: list[str] = []

    def body(lane: Lane[int]) -> None:
        with keeper.item(lane, "stopped", 0, 0.5) as item, keeper.cond:
            offset[0] += 10 * STALL_SLACK / 0.5  # the whole process stopped for 10 s
            keeper.cond.notify()
            end = time.monotonic() + 30
            while not item.graced and time.monotonic() < end:  # poll: nothing notifies it
                keeper.cond.wait(0.01)
        answered.append(item.name)

    with keeper.cond:
        keeper.start(body, "test-lane")
        found = [item.name for _, item in keeper.overran()]
    assert found == [] and answered == ["stopped"]


def test_a_stall_grants_its_grace_once_then_a_real_hang_is_one() -> None:
    offset = [0.0]
    keeper: Timekeeper[int] = Timekeeper(
        WorkerPool("test"), clock=lambda: time.monotonic() + offset[0]
    )
    release = threading.Event()

    def body(lane: Lane[int]) -> None:
        with keeper.item(lane, "hung", 0, 0.05):
            with keeper.cond:
                offset[0] += 10.0
                keeper.cond.notify()
            release.wait(60)

    try:
        with keeper.cond:
            keeper.start(body, "test-lane")
            found = [(item.name, item.graced) for _, item in keeper.overran()]
        assert found == [("hung", True)]
    finally:
        release.set()
