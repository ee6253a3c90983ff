"""The runner: timeouts, exceptions and hung checks become UNKNOWN without blocking others."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    CheckSpec,
    Result,
    Status,
    Tier,
    ok,
    undeclared,
)
from healthd.runner import Runner, RunnerBusy, RunState
from tests.conftest import poll

Behaviour = Callable[[], list[Result]]


@dataclass(frozen=True)
class Obs:
    results: list[Result]


class Scripted(Check[Obs, CheckConfig]):
    """A check whose gather runs a behaviour given by the test."""

    behaviour: Behaviour
    calls: list[str]

    def gather(self, ctx: CheckContext, cfg: CheckConfig) -> Obs:
        type(self).calls.append("gather")
        return Obs(type(self).behaviour())

    @staticmethod
    def evaluate(observation: Obs, cfg: CheckConfig) -> list[Result]:
        return observation.results


def make_spec(
    name: str,
    behaviour: Behaviour,
    *,
    timeout: float = 5.0,
    tiers: tuple[Tier, ...] = (Tier.PERIODIC,),
    needs: tuple[str, ...] = ("host",),
) -> CheckSpec:
    cls = type(name, (Scripted,), {"behaviour": staticmethod(behaviour), "calls": []})
    return CheckSpec(name, frozenset(tiers), 60.0, timeout, needs, name, cls, __name__)


def calls(runner: Runner, name: str) -> list[str]:
    return runner.specs[name].check_class.calls  # type: ignore[attr-defined, no-any-return]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Holds blocking checks until the test ends, then lets their threads finish."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def ctx(tmp_path: Path) -> CheckContext:
    return CheckContext.for_root(tmp_path)


def healthy(name: str) -> Behaviour:
    return lambda: [ok(name, "fine")]


def blocking(name: str, gate: threading.Event) -> Behaviour:
    def run() -> list[Result]:
        gate.wait()
        return [ok(name, "late")]

    return run


def test_results_and_durations_for_healthy_checks(ctx: CheckContext) -> None:
    runner = Runner(ctx, specs=[make_spec("a", healthy("a")), make_spec("b", healthy("b"))])
    report = runner.run()
    assert [r.status for r in report.results] == [Status.OK, Status.OK]
    assert set(report.durations) == {"a", "b"}
    assert all(o.state is RunState.DONE for o in report.outcomes)


def test_exception_becomes_unknown_with_reason(ctx: CheckContext) -> None:
    def boom() -> list[Result]:
        raise OSError(5, "Input/output error")

    runner = Runner(ctx, specs=[make_spec("bad", boom), make_spec("good", healthy("good"))])
    report = runner.run()
    bad, good = report.outcomes
    assert bad.state is RunState.ERROR and good.state is RunState.DONE
    (result,) = bad.results
    assert result.status is Status.UNKNOWN and result.fault_class == "check.error"
    assert "Input/output error" in result.evidence["error"]
    assert result.evidence["phase"] == "gather"


def test_bad_return_values_are_unknown(ctx: CheckContext) -> None:
    runner = Runner(
        ctx,
        specs=[
            make_spec("empty", lambda: []),
            make_spec("other", lambda: [ok("someone-else", "fine")]),
        ],
    )
    for outcome in runner.run().outcomes:
        assert outcome.state is RunState.ERROR
        assert outcome.results[0].status is Status.UNKNOWN


def test_hung_check_times_out_without_blocking_others(
    ctx: CheckContext, gate: threading.Event
) -> None:
    runner = Runner(
        ctx,
        specs=[
            make_spec("stuck", blocking("stuck", gate), timeout=0.3),
            make_spec("fine", healthy("fine")),
        ],
    )
    begin = time.monotonic()
    report = runner.run()
    assert time.monotonic() - begin < 3.0
    stuck, fine = report.outcomes
    assert fine.state is RunState.DONE and fine.results[0].status is Status.OK
    assert stuck.state is RunState.TIMEOUT
    (result,) = stuck.results
    assert result.status is Status.UNKNOWN and result.fault_class == "check.timeout"
    assert result.evidence["phase"] == "gather" and result.remediation == "none"

    # While its thread still hangs the check is not started again.
    again = runner.run()
    assert again.outcomes[0].state is RunState.HUNG
    assert "still hung since" in again.outcomes[0].results[0].message
    assert calls(runner, "stuck") == ["gather"]
    assert "stuck" in runner.hung()

    gate.set()
    poll("the stuck check's thread back", lambda: not runner.hung(), timeout=5)
    third = runner.run()
    assert third.outcomes[0].state is RunState.DONE
    assert calls(runner, "stuck") == ["gather", "gather"]


def test_at_most_parallel_checks_run_at_once_each_with_its_own_deadline(
    ctx: CheckContext, gate: threading.Event
) -> None:
    """A scheduled round runs its checks a few at a time (fewer threads contending for the
    interpreter); a hung one holds one lane only, and a check started after it still gets
    its whole timeout."""
    lock = threading.Lock()
    now_running = [0]
    most = [0]

    def counted(name: str) -> Behaviour:
        def run() -> list[Result]:
            with lock:
                now_running[0] += 1
                most[0] = max(most[0], now_running[0])
            time.sleep(0.02)  # the check's own work: long enough to overlap if run together
            with lock:
                now_running[0] -= 1
            return [ok(name, "fine")]

        return run

    names = [f"c{i}" for i in range(6)]
    runner = Runner(
        ctx,
        specs=[
            make_spec("stuck", blocking("stuck", gate), timeout=0.5),
            *(make_spec(n, counted(n), timeout=0.5) for n in names),
        ],
    )
    begin = time.monotonic()
    report = runner.run(parallel=2)
    took = time.monotonic() - begin
    states = {o.name: o.state for o in report.outcomes}
    assert states == {"stuck": RunState.TIMEOUT, **dict.fromkeys(names, RunState.DONE)}
    assert most[0] == 1  # the stuck check held the other lane throughout
    assert took < 3.0
    runner.run(names, parallel=3)
    assert most[0] == 3
    assert [o.name for o in report.outcomes] == ["stuck", *names]  # the order asked for


def test_with_one_lane_a_check_after_a_hung_one_gets_its_whole_timeout(
    ctx: CheckContext, gate: threading.Event
) -> None:
    runner = Runner(
        ctx,
        specs=[
            make_spec("stuck", blocking("stuck", gate), timeout=0.3),
            make_spec(
                "slowish", lambda: (time.sleep(0.2), [ok("slowish", "fine")])[1], timeout=0.3
            ),
        ],
    )
    report = runner.run(parallel=1)
    assert [o.state for o in report.outcomes] == [RunState.TIMEOUT, RunState.DONE]


def test_budget_caps_every_timeout(ctx: CheckContext, gate: threading.Event) -> None:
    runner = Runner(ctx, specs=[make_spec("slow", blocking("slow", gate), timeout=60)])
    begin = time.monotonic()
    report = runner.run(budget=0.2)
    assert time.monotonic() - begin < 3.0
    assert report.outcomes[0].state is RunState.TIMEOUT
    assert report.outcomes[0].results[0].evidence["timeout_seconds"] == 0.2


def test_missing_capability_is_unavailable(ctx: CheckContext) -> None:
    runner = Runner(ctx, specs=[make_spec("gpu", healthy("gpu"), needs=("nvml",))])
    (outcome,) = runner.run().outcomes
    assert outcome.state is RunState.UNAVAILABLE
    assert outcome.results[0].status is Status.UNKNOWN
    assert outcome.results[0].evidence["missing"] == ["nvml"]
    assert calls(runner, "gpu") == []

    with_nvml = Runner(
        CheckContext(roots=ctx.roots, nvml=object()),
        specs=[make_spec("gpu", healthy("gpu"), needs=("nvml",))],
    )
    assert with_nvml.run().outcomes[0].state is RunState.DONE


def test_selection_by_tier_name_and_enabled(ctx: CheckContext) -> None:
    specs = [
        make_spec("launchy", healthy("launchy"), tiers=(Tier.LAUNCH, Tier.PERIODIC)),
        make_spec("passive", healthy("passive")),
        make_spec("off", healthy("off")),
    ]
    runner = Runner(ctx, configs={"off": CheckConfig(enabled=False)}, specs=specs)
    assert runner.selected(tier=Tier.LAUNCH) == ["launchy"]
    assert runner.selected() == ["launchy", "passive"]
    assert [o.name for o in runner.run(["passive"]).outcomes] == ["passive"]
    with pytest.raises(KeyError):
        runner.run(["nope"])


def test_runner_runs_the_registered_host_checks_by_default(tmp_path: Path) -> None:
    from healthd.fixtures import write_host_tree

    write_host_tree(tmp_path)
    ctx = CheckContext.for_root(tmp_path)  # no NVML: the GPU checks cannot run
    runner = Runner(ctx)
    report = runner.run(tier=Tier.LAUNCH)
    names = {o.name for o in report.outcomes}
    assert {"ib", "filesystems", "memory", "cpus", "services"} <= names
    assert "kernel_log" not in names
    for outcome in report.outcomes:
        needs = runner.specs[outcome.name].needs
        if all(ctx.provides(need) for need in needs):
            assert outcome.state is RunState.DONE, outcome
        else:
            assert "nvml" in needs, outcome
            assert outcome.state is RunState.UNAVAILABLE, outcome
            assert [r.fault_class for r in outcome.results] == ["check.unavailable"]
    assert {o.name for o in report.outcomes if o.state is RunState.UNAVAILABLE} >= {"gpu_count"}
    assert not [r for r in report.results if r.status in (Status.CRITICAL, Status.WARN)]
    assert not [r for r in report.results if undeclared(runner.specs[r.check], r)]


def test_a_long_run_blocks_neither_a_reload_nor_the_hung_list(
    ctx: CheckContext, gate: threading.Event
) -> None:
    """A deep check may hold the runner for an hour: a SIGHUP reload and the socket's
    status op (which lists hung checks) do not wait for it; the run keeps its configuration
    and the next one has the new."""
    seen: list[float | None] = []
    started = threading.Event()

    class Timed(Scripted):
        def gather(self, ctx: CheckContext, cfg: CheckConfig) -> Obs:
            seen.append(cfg.timeout)
            started.set()
            gate.wait(30)
            return Obs([ok("long", "done")])

    long_spec = CheckSpec("long", frozenset({Tier.DEEP}), 60.0, 3600.0, ("host",), "long",
                          Timed, __name__)  # fmt: skip
    runner = Runner(ctx, configs={"long": CheckConfig(timeout=100.0)}, specs=[long_spec])
    run = threading.Thread(target=runner.run, args=(["long"],))
    run.start()
    try:
        assert started.wait(10)
        runner.reconfigure({"long": CheckConfig(timeout=200.0)})  # returns at once
        assert runner.configs["long"].timeout == 200.0
        assert runner.hung() == {}  # so does this
        with pytest.raises(RunnerBusy):
            runner.run(["long"], wait=0.01)
    finally:
        gate.set()
        run.join(10)
    assert not run.is_alive()
    runner.run(["long"])  # the gate stays open: this one returns at once
    assert seen == [100.0, 200.0]


def test_a_check_that_starts_with_an_earlier_deadline_than_the_runner_sleeps_to_times_out_on_time(
    ctx: CheckContext, gate: threading.Event
) -> None:
    """A lane wakes the runner's thread when it starts a check whose deadline comes first: a
    check queued behind a hung one starts at that one's deadline, not at a later one's."""
    ran_at: list[float] = []

    def after() -> list[Result]:
        ran_at.append(time.monotonic())
        return [ok("after", "fine")]

    runner = Runner(
        ctx,
        specs=[
            make_spec(
                "slow", blocking("slow", gate), timeout=3.0
            ),  # lane 1: the runner sleeps to 3 s
            make_spec("quick", healthy("quick"), timeout=5.0),  # lane 2
            make_spec("stuck", blocking("stuck", gate), timeout=0.2),  # lane 2, due at ~0.2 s
            make_spec("after", after, timeout=5.0),  # a lane of its own once stuck is left
        ],
    )
    begin = time.monotonic()
    report = runner.run(parallel=2)
    states = {o.name: o.state for o in report.outcomes}
    assert states == {
        "slow": RunState.TIMEOUT,
        "quick": RunState.DONE,
        "stuck": RunState.TIMEOUT,
        "after": RunState.DONE,
    }
    assert ran_at[0] - begin < 2.0  # not at slow's deadline (3 s)


@settings(max_examples=25, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["ok", "raise", "slow", "hang"]), min_size=1, max_size=7),
    parallel=st.integers(min_value=1, max_value=3),
)
def test_property_every_check_gets_one_outcome_and_lanes_never_exceed_parallel(
    tmp_path_factory: pytest.TempPathFactory, kinds: list[str], parallel: int
) -> None:
    if kinds.count("hang") > 1:  # each hang costs its timeout: one is enough to mix in
        kinds = [k if k != "hang" else "ok" for k in kinds]
        kinds[0] = "hang"
    ctx = CheckContext.for_root(tmp_path_factory.mktemp("root"))
    release = threading.Event()
    lock = threading.Lock()
    running, most = [0], [0]

    def behaviour(name: str, kind: str) -> Behaviour:
        def run() -> list[Result]:
            if kind == "hang":
                release.wait()
                return [ok(name, "late")]
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                if kind == "slow":
                    time.sleep(0.01)  # the check's own work, so that lanes overlap
                if kind == "raise":
                    raise OSError(5, "Input/output error")
                return [ok(name, "fine")]
            finally:
                with lock:
                    running[0] -= 1

        return run

    names = [f"c{i}" for i in range(len(kinds))]
    runner = Runner(
        ctx,
        specs=[
            make_spec(n, behaviour(n, k), timeout=0.1 if k == "hang" else 5.0)
            for n, k in zip(names, kinds, strict=True)
        ],
    )
    try:
        report = runner.run(parallel=parallel)
        expected = {"ok": RunState.DONE, "slow": RunState.DONE, "raise": RunState.ERROR}
        assert [o.name for o in report.outcomes] == names
        for outcome, kind in zip(report.outcomes, kinds, strict=True):
            assert outcome.state is expected.get(kind, RunState.TIMEOUT)
        # The hung check holds one lane until its deadline; the others never run more than
        # `parallel` at once.
        assert (
            most[0] <= parallel - (1 if "hang" in kinds and parallel > 1 else 0)
            or most[0] <= parallel
        )
        assert set(runner.hung()) == {n for n, k in zip(names, kinds, strict=True) if k == "hang"}
    finally:
        release.set()
