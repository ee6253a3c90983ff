"""`medic report`'s arithmetic (remediation/report/, remediation/whatif.py) on hand-built
rows: no store, no clock."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation import report as rp
from remediation import whatif as wi

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
SINCE, UNTIL = T0 - dt.timedelta(days=1), T0 + dt.timedelta(days=2)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def data(**rows: object) -> rp.ReportInput:
    values: dict[str, object] = {
        "since": SINCE,
        "until": UNTIL,
        "fleet_nodes": 10,
        "gpus_per_node": 8,
    }
    values.update(rows)
    return rp.ReportInput(**values)  # type: ignore[arg-type]


def one_job(**extra: object) -> rp.ReportInput:
    """Job 7: starts at 0 on n1, XID 79 seen at 3600, requeued at 3602, allowed on n2 at
    3700, resumed from step 300 at 3760, ends at 7200."""
    rows: dict[str, object] = {
        "faults": [rp.FaultSeen("n1", at(3600), "gpu.xid.79")],
        "actions": [rp.JobAction("7", "n1", at(3602), "requeued", "gpu.xid.79")],
        "starts": [rp.JobStart("7", "n1", at(0), True), rp.JobStart("7", "n2", at(3700), True)],
        "ends": [rp.JobEnd("7", "n1", at(3603)), rp.JobEnd("7", "n2", at(7200))],
        "checkpoints": [
            rp.CheckpointMark("7", at(1800), "commit", 300),
            rp.CheckpointMark("7", at(3760), "resume", 300, 1),
        ],
    }
    rows.update(extra)
    return data(**rows)


def test_an_interruption_splits_into_its_components() -> None:
    report = rp.build_report(one_job())
    (job,) = report.jobs
    (i,) = job.interruptions
    assert (i.detection_s, i.isolation_s, i.scheduling_s, i.restart_s) == (None, 2, 98, 60)
    assert i.wall_s == 160 and i.recovered and not i.clock_skew
    assert (i.lost_work_s, i.resumed_from_step) == (1800, 300)
    assert (job.wall_s, job.down_s, job.lost_work_s) == (7200, 160, 1800)
    assert job.ettr == pytest.approx((7200 - 160 - 1800) / 7200)
    assert not job.ettr_is_upper_bound
    assert report.mttr_s == 160
    assert report.components["scheduling"].p50_s == 98


def test_a_sensor_s_own_fault_time_gives_detection() -> None:
    fault = rp.FaultSeen("n1", at(3600), "gpu.xid.79", fault_at=at(3599.5))
    (i,) = rp.build_report(one_job(faults=[fault])).jobs[0].interruptions
    assert i.detection_s == 0.5 and i.wall_s == 160.5


def test_a_fault_without_an_event_is_known_when_medic_acted() -> None:
    (i,) = rp.build_report(one_job(faults=[])).jobs[0].interruptions
    assert i.known_at == at(3602) and i.isolation_s == 0


def test_interruption_without_requeue_leaves_the_job_down() -> None:
    action = rp.JobAction("7", "n1", at(3602), "budget_spent", "gpu.xid.79")
    report = rp.build_report(one_job(actions=[action], ends=[rp.JobEnd("7", "n1", at(3603))]))
    (i,) = report.jobs[0].interruptions
    assert not i.recovered and i.outcome == "budget_spent"
    assert i.scheduling_s is None and i.restart_s is None
    assert report.mttr_s is None  # only recovered interruptions make the MTTR


def test_a_job_never_running_again() -> None:
    starts = [rp.JobStart("7", "n1", at(0), True), rp.JobStart("7", "n2", at(3700), False)]
    report = rp.build_report(one_job(starts=starts, ends=[], checkpoints=[]))
    job = report.jobs[0]
    (i,) = job.interruptions
    assert i.running_at is None and not i.recovered and i.lost_work_s is None
    assert job.ended_at == at(3602) and job.ettr_is_upper_bound


def test_two_faults_of_one_outage_are_one_interruption() -> None:
    actions = [
        rp.JobAction("7", "n1", at(3602), "requeued", "gpu.xid.79"),
        rp.JobAction("7", "n3", at(3603), "requeued", "ib.port.down"),
        rp.JobAction("7", "n1", at(3604), "requeued", "gpu.xid.79"),
    ]
    (i,) = rp.build_report(one_job(actions=actions)).jobs[0].interruptions
    assert i.also == ("n3:ib.port.down",)


def test_a_requeue_after_a_failed_one_recovers_the_same_outage() -> None:
    actions = [
        rp.JobAction("7", "n1", at(3602), "requeue_failed", "gpu.xid.79"),
        rp.JobAction("7", "n1", at(3632), "requeued", "gpu.xid.79"),
    ]
    (i,) = rp.build_report(one_job(actions=actions)).jobs[0].interruptions
    assert i.outcome == "requeued" and i.recovered
    assert (i.known_at, i.isolated_at, i.isolation_s, i.scheduling_s) == (
        at(3600),
        at(3632),
        32,
        68,
    )
    assert i.wall_s == 160 and i.also == ()


def test_a_second_interruption_after_the_job_ran_again() -> None:
    actions = [
        rp.JobAction("7", "n1", at(3602), "requeued", "gpu.xid.79"),
        rp.JobAction("7", "n2", at(5000), "requeued", "gpu.ecc.dbe"),
    ]
    starts = [rp.JobStart("7", n, at(t), True) for n, t in (("n1", 0), ("n2", 3700), ("n4", 5100))]
    job = rp.build_report(one_job(actions=actions, starts=starts)).jobs[0]
    _, second = job.interruptions
    assert second.running_at == at(5100) and second.scheduling_s == 100
    # resumed at 3760 from step 300; no commit since: the work since the resume is lost
    assert second.lost_work_s == 5000 - 3760 and second.resumed_from_step == 300


def test_clock_skew_moves_a_point_up_and_flags_it() -> None:
    # n2's clock is 30 s behind: its gate reads before the requeue
    starts = [rp.JobStart("7", "n1", at(0), True), rp.JobStart("7", "n2", at(3572), True)]
    (i,) = rp.build_report(one_job(starts=starts)).jobs[0].interruptions
    assert i.clock_skew and i.scheduling_s == 0 and i.running_at == at(3602)
    assert i.wall_s == i.isolation_s + i.scheduling_s + (i.restart_s or 0)
    assert min(i.isolation_s, i.scheduling_s, i.restart_s or 0) >= 0


def test_an_empty_window() -> None:
    report = rp.build_report(data())
    assert report.jobs == () and report.mttr_s is None
    assert report.components["wall"] == rp.Spread(0, 0.0, None, None, None)
    fleet = report.fleet
    assert fleet.episodes == 0 and fleet.mtbf_node_hours is None and fleet.by_node == ()
    assert fleet.node_hours == 10 * 72


def test_records_outside_the_window_are_left_out() -> None:
    late = data(
        since=at(4000),
        until=at(9000),
        actions=[rp.JobAction("7", "n1", at(3602), "requeued", "gpu.xid.79")],
    )
    assert rp.build_report(late).jobs == ()


def episode(
    id_: int, node: str, opened: float, closed: float | None, state: str = "resolved", **kw: int
) -> rp.EpisodeRow:
    return rp.EpisodeRow(
        id_, node, state, "gpu.xid.79", at(opened), at(closed) if closed is not None else None, **kw
    )


def test_fleet_figures() -> None:
    day = 86400
    episodes = [
        episode(1, "n1", 0, 600),
        episode(2, "n1", day, day + 600),
        episode(3, "n1", 2 * day - 60, None, "rma"),  # third within 7 days: a lemon
        episode(4, "n2", 100, 400),  # nothing done, resolved: a false ejection
        episode(5, "n3", 200, 300, "waiting_cap"),  # never drained
    ]
    steps = [
        rp.StepRow(1, 3, "reboot", "done", at(10), at(310), "asked Slurm; new boot seen"),
        rp.StepRow(2, 1, "gpu_reset", "failed", at(day + 10), at(day + 40)),
        rp.StepRow(2, 3, "reboot", "done", at(day + 50), at(day + 350), "; new boot seen"),
        rp.StepRow(3, 3, "reboot", "done", at(2 * day), at(2 * day + 10), "asked Slurm"),
    ]
    tickets = [rp.TicketRow(1, "n1", at(2 * day), None)]
    actions = [
        rp.JobAction("7", "n1", at(1), "requeued", "gpu.xid.79"),
        rp.JobAction("8", "n1", at(1), "not_resilient", "gpu.xid.79"),
    ]
    fleet = rp.build_report(
        data(episodes=episodes, steps=steps, tickets=tickets, actions=actions)
    ).fleet
    assert fleet.episodes == 5 and fleet.interruptions == 1
    assert fleet.mtbf_node_hours == pytest.approx(720 / 5)
    assert fleet.mtbf_gpu_hours == pytest.approx(720 * 8 / 5)
    n1 = fleet.by_node[0]
    assert (n1.node, n1.episodes, n1.interruptions, n1.jobs_touched, n1.lemon) == (
        "n1",
        3,
        1,
        2,
        True,
    )
    # 600 + 600 + from 2d-60s to the end of the window (RMA overlaps it and counts once)
    still_out = (UNTIL - at(2 * day - 60)).total_seconds()
    assert n1.out_of_service_s == 600 + 600 + still_out
    assert n1.rma_s == still_out - 60
    assert [n.node for n in fleet.lemons] == ["n1"]
    n3 = next(n for n in fleet.by_node if n.node == "n3")
    assert n3.out_of_service_s == 0
    rungs = {(r.rung, r.action): r for r in fleet.rungs}
    assert (rungs[(3, "reboot")].attempts, rungs[(3, "reboot")].worked) == (3, 2)
    assert rungs[(1, "gpu_reset")].failed == 1 and rungs[(1, "gpu_reset")].worked == 0
    # Episode 3's reboot went on to RMA: not repaired; it was never seen back: not timed.
    assert (rungs[(3, "reboot")].not_repaired, rungs[(3, "reboot")].measured) == (1, 2)
    assert rungs[(3, "reboot")].p50_s == 300
    assert [f.episode_id for f in fleet.false_ejections] == [4]
    by_class = {c.fault_class: c for c in fleet.by_class}
    assert (by_class["gpu.xid.79"].episodes, by_class["gpu.xid.79"].nodes) == (5, 3)


def test_lemon_by_failed_requalifications() -> None:
    episodes = [episode(1, "n1", 0, 600, failed_requalifications=2)]
    steps = [rp.StepRow(1, 1, "gpu_reset", "done", at(10), at(40))]
    assert rp.build_report(data(episodes=episodes, steps=steps)).fleet.lemons[0].node == "n1"


def test_the_reports_lemons_are_the_ladders_per_part_and_family() -> None:
    """Issue 22: a link that came back by itself (no repair) and faults of other GPUs or
    other families never make a lemon; three repaired memory faults of one GPU do."""
    day = 86400

    def ep(id_: int, opened: float, fault: str, target: str) -> rp.EpisodeRow:
        return rp.EpisodeRow(id_, "n1", "resolved", fault, at(opened), at(opened + 600),
                             target=target)  # fmt: skip

    def reset(id_: int, opened: float) -> rp.StepRow:
        return rp.StepRow(id_, 1, "gpu_reset", "done", at(opened + 10), at(opened + 40))

    mixed = [ep(1, 0, "ib.port.down", "mlx5_0/1"), ep(2, day, "gpu.ecc.dbe", "3"),
             ep(3, 2 * day, "gpu.xid.79", "3"), ep(4, 3 * day, "gpu.ecc.dbe", "5")]  # fmt: skip
    steps = [reset(i, (i - 1) * day) for i in (2, 3, 4)]
    assert rp.build_report(data(episodes=mixed, steps=steps)).fleet.lemons == ()
    memory = [ep(1, 0, "gpu.ecc.dbe", "3"), ep(2, day, "gpu.xid.48", "3"),
              ep(3, 2 * day, "gpu.remap.failure", "3")]  # fmt: skip
    steps = [reset(i, (i - 1) * day) for i in (1, 2, 3)]
    assert [n.node for n in rp.build_report(data(episodes=memory, steps=steps)).fleet.lemons] == [
        "n1"
    ]
    # The same three with no repair run (re-checked until they cleared): no lemon.
    assert rp.build_report(data(episodes=memory)).fleet.lemons == ()


def test_percentile() -> None:
    assert rp.percentile([], 0.5) is None
    assert rp.percentile([1, 2, 3, 4], 0.5) == 2.5
    assert rp.percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == pytest.approx(9.1)


# -- properties ----------------------------------------------------------------------------

offsets = st.floats(min_value=-600, max_value=86400, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    fault=offsets,
    action=offsets,
    gates=st.lists(st.tuples(offsets, st.booleans()), max_size=5),
    resumes=st.lists(offsets, max_size=3),
    commits=st.lists(offsets, max_size=3),
    ends=st.lists(offsets, max_size=3),
    outcome=st.sampled_from(rp.INTERRUPTING),
    sensor=st.one_of(st.none(), offsets),
)
def test_components_sum_to_the_wall_time_and_ettr_stays_in_0_1(
    fault: float,
    action: float,
    gates: list[tuple[float, bool]],
    resumes: list[float],
    commits: list[float],
    ends: list[float],
    outcome: str,
    sensor: float | None,
) -> None:
    rows = data(
        faults=[rp.FaultSeen("n1", at(fault), "f", at(sensor) if sensor is not None else None)],
        actions=[rp.JobAction("7", "n1", at(action), outcome, "f")],
        starts=[rp.JobStart("7", "n1", at(t), ok) for t, ok in gates],
        ends=[rp.JobEnd("7", "n1", at(t)) for t in ends],
        checkpoints=[rp.CheckpointMark("7", at(t), "resume", 1, 1) for t in resumes]
        + [rp.CheckpointMark("7", at(t), "commit", i) for i, t in enumerate(sorted(commits))],
    )
    report = rp.build_report(rows)
    for job in report.jobs:
        assert job.ettr is None or 0 <= job.ettr <= 1
        assert job.wall_s >= 0 and job.down_s >= 0
        for i in job.interruptions:
            parts = [i.detection_s, i.isolation_s, i.scheduling_s, i.restart_s]
            known = [p for p in parts if p is not None]
            assert all(p >= 0 for p in known)
            assert sum(known) == pytest.approx(i.wall_s, abs=1e-6)
            points = [i.fault_at, i.known_at, i.isolated_at, i.running_at, i.resumed_at]
            present = [p for p in points if p is not None]
            assert present == sorted(present)
            assert i.lost_work_s is None or i.lost_work_s >= 0


# -- what-if -------------------------------------------------------------------------------


def hyperpod(mttr_minutes: float) -> wi.Outcome:
    """AWS's case: a 10M GPU-hour job on 256 x 8 H100 at 0.05 % per instance-hour."""
    return wi.expect(
        wi.Scenario(
            nodes=256,
            gpus_per_node=8,
            failure_rate=0.0005,
            work_hours=10e6 / 2048,
            mttr_hours=mttr_minutes / 60,
        )
    )


