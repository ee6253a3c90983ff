"""`medic report` tells what happened, from Medic's own records (issue 22, findings 4, 5, 7):

* a job that prunes its checkpoints (`prune(keep=2)`, as docs/resilient-jobs.md recommends)
  is reported with the lost work and ETTR its own log gives (the checkpoint ledger, which
  `prune` never deletes), within 1 %;
* the ledger's reader never raises and loses no complete record (hypothesis: arbitrary
  bytes, truncation anywhere, a torn write between records);
* a rung WORKED only when re-qualification passed after it; a reboot's time runs to its new
  boot being seen; an RMA'd or confirmed episode is never a false ejection;
* sub-second durations print in ms; `what-if` prints the saving between its MTTRs;
  needs-human is "waiting for a human since", never closed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import medic
from cli.report_gather import checkpoint_marks
from cli.report_html import page
from cli.report_tables import print_report
from remediation import episodes as ep
from remediation import ladder as ladder_module
from remediation import report as rp
from remediation import report_store as rs
from remediation import whatif as wi
from slurm_hooks import checkpoint as ck
from slurm_hooks.checkpoint import LEDGER, CheckpointDir, LedgerRecord, parse_ledger
from slurm_hooks.checkpoint import commit as ck_commit
from slurm_hooks.checkpoint import ledger as ck_ledger
from slurm_hooks.checkpoint import prune as ck_prune
from tests.test_ladder_unit import XID_79, World, template_db, world  # noqa: F401 (fixtures)

JOB = "77"
T0 = 1_800_000_000.0  # the job's first second (epoch seconds; 2027)
CLOCKED = (ck_commit, ck_ledger, ck_prune)  # the modules that read the wall clock


def utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


class FakeTime:
    """Stands in for the module `time` inside slurm_hooks.checkpoint's commit, ledger and
    prune modules (CLOCKED): the job's clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


# -- a resilient job that prunes, interrupted twice ---------------------------------------


@dataclass
class TrainingRun:
    """The job's own log (what it printed) and the records Medic's side kept meanwhile."""

    log: list[tuple[str, float, int | None]] = field(default_factory=list)
    gates: list[float] = field(default_factory=list)
    faults: list[float] = field(default_factory=list)

    def first(self, what: str, step: int | None = None) -> float:
        return next(t for w, t, s in self.log if w == what and (step is None or s == step))


def train(
    root: Path,
    clock: FakeTime,
    step_s: float,
    commit_s: float,
    faults_after: Sequence[float],
    steps: int,
    startup_s: float = 0.5,
    requeue_s: float = 4.0,
) -> TrainingRun:
    """Train `steps` steps, committing every one and pruning to the newest two after each;
    the n-th run dies `faults_after[n]` seconds after it started (the fault), and Medic
    requeues it (the next run's prolog `requeue_s` later)."""
    run = TrainingRun()
    start = clock.now
    root.mkdir(parents=True, exist_ok=True)  # the job's directory, from its first start
    for restart in range(len(faults_after) + 1):
        clock.now = start
        run.gates.append(start)
        env = {"SLURM_JOB_ID": JOB}
        if restart:
            env["SLURM_RESTART_COUNT"] = str(restart)
        directory = CheckpointDir(root, env=env, hash_files=False)
        clock.now += startup_s
        found = directory.latest()  # a restarted run's resume mark: now
        run.log.append(("resumed", clock.now, found.step if found else None))
        step = found.step + 1 if found else 0
        dies_at = start + faults_after[restart] if restart < len(faults_after) else None
        while step < steps:
            if dies_at is not None and clock.now + step_s + commit_s > dies_at:
                clock.now = dies_at
                run.log.append(("fault", dies_at, None))
                run.faults.append(dies_at)
                break
            clock.now += step_s
            with directory.writing(step) as tmp:
                (tmp / "weights").write_bytes(step.to_bytes(8, "little"))
                clock.now += commit_s
            run.log.append(("committed", clock.now, step))
            directory.prune(keep=2)
            step += 1
        else:
            run.log.append(("done", clock.now, None))
            return run
        start = clock.now + requeue_s
    raise AssertionError("the job never finished")


