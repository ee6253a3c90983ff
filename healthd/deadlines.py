"""Work that may hang, run on pooled workers, each item under its own deadline.

The one mechanism under the check runner (healthd.runner: a run's checks in lanes) and the
NVML client (healthd.nvml_client: a check's sweep over the GPUs, and each single call). A
lane is one worker (healthd.workers) that runs items one after another; each item publishes
itself with its deadline as it starts (`Timekeeper.item`). The caller's thread sleeps in
`watch()` until the earliest deadline of an item in progress, or until every lane is over:
it is not woken once per item. An item still running at its deadline is handed to the
caller once as an overrun: its lane is abandoned (the worker is left to the item, takes no
more, and exits if it ever returns) and the caller decides what goes on, typically a new
lane for the rest. Python cannot kill a thread, and one stuck in a hung driver or mount
cannot be interrupted anyway: a hang costs one thread.

A deadline that passed while the whole process was stopped or starved is not a hang: an
item the caller finds overrun by more than STALL_SLACK (the caller, which sleeps until the
earliest deadline, did not run when it passed: neither, likely, did the item's worker) gets
STALL_GRACE more, once, to finish. A SIGSTOP'd daemon otherwise reported every call in
progress as hung.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from healthd.workers import Worker, WorkerPool

T = TypeVar("T")

STALL_SLACK = 0.5  # seconds past a deadline the caller may wake before a stall is assumed
STALL_GRACE = 1.0  # seconds more for an item found overrun after a stall (at most its timeout)


class Abandoned(BaseException):
    """Raised in a lane's worker when its item returns after the caller gave up on it: the
    lane is over. A BaseException, so no check or plan catches it."""


@dataclass(eq=False)
class Item(Generic[T]):
    """What a lane runs now, as the caller sees it."""

    name: str
    tag: T
    timeout: float
    started: float
    deadline: float
    ended: bool = False  # returned or raised
    graced: bool = False  # given STALL_GRACE once already

    def returned(self) -> bool:
        return self.ended


@dataclass(eq=False)
class Lane(Generic[T]):
    worker: Worker | None = None
    current: Item[T] | None = None
    abandoned: bool = False


@dataclass(eq=False)
class Timekeeper(Generic[T]):
    """One set of lanes and the caller that keeps their time. `end`: a deadline no item
    outlives (a budget for them all). `clock`: monotonic seconds (a test moves it)."""

    pool: WorkerPool
    end: float | None = None
    clock: Callable[[], float] = time.monotonic
    cond: threading.Condition = field(default_factory=threading.Condition)
    lanes: list[Lane[T]] = field(default_factory=list)  # running, not abandoned
    wake_at: float = math.inf  # when the caller, asleep, wakes by itself

    def start(self, body: Callable[[Lane[T]], None], name: str) -> Lane[T]:
        """A new lane running `body(lane)` on a pooled worker; `body` runs its items in
        `item()`. The lane is over when `body` returns (or is abandoned)."""
        lane: Lane[T] = Lane()
        with self.cond:
            self.lanes.append(lane)
            lane.worker = self.pool.start(lambda: self._lane(lane, body), name)
        return lane

    def _lane(self, lane: Lane[T], body: Callable[[Lane[T]], None]) -> None:
        try:
            body(lane)
        except Abandoned:
            pass
        finally:  # the caller is never left waiting for a lane that is over
            with self.cond:
                if lane in self.lanes and lane.current is None:
                    self.lanes.remove(lane)
                    if not self.lanes:
                        self.cond.notify()

    @contextmanager
    def item(self, lane: Lane[T], name: str, tag: T, timeout: float) -> Iterator[Item[T]]:
        """Run the body as the lane's current item, under `timeout` (and `end`). Raises
        Abandoned, before the body or after it, once the caller has given up on the lane."""
        with self.cond:
            if lane.abandoned:
                raise Abandoned
            now = self.clock()
            deadline = now + timeout if self.end is None else min(now + timeout, self.end)
            current = Item(name, tag, timeout, now, deadline)
            lane.current = current
            if deadline < self.wake_at:
                self.cond.notify()
        try:
            yield current
        finally:
            with self.cond:
                current.ended = True
                if lane.abandoned:
                    raise Abandoned  # the lane is over, whatever the body did
                lane.current = None
                if current.deadline <= self.clock():  # the caller may be awake for it
                    self.cond.notify()

    def overran(self) -> Iterator[tuple[Lane[T], Item[T]]]:
        """Sleep until every lane is over; yield each item that overran, its lane already
        abandoned (its worker too). Runs under `cond`, as does the caller's code between
        yields (`start` may be called there)."""
        with self.cond:
            while self.lanes:
                now = self.clock()
                for lane in list(self.lanes):
                    current = lane.current
                    if current is None or current.ended or current.deadline > now:
                        continue
                    if now - current.deadline > STALL_SLACK and not current.graced:
                        current.graced = True
                        current.deadline = now + min(current.timeout, STALL_GRACE)
                        continue
                    self.lanes.remove(lane)
                    lane.abandoned = True
                    if lane.worker is not None:
                        lane.worker.abandon()
                    yield lane, current
                if not self.lanes:
                    break
                pending = [
                    lane.current.deadline
                    for lane in self.lanes
                    if lane.current is not None and not lane.current.ended
                ]
                self.wake_at = min(pending, default=math.inf)
                self.cond.wait(None if not pending else max(0.0, self.wake_at - self.clock()))
                self.wake_at = math.inf


__all__ = ["STALL_GRACE", "STALL_SLACK", "Abandoned", "Item", "Lane", "Timekeeper"]
