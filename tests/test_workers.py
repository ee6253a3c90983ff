"""healthd.workers: threads reused across calls, abandoned when a call overruns."""

from __future__ import annotations

import threading

from healthd.workers import WorkerPool
from tests.conftest import poll


def _run(pool: WorkerPool, call=lambda: None, name: str = "") -> threading.Event:
    done = threading.Event()

    def wrapped() -> None:
        try:
            call()
        finally:
            done.set()

    pool.start(wrapped, name)
    return done


def test_sequential_calls_reuse_one_thread() -> None:
    pool = WorkerPool("t")
    seen: set[int] = set()
    for _ in range(50):
        done = _run(pool, lambda: seen.add(threading.get_ident()))
        assert done.wait(5)
        poll("the worker idle", lambda: pool.idle() == 1, timeout=5)
    assert len(seen) == 1


def test_a_call_runs_under_its_own_name_and_the_worker_gets_the_pool_name_back() -> None:
    pool = WorkerPool("t")
    names: list[str] = []
    assert _run(pool, lambda: names.append(threading.current_thread().name), "check-x").wait(5)
    poll("the worker idle", lambda: pool.idle() == 1, timeout=5)
    assert names == ["check-x"]
    worker = pool.start(lambda: None)
    poll("the pool name back", lambda: worker.thread.name == "t", timeout=5)


def test_a_raising_call_leaves_the_worker_serving() -> None:
    pool = WorkerPool("t")

    def boom() -> None:
        raise RuntimeError("bug")

    assert _run(pool, boom).wait(5)
    poll("the worker idle", lambda: pool.idle() == 1, timeout=5)
    assert _run(pool).wait(5)


def test_an_abandoned_worker_takes_no_more_calls_and_exits_when_its_call_returns() -> None:
    pool = WorkerPool("t")
    release = threading.Event()
    worker = pool.start(release.wait)
    worker.abandon()
    other = pool.start(lambda: None)
    assert other is not worker  # a new thread for the next call
    release.set()
    worker.thread.join(5)
    assert not worker.thread.is_alive()
    poll("the worker idle", lambda: pool.idle() == 1, timeout=5)


def test_abandoning_a_worker_whose_call_already_returned_stops_it_at_once() -> None:
    """The call ends between the caller's deadline and its abandon(): the worker is already
    idle, and must neither serve again nor stay alive (a hung check would look hung)."""
    pool = WorkerPool("t")
    worker = pool.start(lambda: None)
    poll("the worker idle", lambda: pool.idle() == 1, timeout=5)
    worker.abandon()
    assert pool.idle() == 0
    worker.thread.join(5)
    assert not worker.thread.is_alive()


def test_no_more_than_keep_idle_workers_wait() -> None:
    pool = WorkerPool("t", keep_idle=2)
    release = threading.Event()
    workers = [pool.start(release.wait) for _ in range(5)]
    release.set()
    poll("two workers left", lambda: sum(w.thread.is_alive() for w in workers) == 2, timeout=5)
    assert pool.idle() == 2
