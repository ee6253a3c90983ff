"""The daemon's watch over the progress of the jobs on its node: every `[healthd] hang_poll`
seconds it lists the jobs slurmd runs here (healthd.jobs, no Slurm round trip), reads each
one's heartbeat (healthd.progress), folds it into the job's history and judges it
(healthd.hang, pure). A job found hung gets its evidence collected (its processes' stacks)
and is handed to `respond` (the ladder's thread: the decision core decides, the actions
carry it out); it is handed over once per stall, again only after Slurm failed the answer.

Gathering (`look`) is kept apart from the judgement (`healthd.hang.evaluate`), and the
answer from both: this module decides nothing about Slurm.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from healthd.hang import (
    HangSettings,
    Pace,
    Progress,
    State,
    StragglerSettings,
    Verdict,
    evaluate,
    observe,
    pace,
    slower_than_others,
)
from healthd.progress import (
    BeatRead,
    Evidence,
    GpuReader,
    gpu_evidence,
    job_processes,
    prepare_dir,
    process_evidence,
    read_beat,
    remove_beat,
)
from medic_core import heartbeat

log = logging.getLogger("medic.healthd")

RETRY_SECONDS = 5.0  # a hang whose answer Slurm failed is handed over again this often
# While no job of the node reports progress, the watch looks every IDLE_POLLS x hang_poll: a
# job is judged only after min_steps steps and hang_floor seconds, so seeing its first beat a
# few seconds later changes no verdict, and an idle node does not list the spool every second.
IDLE_POLLS = 5


@dataclass(frozen=True)
class Hang:
    """A hung job on this node, with what the daemon saw."""

    node: str
    verdict: Verdict
    owner: int | None  # uid owning the heartbeat file: must be the job's user
    pid: int  # the process that wrote the heartbeat
    evidence: Evidence
    detected: float  # time.time() when the hang was declared
    evidence_s: float = 0.0  # seconds spent collecting the evidence


@dataclass(frozen=True)
class WatchSettings:
    """The `[healthd] hang_*` keys and `progress_dir`, as the watch uses them."""

    enabled: bool = True
    hang: HangSettings = field(default_factory=HangSettings)
    directory: Path = Path(heartbeat.DEFAULT_DIR)
    poll: float = 1.0
    py_spy_timeout: float = 5.0
    straggler: StragglerSettings = field(default_factory=StragglerSettings)
    straggler_every: float = 0.0  # seconds between comparisons with the job's other nodes; 0: off


@dataclass(frozen=True)
class Straggler:
    """This node is slower than the job's other nodes (`times` their median pace)."""

    node: str
    pace: Pace
    others: tuple[Pace, ...]
    times: float