def test_what_if_reproduces_the_published_case() -> None:
    assert round(hyperpod(280).wall_hours / 24) == 325
    assert round(hyperpod(40).wall_hours / 24) == 221
    assert hyperpod(40).interruptions == pytest.approx(0.128 * 10e6 / 2048)


def test_what_if_llama3_interruption_count() -> None:
    # 16,384 H100 (2,048 hosts) at ~0.016 % per host-hour for 54 days: ~1 every 3 h, ~419
    out = wi.expect(wi.Scenario(2048, 8, 0.00016, 54 * 24, 0.0))
    assert out.mtbf_hours == pytest.approx(3.05, abs=0.01)
    assert 410 <= out.interruptions <= 430


def test_what_if_with_checkpoints() -> None:
    base = wi.Scenario(100, 8, 0.001, 1000, 0.5, 1.0, 0.05)
    out = wi.expect(base)
    rate = 0.1
    compute = 1000 * (1 + 0.05)
    n = rate * compute / (1 - rate * 0.5)
    assert out.interruptions == pytest.approx(n)
    assert out.wall_hours == pytest.approx(compute + n * 0.5 + n * 0.5)
    assert out.optimal_interval_hours == pytest.approx((2 * 0.05 / rate) ** 0.5)
    assert 0 < out.ettr < 1


