"""The daemon's main loop wakes on a signal whichever thread the kernel delivers it to."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from healthd.wakeup import Wakeup


@pytest.fixture
def usr2_handler() -> Iterator[list[int]]:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, _: seen.append(signum))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGUSR2, previous)
        signal.set_wakeup_fd(-1)


def test_set_from_another_thread_wakes_the_waiter() -> None:
    wakeup = Wakeup()
    threading.Timer(0.05, wakeup.set).start()
    assert wakeup.wait(timeout=30) is True
    wakeup.clear()
    assert wakeup.wait(timeout=0) is False


def test_a_set_before_the_wait_is_not_lost() -> None:
    wakeup = Wakeup()
    wakeup.set()
    assert wakeup.wait(timeout=30) is True and wakeup.is_set()


def test_a_signal_delivered_to_another_thread_wakes_the_main_thread(
    usr2_handler: list[int],
) -> None:
    """With threading.Event this wait sleeps its whole 30 s: Python runs the handler only on
    the main thread, and nothing interrupts the main thread's lock wait."""
    wakeup = Wakeup()
    wakeup.ring_on_signals()
    parked = threading.Event()
    other = threading.Thread(target=parked.wait, args=(30,), daemon=True)
    other.start()
    assert other.ident is not None
    threading.Timer(0.1, signal.pthread_kill, args=(other.ident, signal.SIGUSR2)).start()
    start = time.monotonic()
    woke = wakeup.wait(timeout=30)
    waited = time.monotonic() - start
    parked.set()
    assert woke is False  # a signal rang, nobody set() it
    assert usr2_handler == [signal.SIGUSR2]
    assert waited < 10, f"the main thread slept {waited:.1f}s through the signal"