class HangWatch:
    """`settings` is asked at every look, so a reload (SIGHUP) applies at the next one."""

    def __init__(
        self,
        node: str,
        settings: Callable[[], WatchSettings],
        job_ids: Callable[[], tuple[str, ...] | None],
        respond: Callable[[Hang], bool],
        *,
        proc_root: Path = Path("/proc"),
        gpus: GpuReader | None = None,
        compare: Callable[[Pace, float], Sequence[Pace] | None] | None = None,
        report: Callable[[Straggler], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[Path, str, str], BeatRead] = read_beat,
    ) -> None:
        # Stragglers: `compare(mine, window)` shares this node's pace of a job and returns
        # the job's other nodes' paces of the last `window` seconds (None: cannot tell);
        # `report` is told once per job when this node stays slower `repeats` times.
        self.compare = compare
        self.report = report
        self._compared_at: float | None = None
        self._slow: dict[str, int] = {}  # job -> comparisons in a row that found it slower
        self._reported: set[str] = set()
        self.gpus = gpus  # NVML, for the GPUs' utilisation in the evidence (None: no GPUs)
        self.node = node
        self.settings = settings
        self.job_ids = job_ids
        self.respond = respond
        self.proc_root = proc_root
        self.clock = clock
        self.read = read
        self.progress: dict[str, Progress] = {}
        self._answered: dict[str, tuple[int | None, float]] = {}  # job -> (step, retry at)
        self._refused: dict[str, str] = {}  # job -> the problem logged once
        self._prepared: Path | None = None  # the heartbeat directory made ready
        self._stop = threading.Event()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.loop, name="hang-watch", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def loop(self) -> None:
        failing = ""  # the failure every look repeats: logged once
        while not self._stop.is_set():
            poll = 1.0
            try:
                poll = self.settings().poll
                self.look()
            except Exception as exc:
                first = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
                if first != failing:
                    log.exception("hang watch: a look failed (logged once while it repeats)")
                failing = first
            else:
                if failing:
                    log.warning("hang watch: looks work again")
                failing = ""
            self._stop.wait(poll if self.progress else poll * IDLE_POLLS)

    def look(self) -> list[Verdict]:
        """One look at every job on the node; hangs go to `respond`. Returns the verdicts."""
        settings = self.settings()
        if not settings.enabled:
            for job_id in set(self.progress) | set(self._refused):
                self._forget(job_id, remove=False)
            return []
        if self._prepared != settings.directory:
            problem = prepare_dir(settings.directory)
            if problem:
                log.error("hang detection: heartbeat directory unusable: %s", problem)
            self._prepared = settings.directory
        ids = self.job_ids()
        if ids is None:  # the spool cannot be read: keep what is known, judge nothing
            return []
        for gone in (set(self.progress) | set(self._refused)) - set(ids):
            self._forget(gone)
        verdicts = []
        for job_id in ids:
            read = self.read(settings.directory, job_id, self.node)
            if read.problem and self._refused.get(job_id) != read.problem:
                log.warning("job %s: heartbeat ignored: %s", job_id, read.problem)
                self._refused[job_id] = read.problem
            now = self.clock()
            before = self.progress.get(job_id) or Progress(job_id)
            progress = observe(before, read.beat, now, settings.hang)
            if read.beat is None and job_id not in self.progress:
                continue  # never reported here: not watched
            self.progress[job_id] = progress
            verdict = evaluate(progress, now, settings.hang)
            verdicts.append(verdict)
            answered = self._answered.get(job_id)
            if answered is not None and answered[0] != verdict.step:
                del self._answered[job_id]  # it moved again (or a new run): watched afresh
                answered = None
            if verdict.hung and (answered is None or (answered[1] and now >= answered[1])):
                self._hand_over(verdict, read, settings.py_spy_timeout)
        self._compare_paces(settings, verdicts)
        return verdicts

    def _compare_paces(self, settings: WatchSettings, verdicts: list[Verdict]) -> None:
        every = settings.straggler_every
        if self.compare is None or every <= 0:
            return
        now = self.clock()
        if self._compared_at is not None and now - self._compared_at < every:
            return
        self._compared_at = now
        for verdict in verdicts:
            if verdict.state is not State.ADVANCING:
                continue
            mine = pace(self.progress[verdict.job_id], settings.hang)
            if mine is None:
                continue
            others = self.compare(mine, 3 * every)
            if others is None:
                continue
            times = slower_than_others(mine, others, settings.straggler.ratio)
            job_id = verdict.job_id
            self._slow[job_id] = self._slow.get(job_id, 0) + 1 if times else 0
            if (
                times
                and self._slow[job_id] >= settings.straggler.repeats
                and job_id not in self._reported
                and self.report is not None
            ):
                self._reported.add(job_id)
                straggler = Straggler(self.node, mine, tuple(others), times)
                log.warning(
                    "job %s: %s is a straggler: %s %.3fs, %.2fx the job's other nodes",
                    job_id, self.node, mine.basis, mine.seconds, times,
                )  # fmt: skip
                self.report(straggler)

    def _hand_over(self, verdict: Verdict, read: BeatRead, py_spy_timeout: float) -> None:
        pid = read.beat.pid if read.beat is not None else 0
        started = time.monotonic()
        evidence = Evidence(problems=("no writer pid in the heartbeat",))
        if read.owner is not None and pid > 0:
            pids = job_processes(self.proc_root, pid, read.owner)
            evidence = process_evidence(self.proc_root, pids, py_spy_timeout=py_spy_timeout)
            if not pids:  # gone, or a pid the job wrote that is not its own
                missing = f"pid {pid} not found under {self.proc_root} as uid {read.owner}"
                evidence = Evidence(problems=(missing,))
            if self.gpus is not None:
                evidence = dataclasses.replace(evidence, gpus=gpu_evidence(self.gpus, pids))
        spent = time.monotonic() - started
        hang = Hang(self.node, verdict, read.owner, pid, evidence, time.time(), spent)
        log.warning("%s; evidence from %d processes", verdict.describe(), len(evidence.processes))
        try:
            complete = self.respond(hang)
        except Exception:
            log.exception("answering the hang of job %s failed", verdict.job_id)
            complete = False
        retry = 0.0 if complete else self.clock() + RETRY_SECONDS
        self._answered[verdict.job_id] = (verdict.step, retry)

    def _forget(self, job_id: str, *, remove: bool = True) -> None:
        """The job left the node: its history, and its heartbeat file, go."""
        self.progress.pop(job_id, None)
        self._answered.pop(job_id, None)
        self._refused.pop(job_id, None)
        self._slow.pop(job_id, None)
        self._reported.discard(job_id)
        if remove and self._prepared is not None:
            remove_beat(self._prepared, job_id, self.node)
