"""Pair tests (issue 26.6): the planner and bisector (remediation/sweep/pairs.py) against a
model of consistent measurements, flaky ones and nodes lost mid-sweep; judging a pair's
figures and srun's output (hostile lines included); [sweep.pairs]; the lab's stand-in tools
read by the deep tier's own parsers."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.lab import pair_tools
from cli.lab.layout import LabLayout
from healthd.checks.deep_ib import parse_perftest_bw
from healthd.checks.deep_nccl import parse_all_reduce_perf
from medic_core.config import ConfigError, load_config
from medic_core.pair_settings import H100, PairSettings
from remediation.sweep.pair_jobs import judge_output, pair_floors, probe_lines, srun_args
from remediation.sweep.pairs import (
    PairResult,
    judge_pair,
    next_round,
    pair_of,
    round_limit,
    verdicts,
)
from remediation.sweep.policy import FAIL, INCONCLUSIVE, PASS

Outcome = Callable[[str, str, int], str]


def _names(n: int) -> list[str]:
    return [f"n{i}" for i in range(1, n + 1)]


def consistent(bad: set[str]) -> Outcome:
    return lambda a, b, _round: FAIL if a in bad or b in bad else PASS


def sweep(
    nodes: list[str],
    outcome: Outcome,
    limit: int | None = None,
    available: Callable[[int], Iterable[str]] | None = None,
) -> tuple[int, list[PairResult]]:
    """Rounds as the runner drives them: plan, measure every pair, until nothing is left."""
    results: list[PairResult] = []
    rounds = 0
    while rounds < (limit if limit is not None else round_limit(len(nodes))):
        here = list(available(rounds + 1)) if available else nodes
        planned = next_round(here, results)
        if not planned:
            break
        rounds += 1
        used = [n for pair in planned for n in pair]
        assert len(used) == len(set(used)), planned  # a node is in one pair per round
        assert set(used) <= set(here)
        results += [PairResult(a, b, rounds, outcome(a, b, rounds)) for a, b in planned]
    return rounds, results


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 64), st.data())
def test_one_bad_node_is_named_exactly_within_ceil_log2_n_plus_2_rounds(
    n: int, data: st.DataObject
) -> None:
    nodes = _names(n)
    bad = data.draw(st.sampled_from(nodes))
    rounds, results = sweep(nodes, consistent({bad}), limit=100)
    assert rounds <= round_limit(n)
    v = verdicts(nodes, results)
    if n == 2:  # nobody is known-good: the pair stays suspect, nothing is named
        assert not v.bad and v.suspects == frozenset(nodes)
    else:
        assert set(v.bad) == {bad}
        assert v.good == frozenset(nodes) - {bad}
        assert len(v.bad[bad]) >= 2  # two known-good partners saw it fail


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 64), st.data())
def test_consistent_measurements_never_name_a_good_node(n: int, data: st.DataObject) -> None:
    nodes = _names(n)
    bad = set(data.draw(st.lists(st.sampled_from(nodes), unique=True, max_size=n)))
    _, results = sweep(nodes, consistent(bad))
    v = verdicts(nodes, results)
    assert set(v.bad) <= bad
    assert v.good.isdisjoint(bad)
    assert not v.flaky  # consistent results contradict nothing


def test_two_bad_nodes_in_one_pair_are_both_named() -> None:
    nodes = _names(8)
    rounds, results = sweep(nodes, consistent({"n3", "n4"}))
    assert set(verdicts(nodes, results).bad) == {"n3", "n4"}
    assert rounds == 3  # round 2: each with one known-good partner; round 3: a second


def test_round_one_pairs_by_name_and_an_odd_node_waits_for_a_known_good_one() -> None:
    assert next_round(["n10", "n2", "n1", "n3", "n5"], []) == [("n1", "n2"), ("n3", "n5")]
    nodes = _names(5)
    rounds, results = sweep(nodes, consistent({"n5"}))  # n5 sits round 1 out
    assert set(verdicts(nodes, results).bad) == {"n5"} and rounds == 3


def test_no_known_good_node_names_nothing() -> None:
    nodes = _names(6)
    _, results = sweep(nodes, consistent(set(nodes)))
    v = verdicts(nodes, results)
    assert not v.bad and not v.good and v.suspects == frozenset(nodes)


def test_a_node_lost_mid_sweep_is_left_out_and_the_rest_still_named() -> None:
    nodes = _names(6)

    def available(round_no: int) -> list[str]:  # n3, n4's partner, drained after round 1
        return [n for n in nodes if round_no == 1 or n != "n3"]

    _, results = sweep(nodes, consistent({"n4"}), available=available)
    assert all("n3" not in (r.a, r.b) for r in results if r.round > 1)
    v = verdicts(nodes, results)
    assert set(v.bad) == {"n4"} and "n3" in v.suspects  # never cleared, never named


def test_flaky_results_make_nodes_flaky_not_bad() -> None:
    nodes = _names(4)
    # n1+n2 passes in round 1, fails in round 2: contradicts itself.
    results = [
        PairResult("n1", "n2", 1, PASS),
        PairResult("n3", "n4", 1, PASS),
        PairResult("n1", "n2", 2, FAIL),
    ]
    v = verdicts(nodes, results)
    assert v.flaky == {"n1", "n2"} and not v.bad and v.good == {"n3", "n4"}
    assert next_round(nodes, results) == []  # nothing left to learn: flaky is reported


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 40), st.integers(0, 2**32 - 1), st.floats(0.0, 0.3))
def test_random_flakes_never_loop_and_never_name_more_than_failed(
    n: int, seed: int, flake: float
) -> None:
    nodes = _names(n)
    rng = random.Random(seed)
    bad = {rng.choice(nodes)}

    def noisy(a: str, b: str, _round: int) -> str:
        honest = consistent(bad)(a, b, _round)
        roll = rng.random()
        if roll < flake / 3:
            return INCONCLUSIVE
        if roll < flake:
            return FAIL if honest == PASS else PASS
        return honest

    rounds, results = sweep(nodes, noisy)
    assert rounds <= round_limit(n)
    v = verdicts(nodes, results)
    for node, partners in v.bad.items():  # each naming rests on real failed tests
        failed = {r.partner(node) for r in results if r.outcome == FAIL and node in (r.a, r.b)}
        assert set(partners) <= failed and len(partners) >= 2


def test_inconclusive_pairs_are_retried_then_given_up() -> None:
    nodes = _names(4)
    results = [PairResult("n1", "n2", 1, INCONCLUSIVE), PairResult("n3", "n4", 1, PASS)]
    assert next_round(nodes, results) == [("n1", "n3"), ("n2", "n4")]
    results += [PairResult("n1", "n3", 2, INCONCLUSIVE), PairResult("n2", "n4", 2, PASS)]
    v = verdicts(nodes, results)
    assert v.given_up == {"n1"} and v.good == {"n2", "n3", "n4"}
    assert next_round(nodes, results) == []


def test_round_limit() -> None:
    assert [round_limit(n) for n in (2, 3, 4, 5, 6, 8, 9, 64)] == [3, 4, 4, 5, 5, 5, 6, 8]
    assert pair_of("n10", "n9") == ("n9", "n10")


# ---- judging ------------------------------------------------------------------------------

FLOORS = {"allreduce_busbw_gbps": 460.0, "ib_bw_gbps": 380.0}
WANTED = ["allreduce_busbw_gbps", "ib_bw_gbps"]


def test_judge_pair() -> None:
    ok = {"allreduce_busbw_gbps": 470.0, "ib_bw_gbps": 390.0}
    assert judge_pair(ok, FLOORS, WANTED).outcome == PASS
    slow = judge_pair({**ok, "ib_bw_gbps": 100.0}, FLOORS, WANTED)
    assert slow.outcome == FAIL and slow.why == "ib_bw_gbps 100 < 380"
    assert judge_pair({"ib_bw_gbps": 390.0}, FLOORS, WANTED).outcome == INCONCLUSIVE
    assert judge_pair({"ib_bw_gbps": 1.0}, {"ib_bw_gbps": 0.0}, ["ib_bw_gbps"]).outcome == PASS


def _line(node: str, **measured: object) -> str:
    return json.dumps({"pair_probe": {"node": node, "measured": measured, "errors": []}})


def test_srun_output_merges_both_tasks_and_skips_hostile_lines() -> None:
    out = "\n".join(
        [
            "srun: noise",
            _line("n3", allreduce_busbw_gbps=470.0),
            '{"pair_probe": "not an object"}',
            '{"pair_probe": {"measured": {"ib_bw_gbps": "fast", "x": NaN, "y": true}}}',
            "{not json",
            _line("n4", ib_bw_gbps=120.0, allreduce_busbw_gbps=500.0),
        ]
    )
    lines = probe_lines(out)
    assert [line.node for line in lines] == ["n3", "", "n4"]
    assert lines[1].measured == {}
    result = judge_output(("n3", "n4"), 1, out, False, "", PairSettings(), FLOORS)
    assert result.outcome == FAIL and result.measured["allreduce_busbw_gbps"] == 470.0
    assert result.why == "ib_bw_gbps 120 < 380"
    none = judge_output(("n3", "n4"), 1, "srun: error", False, "exit 1", PairSettings(), FLOORS)
    assert none.outcome == INCONCLUSIVE and "exit 1" in none.why
    hung = judge_output(("n3", "n4"), 1, "", True, "", PairSettings(), FLOORS)
    assert hung.outcome == FAIL


def test_floors_per_node_class_take_the_lower_of_the_pair() -> None:
    s = PairSettings(
        min_allreduce_gbps={"4x A100": 200.0}, default_min_allreduce_gbps=50.0, min_ib_gbps={}
    )
    assert s.floors(H100) == {"allreduce_busbw_gbps": 460.0, "ib_bw_gbps": 380.0}
    assert s.floors(None) == {"allreduce_busbw_gbps": 50.0, "ib_bw_gbps": 0.0}
    classes = {"a": H100, "b": "4x A100"}
    assert pair_floors(s, classes, "a", "b")["allreduce_busbw_gbps"] == 200.0
    assert pair_floors(s, classes, "a", "c")["allreduce_busbw_gbps"] == 50.0


def test_srun_args_hold_the_pair_in_the_reservation() -> None:
    from medic_core.settings import SweepSettings

    args = srun_args("medic-sweep-pairs", ("n3", "n4"), 2, SweepSettings(), PairSettings(), None)
    assert "--reservation=medic-sweep-pairs" in args and "--nodelist=n3,n4" in args
    assert "--nodes=2" in args and "--ntasks-per-node=1" in args
    assert args[-6:] == ["--nodes", "n3,n4", "--test", "allreduce", "--test", "ib"]


# ---- [sweep.pairs] -------------------------------------------------------------------------


def test_sweep_pairs_table_parses_and_bad_values_name_key_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "medic.toml"
    path.write_text(
        '[sweep]\nshare = 0.5\n[sweep.pairs]\ntests = ["ib"]\nmin_ib_gbps = { "x" = 100.0 }\n'
    )
    config = load_config(path)
    from medic_core.settings import SweepSettings

    assert SweepSettings.from_config(config).share == 0.5  # [sweep] still reads its own keys
    pairs = PairSettings.from_config(config)
    assert pairs.tests == ("ib",) and pairs.min_ib_gbps == {H100: 380.0, "x": 100.0}
    for body, key in [
        ('tests = ["pingpong"]', "sweep.pairs.tests"),
        ("confirm = 0", "sweep.pairs.confirm"),
        ('ib_client_command = ["ib_write_bw", "{host}"]', "sweep.pairs.ib_client_command"),
        ("min_ib_gbps = { x = -1.0 }", "sweep.pairs.min_ib_gbps"),
        ("bogus = 1", "sweep.pairs.bogus"),
    ]:
        path.write_text(f"[sweep.pairs]\n{body}\n")
        with pytest.raises(ConfigError) as caught:
            PairSettings.from_config(load_config(path))
        lines = caught.value.lines()
        assert len(lines) == 1 and key in lines[0] and str(path) in lines[0], lines


# ---- the lab's stand-ins -------------------------------------------------------------------


def test_lab_stand_ins_measure_the_slower_node_of_the_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = LabLayout(tmp_path)
    for node in ("n3", "n4"):
        layout.node(node).dir.mkdir(parents=True)
    pair_tools.set_link(layout, "n4", ib_bw_gbps=100.0, allreduce_busbw_gbps=300.0)
    monkeypatch.setenv("MEDIC_PAIR_NODES", "n3,n4")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    assert pair_tools.main(["all_reduce_perf", "--lab-root", str(tmp_path), "-g", "2"]) == 0
    run = parse_all_reduce_perf(capsys.readouterr().out)
    assert max(run.samples, key=lambda s: s.size).busbw == 300.0
    assert pair_tools.main(["ib_write_bw", "--lab-root", str(tmp_path), "--report_gbits"]) == 0
    assert capsys.readouterr().out == ""  # the server prints nothing here
    args = ["ib_write_bw", "--lab-root", str(tmp_path), "--report_gbits", "n4"]
    assert pair_tools.main(args) == 0
    table = parse_perftest_bw(capsys.readouterr().out)
    assert table.gbps(table.largest.bw_average) == 100.0
    pair_tools.set_link(layout, "n4")  # healed
    assert pair_tools.link(layout, "n4", "ib_bw_gbps") == pair_tools.HEALTHY["ib_bw_gbps"]
    with pytest.raises(ValueError, match="unknown link figure"):
        pair_tools.set_link(layout, "n4", speed=1.0)