def hand_computed(run: TrainingRun) -> tuple[list[float], float]:
    """Lost work per fault and ETTR from the job's own log alone: the work since the commit
    of the step the next run resumed from is done again; the job is down from the fault to
    the next run's resume; ETTR is what is left of its wall time."""
    resumes = [(t, s) for w, t, s in run.log if w == "resumed"][1:]
    lost, down = [], 0.0
    for fault, (resumed_at, step) in zip(run.faults, resumes, strict=True):
        committed = run.first("committed", step)
        lost.append(fault - committed)
        down += resumed_at - fault
    wall = run.log[-1][1] - run.gates[0]
    return lost, (wall - down - sum(lost)) / wall


def medic_records(run: TrainingRun, marks: Sequence[rp.CheckpointMark]) -> rp.ReportInput:
    """What the store holds of the job: a dated XID (its kernel-log time) seen 0.1 s after
    the fault, the requeue 0.2 s after it, each run's prolog, and the epilog at the end."""
    actions = [
        rp.JobAction(JOB, "n1", utc(f + 0.2), "requeued", "gpu.xid.79", fault_at=utc(f))
        for f in run.faults
    ]
    return rp.ReportInput(
        since=utc(T0 - 3600),
        until=utc(T0 + 86400),
        fleet_nodes=4,
        gpus_per_node=8,
        faults=[rp.FaultSeen("n1", utc(f + 0.1), "gpu.xid.79", utc(f)) for f in run.faults],
        actions=actions,
        starts=[rp.JobStart(JOB, "n1", utc(g), True) for g in run.gates],
        ends=[rp.JobEnd(JOB, "n1", utc(run.log[-1][1]))],
        checkpoints=marks,
    )


def test_a_job_that_prunes_every_step_is_reported_as_its_own_log_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's job: a commit every step, prune(keep=2), interrupted twice. Before the
    ledger the report read the two surviving checkpoints: resumed_from_step null, the
    whole run since its start counted as lost, ETTR far too low."""
    clock = FakeTime(T0)
    for module in CLOCKED:
        monkeypatch.setattr(module, "time", clock)
    root = tmp_path / "ckpt"
    run = train(root, clock, step_s=0.8, commit_s=0.05, faults_after=[14.0, 9.3], steps=60)
    assert len(list(root.glob("step-*"))) == 2  # pruned as it went
    lost, ettr = hand_computed(run)
    assert all(0 < x < 0.85 for x in lost)

    report = rp.build_report(medic_records(run, checkpoint_marks([f"{JOB}={root}"])))
    [job] = report.jobs
    first, second = job.interruptions
    resumed_from = [s for w, _, s in run.log if w == "resumed"][1:]
    assert [first.resumed_from_step, second.resumed_from_step] == resumed_from
    assert [first.lost_work_s, second.lost_work_s] == pytest.approx(lost, rel=0.01)
    assert job.lost_work_s == pytest.approx(sum(lost), rel=0.01)
    assert job.ettr == pytest.approx(ettr, rel=0.01) and not job.ettr_is_upper_bound
    assert job.checkpoints == sum(1 for w, _, _ in run.log if w == "committed")

    # The same directory without its ledger: what the report read before (the survivors).
    (root / LEDGER).unlink()
    [before] = rp.build_report(medic_records(run, checkpoint_marks([f"{JOB}={root}"]))).jobs
    assert before.lost_work_s is not None and before.lost_work_s > 5 * sum(lost)
    assert before.ettr is not None and before.ettr < ettr - 0.05


@settings(max_examples=25, deadline=None)
@given(
    step_s=st.floats(min_value=0.05, max_value=30.0),
    commit_s=st.floats(min_value=0.001, max_value=5.0),
    faults=st.lists(st.floats(min_value=0.0, max_value=200.0), min_size=1, max_size=3),
    startup_s=st.floats(min_value=0.01, max_value=20.0),
)
def test_lost_work_and_ettr_agree_with_the_jobs_log_whatever_the_timing(
    step_s: float, commit_s: float, faults: list[float], startup_s: float
) -> None:
    """Faults anywhere, including before a run's first commit or before its resume."""
    clock = FakeTime(T0)
    real_time = ck_commit.time
    for module in CLOCKED:
        module.time = clock  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "ckpt"
            offsets = [startup_s + f for f in faults]  # a run dies after it resumed
            run = train(root, clock, step_s, commit_s, offsets, steps=8, startup_s=startup_s)
            marks = checkpoint_marks([f"{JOB}={root}"])
    finally:
        for module in CLOCKED:
            module.time = real_time
    report = rp.build_report(medic_records(run, marks))
    if not run.faults:  # it finished before the fault: never interrupted, never listed
        assert report.jobs == ()
        return
    [job] = report.jobs
    resumes = [(t, s) for w, t, s in run.log if w == "resumed"]
    # Lost: from the commit the next run resumed from, or from this run's own start when it
    # committed nothing since (its resume; the first run has no resume mark: its prolog).
    began = [run.gates[0]] + [t for t, _ in resumes[1:]]
    expected = []
    for n, fault in enumerate(run.faults):
        step = resumes[n + 1][1]
        committed = run.first("committed", step) if step is not None else began[n]
        expected.append(fault - max(committed, began[n]))
    got = [i.lost_work_s for i in job.interruptions]
    assert got == pytest.approx(expected, rel=0.01, abs=1e-6)
    wall = run.log[-1][1] - run.gates[0]
    down = sum(resumes[n + 1][0] - f for n, f in enumerate(run.faults))
    assert job.ettr == pytest.approx((wall - down - sum(expected)) / wall, rel=0.01, abs=1e-6)