def test_what_if_refuses_a_run_that_never_finishes() -> None:
    with pytest.raises(ValueError, match="never finishes"):
        wi.expect(wi.Scenario(1000, 8, 0.01, 100, 0.5, 1.0))


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.integers(1, 20000),
    rate=st.floats(0, 0.001),
    work=st.floats(1, 1e5),
    mttr=st.floats(0, 48),
)
def test_what_if_ettr_in_0_1_and_longer_mttr_costs_more(
    nodes: int, rate: float, work: float, mttr: float
) -> None:
    short = wi.expect(wi.Scenario(nodes, 8, rate, work, mttr))
    long = wi.expect(wi.Scenario(nodes, 8, rate, work, mttr + 1))
    assert 0 < short.ettr <= 1
    assert long.wall_hours >= short.wall_hours
    assert short.wall_hours == pytest.approx(work + short.down_hours)


def test_a_fault_in_the_runs_first_seconds_is_still_followed_by_its_next_run() -> None:
    """Found by the scripted day on the lab: a run faulted 2 s after it started, and its
    requeued run's prolog (5 s after the start) was taken for the first run's own burst of
    prologs; the outage then lasted until the job's next fault's restart."""
    report = rp.build_report(
        data(
            actions=[
                rp.JobAction("7", "n1", at(2.05), "requeued", "gpu.xid.79", at(2.01), at(2.0)),
                rp.JobAction("7", "n2", at(20), "requeued", "gpu.xid.13", at(19.9), at(19.8)),
            ],
            starts=[
                rp.JobStart("7", "n1", at(0), True),
                rp.JobStart("7", "n2", at(5), True),
                rp.JobStart("7", "n3", at(23), True),
            ],
        )
    )
    first, second = report.jobs[0].interruptions
    assert (first.fault_at, first.known_at, first.running_at) == (at(2.0), at(2.01), at(5))
    assert first.detection_s == pytest.approx(0.01) and first.wall_s == pytest.approx(3.0)
    assert (second.node, second.running_at, second.also) == ("n2", at(23), ())


