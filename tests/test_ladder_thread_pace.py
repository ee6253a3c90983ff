"""The ladder thread's pace: every `every` seconds while something is under way (an open
episode, an answer Slurm refused, burn-in not settled), every `idle_every` when nothing is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from healthd.ladder_thread import IDLE_EVERY, LadderThread
from healthd.progress_answers import watch_hangs
from medic_core.config import MedicConfig, load_config


class Ladder:
    def __init__(self, episodes: list[Any]) -> None:
        self.episodes = episodes

    def tick(self) -> Any:
        return self.episodes.pop(0)


class BurnIn:
    def __init__(self, settled: bool) -> None:
        self._settled = settled

    def tick(self) -> None:
        return None

    def settled(self) -> bool:
        return self._settled


def waits(episodes: list[Any], **extra: Any) -> list[float]:
    thread = LadderThread(SimpleNamespace(node="n1"), Ladder(list(episodes)), episodes=None)  # type: ignore[arg-type]
    for name, value in extra.items():
        setattr(thread, name, value)
    seen: list[float] = []

    def wait(timeout: float) -> bool:
        seen.append(timeout)
        if len(seen) == len(episodes):
            thread._stop.set()
        return False

    thread.wake.wait = wait  # type: ignore[method-assign]
    thread.loop()
    return seen


def test_idle_between_episodes_and_brisk_during_one() -> None:
    episode = object()
    assert waits([None, episode, episode, None]) == [IDLE_EVERY, 2.0, 2.0, IDLE_EVERY]
    assert IDLE_EVERY > 2.0


def test_a_tick_that_failed_is_not_taken_for_idle() -> None:
    class Failing(Ladder):
        def tick(self) -> Any:
            raise RuntimeError("store down")

    thread_waits = []
    thread = LadderThread(SimpleNamespace(node="n1"), Failing([]), episodes=None)  # type: ignore[arg-type]

    def wait(timeout: float) -> bool:
        thread_waits.append(timeout)
        thread._stop.set()
        return False

    thread.wake.wait = wait  # type: ignore[method-assign]
    thread.loop()
    assert thread_waits == [2.0]


@pytest.mark.parametrize(
    ("extra", "brisk"),
    [
        ({"_unanswered": ["a fault Slurm refused"], "_retry_at": 1e18}, True),
        ({"burn_in": BurnIn(settled=False)}, True),
        ({"burn_in": BurnIn(settled=True)}, False),
    ],
)
def test_work_outside_an_episode_keeps_the_brisk_pace(extra: dict[str, Any], brisk: bool) -> None:
    assert waits([None], **extra) == [2.0 if brisk else IDLE_EVERY]


def test_the_hang_watch_reads_its_settings_again_only_after_a_reload(tmp_path: Path) -> None:
    def config(poll: float) -> MedicConfig:
        path = tmp_path / f"medic-{poll}.toml"
        path.write_text(f"[healthd]\nhang_poll = {poll}\n")
        return load_config(path)

    daemon = SimpleNamespace(node="n1", config=config(2.0))
    thread = SimpleNamespace(respond_hang=None, compare_pace=None, report_straggler=None)
    watch = watch_hangs(daemon, thread)  # type: ignore[arg-type]
    first = watch.settings()
    assert first.poll == 2.0 and watch.settings() is first  # the same object: not parsed again
    daemon.config = config(3.0)  # a reload gives the daemon a new configuration
    assert watch.settings().poll == 3.0