# -- the ledger ------------------------------------------------------------------------------


def test_prune_keeps_the_ledger_and_each_run_resumes_once_in_it(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    first = CheckpointDir(root, env={"SLURM_JOB_ID": "5"})
    for step in range(5):
        with first.writing(step) as tmp:
            (tmp / "w").write_text(str(step))
        first.prune(keep=2)
    again = CheckpointDir(root, env={"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "1"})
    assert again.resume_step() == 4 and again.resume_step() == 4  # the second look: no mark
    records = again.ledger()
    assert [(r.kind, r.step) for r in records] == [("commit", s) for s in range(5)] + [
        ("resume", 4)
    ]
    assert all(r.job_id == "5" for r in records)
    assert records[-1].restart_count == 1
    commits, resumes = again.history()
    assert [c.step for c in commits] == [0, 1, 2, 3, 4] and [r.step for r in resumes] == [4]


def test_a_symlinked_ledger_is_never_followed_and_the_commit_still_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    (root / LEDGER).symlink_to(target)
    directory = CheckpointDir(root, env={"SLURM_JOB_ID": "6"})
    with directory.writing(1) as tmp:
        (tmp / "w").write_text("1")
    assert directory.latest() is not None and directory.latest().step == 1  # type: ignore[union-attr]
    assert target.read_text() == "precious\n"
    assert "cannot append to the checkpoint ledger" in capsys.readouterr().err
    assert directory.ledger() == []  # not read through the link either
    commits, _ = directory.history()
    assert [c.step for c in commits] == [1]  # from the manifest


def test_a_ledger_that_is_a_directory_or_a_fifo_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    os.mkfifo(root / LEDGER)
    directory = CheckpointDir(root, env={})
    with directory.writing(3) as tmp:  # must not block on the FIFO
        (tmp / "w").write_text("3")
    assert directory.ledger() == [] and [c.step for c in directory.history()[0]] == [3]


# -- the ledger's parser: fuzzed -------------------------------------------------------------

records = st.builds(
    LedgerRecord,
    kind=st.sampled_from(["commit", "resume"]),
    time=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    step=st.integers(min_value=0, max_value=10**12),
    job_id=st.one_of(st.none(), st.text(max_size=12)),
    restart_count=st.integers(min_value=0, max_value=10**6),
    started=st.one_of(st.none(), st.floats(min_value=0, max_value=4e9, allow_nan=False)),
)


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=2000))
def test_the_ledger_parser_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    for record in parse_ledger(data):
        assert record.kind in ("commit", "resume") and record.restart_count >= 0


near_records = st.lists(
    st.one_of(
        st.just(ck.LEDGER_TAG.encode()),
        st.just(b"\n"),
        st.binary(max_size=20),
        st.sampled_from([b'"kind":"commit",', b'"kind":"resume",', b'"time":1e400,', b'"step":-1',
                         b'"step":true,', b'"step":null,', b'"time":NaN,', b"}", b"{", b"\xff\xfe",
                         b'"restart_count":1e3}', b'"job_id":7,', b"[" * 50]),
        records.map(lambda r: r.line()),
        records.map(lambda r: r.line()[: len(r.line()) // 2]),
    ),
    max_size=30,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(pieces=near_records)
def test_the_ledger_parser_never_raises_on_bytes_that_look_like_records(
    pieces: list[bytes],
) -> None:
    """Tags, half records, bad values, deep nesting, invalid UTF-8: records or nothing."""
    for record in parse_ledger(b"".join(pieces)):
        assert record.kind in ("commit", "resume") and record.restart_count >= 0
        assert 0 <= record.time < 1e11 and (record.step is None or record.step >= 0)


TAG = ck.LEDGER_TAG.encode()
garbage = st.binary(max_size=60).filter(lambda b: b"\n" not in b and TAG not in b)


@settings(max_examples=300, deadline=None)
@given(
    written=st.lists(records, max_size=6),
    junk=st.lists(garbage, max_size=6),
    at=st.lists(st.integers(min_value=0), max_size=6),
)
def test_junk_lines_between_records_lose_none(
    written: list[LedgerRecord], junk: list[bytes], at: list[int]
) -> None:
    lines = [r.line() for r in written]
    for line, where in zip(junk, at, strict=False):
        lines.insert(where % (len(lines) + 1), line + b"\n")
    assert parse_ledger(b"".join(lines)) == written


@settings(max_examples=300, deadline=None)
@given(written=st.lists(records, max_size=8), cut=st.integers(min_value=0))
def test_a_ledger_cut_anywhere_keeps_every_complete_record(
    written: list[LedgerRecord], cut: int
) -> None:
    """A record counts once its closing brace is in (its newline may be cut off); a part of
    one never parses as a record."""
    data = b"".join(r.line() for r in written)
    cut = cut % (len(data) + 1)
    ends, end = [], 0
    for r in written:
        end += len(r.line())
        ends.append(end)
    complete = [r for r, end in zip(written, ends, strict=True) if end - 1 <= cut]
    assert parse_ledger(data[:cut]) == complete


@settings(max_examples=300, deadline=None)
@given(
    written=st.lists(records, max_size=6),
    torn=records,
    keep=st.integers(min_value=0),
    where=st.integers(min_value=0),
    noise=garbage,
)
def test_a_torn_write_between_records_loses_only_itself(
    written: list[LedgerRecord], torn: LedgerRecord, keep: int, where: int, noise: bytes
) -> None:
    """A crash mid-append leaves part of a line (no newline); the next append lands right
    after it, on the same line. Every record written whole is still read, in order (the
    torn one too when only its newline was lost)."""
    line = torn.line()
    fragment = line[: keep % len(line)]
    where %= len(written) + 1
    lines = [r.line() for r in written]
    data = b"".join(lines[:where]) + noise + fragment + b"".join(lines[where:])
    whole = [torn] if fragment == line[:-1] else []
    assert parse_ledger(data) == written[:where] + whole + written[where:]


# -- outcomes from measurements ----------------------------------------------------------------

DAY = 86400.0
BASE = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return BASE + dt.timedelta(seconds=seconds)


def fleet(episodes: Sequence[rp.EpisodeRow], steps: Sequence[rp.StepRow] = ()) -> rp.FleetReport:
    data = rp.ReportInput(
        since=at(-DAY), until=at(3 * DAY), fleet_nodes=4, gpus_per_node=8,
        episodes=episodes, steps=steps,
    )  # fmt: skip
    return rp.build_report(data).fleet


def episode(id_: int, state: str, closed: float | None = 900, **kw: object) -> rp.EpisodeRow:
    return rp.EpisodeRow(
        id_, f"n{id_}", state, "gpu.xid.79", at(0), at(closed) if closed is not None else None,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


SEEN = f"asked Slurm; {rp.REBOOT_SEEN}"


def test_a_reboot_that_did_not_repair_the_node_is_not_counted_as_worked() -> None:
    """The issue's case: the reboot was asked and done, re-qualification failed, the ladder
    went to RMA, the vendor's part came back and the episode resolved: no rung worked."""
    episodes = [
        episode(1, "resolved", failed_requalifications=1, rung=4, ticket_id=7),
        episode(2, "resolved", rung=3),  # the reboot repaired this one
        episode(3, "rma", failed_requalifications=1, rung=4, ticket_id=8),
        episode(4, "verifying", closed=None, rung=3),  # not verified yet
    ]
    steps = [
        rp.StepRow(1, 3, "reboot", "done", at(10), at(250), SEEN),
        rp.StepRow(2, 3, "reboot", "done", at(10), at(190), SEEN),
        rp.StepRow(3, 3, "reboot", "done", at(10), at(11), "asked Slurm"),  # never came back
        rp.StepRow(4, 3, "reboot", "done", at(10), at(130), SEEN),
    ]
    [reboot] = fleet(episodes, steps).rungs
    assert (reboot.attempts, reboot.worked, reboot.not_repaired, reboot.pending) == (4, 1, 2, 1)
    assert reboot.measured == 3 and reboot.p50_s == 180  # never the 1 s it took to ask


def test_a_rung_works_only_as_the_last_step_before_a_passing_verification() -> None:
    episodes = [episode(1, "resolved", failed_requalifications=1, rung=2)]
    steps = [
        rp.StepRow(1, 1, "gpu_reset", "done", at(10), at(12)),  # verification failed after it
        rp.StepRow(1, 2, "driver_reload", "done", at(100), at(130)),
    ]
    rungs = {r.action: r for r in fleet(episodes, steps).rungs}
    assert (rungs["gpu_reset"].worked, rungs["gpu_reset"].not_repaired) == (0, 1)
    assert rungs["driver_reload"].worked == 1
    assert rungs["gpu_reset"].p50_s == 2 and rungs["driver_reload"].p50_s == 30


def test_rma_and_confirmed_episodes_are_never_false_ejections() -> None:
    episodes = [
        episode(1, "resolved", rung=4, ticket_id=3),  # a lemon straight to RMA, DBE and all
        episode(2, "resolved", failed_requalifications=1, rung=0),  # re-check failed once
        episode(3, "resolved", rung=0),  # a link that came back: a false ejection
        episode(4, "resolved", rung=3),  # a reboot Slurm refused, then the checks passed
        episode(5, "resolved", rung=1),  # a reset ran
    ]
    steps = [
        rp.StepRow(4, 3, "reboot", "failed", at(5), at(6), "slurm refused: busy"),
        rp.StepRow(5, 1, "gpu_reset", "done", at(5), at(6)),
    ]
    assert [f.episode_id for f in fleet(episodes, steps).false_ejections] == [3, 4]


def test_a_needs_human_episode_waits_and_stays_out_of_service() -> None:
    """Its closed_at is when it began to wait: the node is out until the window's end."""
    report = fleet([episode(1, "needs_human", closed=600)])
    [wait] = report.waiting_for_human
    assert (wait.episode_id, wait.waiting_since) == (1, at(600))
    assert report.by_node[0].out_of_service_s == 3 * DAY


def test_the_table_and_the_page_say_waiting_for_a_human_never_closed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = rp.ReportInput(
        since=at(-DAY), until=at(3 * DAY), fleet_nodes=4, gpus_per_node=8,
        episodes=[episode(1, "needs_human", closed=600)],
    )  # fmt: skip
    report = rp.build_report(data)
    print_report(report, 20)
    text = capsys.readouterr().out
    assert "waiting for a human since 2026-03-01 00:10:00Z" in text
    assert "closed" not in text.lower()
    html = page(report)
    assert "waiting for a human since 2026-03-01 00:10Z" in html and "closed" not in html


def test_the_report_store_reads_a_needs_human_episode_that_began_before_the_window(
    tmp_path: Path,
) -> None:
    from medic_core.store import open_store

    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as store:
        clock = [at(-10 * DAY)]
        episodes = ep.EpisodeStore(store, clock=lambda: clock[0])
        e = episodes.open_episode(
            "n1", state=ep.WAITING_IDLE, fault_class="gpu.xid.79", target="1", check="gpu_xid",
            recommendation="reboot", rung=3, message="", evidence={},
        )  # fmt: skip
        episodes.update(e.id, state=ep.NEEDS_HUMAN)
        found, _ = rs.episodes_and_steps(store, at(-DAY), at(DAY))
    assert [(x.id, x.state) for x in found] == [(e.id, ep.NEEDS_HUMAN)]


def test_the_ladder_ends_a_reboot_step_when_it_sees_the_new_boot(world: World) -> None:  # noqa: F811
    """The reboot's time in the report is the reboot's (the ask to the new boot), read back
    from the store through the report's own query."""
    assert ladder_module.REBOOT_SEEN == rp.REBOOT_SEEN
    world.fault("n1", XID_79)
    world.tick("n1")
    assert world.last("n1").state == ep.REBOOTING
    world.clock.advance(170)
    world.reboot_happens("n1")
    world.tick("n1")
    [step] = world.steps("n1")
    assert step.ended_at is not None and (step.ended_at - step.started_at).total_seconds() == 170
    assert rp.REBOOT_SEEN in step.output
    eps, steps = rs.episodes_and_steps(world.store, world.clock.now() - dt.timedelta(hours=1),
                                       world.clock.now())  # fmt: skip
    data = rp.ReportInput(since=world.clock.now() - dt.timedelta(hours=1),
                          until=world.clock.now(), fleet_nodes=5, gpus_per_node=8,
                          episodes=eps, steps=steps)  # fmt: skip
    [reboot] = rp.build_report(data).fleet.rungs
    assert (reboot.worked, reboot.p50_s) == (1, 170)


# -- units, what-if, the views -------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0 s"), (0.643, "643 ms"), (0.13, "130 ms"), (0.0004, "0.4 ms"),
     (0.9996, "1.0 s"), (4.43, "4.4 s"), (42, "42 s"), (725, "12 min 05 s"),
     (12000, "3 h 20 min"), (187200, "2 d 4 h")],
)  # fmt: skip
def test_durations_fit_their_unit(seconds: float | None, text: str) -> None:
    assert rp.format_duration(seconds) == text


def test_sub_second_components_show_in_ms_in_the_table_and_the_page(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = rp.ReportInput(
        since=at(-DAY), until=at(DAY), fleet_nodes=2, gpus_per_node=8,
        faults=[rp.FaultSeen("n1", at(100.16), "gpu.xid.79", fault_at=at(100))],
        actions=[rp.JobAction("7", "n1", at(100.2), "requeued", "gpu.xid.79")],
        starts=[rp.JobStart("7", "n1", at(0), True), rp.JobStart("7", "n2", at(104.6), True)],
        checkpoints=[rp.CheckpointMark("7", at(99.357), "commit", 99),
                     rp.CheckpointMark("7", at(105), "resume", 99, 1)],
    )  # fmt: skip
    report = rp.build_report(data)
    [i] = report.jobs[0].interruptions
    assert i.lost_work_s == pytest.approx(0.643) and i.resumed_from_step == 99
    print_report(report, 20)
    text = capsys.readouterr().out
    [row] = [line for line in text.splitlines() if line.endswith("running again")]
    assert "160 ms" in row and "40 ms" in row and "643 ms" in row and " 0 s " not in row
    html = page(report)
    assert "643 ms" in html and "160 ms" in html


def test_what_if_prints_the_saving_between_its_mttrs() -> None:
    args = ["report", "what-if", "--nodes", "16", "--failure-rate", "0.001", "--days", "30",
            "--mttr", "4h", "--mttr", "10m"]  # fmt: skip
    out = CliRunner().invoke(medic, args)
    assert out.exit_code == 0, out.output
    base = wi.expect(wi.Scenario(16, 8, 0.001, 720, 4.0))
    better = wi.expect(wi.Scenario(16, 8, 0.001, 720, 10 / 60))
    saved = wi.saving(base, better)
    assert saved.wall_hours == pytest.approx(base.wall_hours - better.wall_hours)
    assert saved.wall_share == pytest.approx(saved.wall_hours / base.wall_hours)
    assert f"saves {saved.wall_hours / 24:,.2f} wall days" in out.output
    assert f"({saved.wall_share * 100:.1f}% of the run's wall time" in out.output
    js = CliRunner().invoke(medic, [*args, "--json"])
    [s] = json.loads(js.output)["savings"]
    assert s["wall_hours"] == pytest.approx(saved.wall_hours, rel=1e-3)


def test_medic_report_reads_a_pruned_jobs_ledger_and_the_store_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job through `medic report --checkpoints JOB=DIR --json` on a SQLite store
    holding what the daemon and the hooks write: the JSON agrees with the job's log."""
    from medic_core.store import Severity, open_store

    clock = FakeTime(T0)
    for module in CLOCKED:
        monkeypatch.setattr(module, "time", clock)
    root = tmp_path / "ckpt"
    run = train(root, clock, step_s=0.2, commit_s=0.05, faults_after=[20.13, 14.2], steps=150)
    lost, ettr = hand_computed(run)
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    target = f"job:{JOB}"
    with open_store(url) as store:
        for g in run.gates:
            store.add_event("n1", at=utc(g), kind="gate", severity=Severity.INFO, source="test",
                            target=target, evidence={"job_id": JOB, "allow": True})  # fmt: skip
        for f in run.faults:
            when = utc(f).isoformat()
            store.add_event("n1", at=utc(f + 0.1), kind="gpu_xid", severity=Severity.CRITICAL,
                            source="test", fault_class="gpu.xid.79", target="0",
                            evidence={"fault_at": when})  # fmt: skip
            store.add_event("n1", at=utc(f + 0.2), kind="job_action", severity=Severity.WARN,
                            source="test", fault_class="gpu.xid.79", target=target,
                            evidence={"action": "requeued", "job_id": JOB,
                                      "fault_at": when})  # fmt: skip
        store.add_event("n1", at=utc(run.log[-1][1]), kind="job_summary",
                        severity=Severity.INFO, source="test", target=target,
                        evidence={"job_id": JOB})  # fmt: skip
    window = ["--since", utc(T0 - 60).isoformat(), "--until", utc(T0 + 3600).isoformat()]
    args = ["report", "--store", url, *window, "--checkpoints", f"{JOB}={root}", "--json"]
    result = CliRunner().invoke(medic, args)
    assert result.exit_code == 0, result.output
    [job] = json.loads(result.output)["jobs"]
    got = [i["lost_work_s"] for i in job["interruptions"]]
    assert got == pytest.approx(lost, rel=0.01, abs=0.001)
    assert [i["resumed_from_step"] for i in job["interruptions"]] == [
        s for w, _, s in run.log if w == "resumed"
    ][1:]
    assert job["ettr"] == pytest.approx(ettr, rel=0.01) and not job["ettr_is_upper_bound"]


def test_a_step_committed_after_the_fault_loses_nothing() -> None:
    """A job that ran on after the fault (a kernel-log XID its CUDA work did not notice)
    and committed before it was stopped resumes from that commit: no work before the fault
    is done again."""
    data = rp.ReportInput(
        since=at(-DAY), until=at(DAY), fleet_nodes=2, gpus_per_node=8,
        faults=[rp.FaultSeen("n1", at(100.3), "gpu.xid.79", fault_at=at(100))],
        actions=[rp.JobAction("7", "n1", at(100.4), "requeued", "gpu.xid.79")],
        starts=[rp.JobStart("7", "n1", at(0), True), rp.JobStart("7", "n2", at(105), True)],
        checkpoints=[rp.CheckpointMark("7", at(99.9), "commit", 40),
                     rp.CheckpointMark("7", at(100.2), "commit", 41),
                     rp.CheckpointMark("7", at(106), "resume", 41, 1)],
    )  # fmt: skip
    [i] = rp.build_report(data).jobs[0].interruptions
    assert (i.resumed_from_step, i.lost_work_s) == (41, 0)