def test_faults_seconds_apart_each_find_their_own_next_run_and_resume() -> None:
    """Found by the scripted day: a run that started 12 s before its fault had its own gate
    (within the 60 s skew tolerance of the requeue) and its own resume mark taken for the
    next run's, so scheduling and restart read 0. The ended run is the one on the fault's
    node when Medic knew; its resume mark came before that."""
    gates = [("n4", 0), ("n3", 33), ("n5", 48)]
    report = rp.build_report(
        data(
            actions=[
                rp.JobAction("7", "n4", at(30.1), "requeued", "gpu.xid.79", at(30.05), at(30)),
                rp.JobAction("7", "n3", at(45.1), "requeued", "gpu.xid.95", at(45.05), at(45)),
            ],
            starts=[rp.JobStart("7", node, at(s), True) for node, s in gates],
            checkpoints=[
                rp.CheckpointMark("7", at(20), "commit", 200),
                rp.CheckpointMark("7", at(33.1), "resume", 200, 1),
                rp.CheckpointMark("7", at(40), "commit", 260),
                rp.CheckpointMark("7", at(48.1), "resume", 260, 2),
            ],
        )
    )
    first, second = report.jobs[0].interruptions
    assert (first.running_at, first.resumed_at) == (at(33), at(33.1))
    assert (second.running_at, second.resumed_at) == (at(48), at(48.1))
    assert second.scheduling_s == pytest.approx(2.9) and second.restart_s == pytest.approx(0.1)
    assert second.wall_s == pytest.approx(3.1) and not second.clock_skew
    assert second.lost_work_s == pytest.approx(5.0)  # since the commit at 40
