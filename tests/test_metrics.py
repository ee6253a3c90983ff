"""The Prometheus exposition of medic-healthd (goodput issue, Prometheus part): what a real
daemon exports passes `promtool check metrics`, carries no `_created` series and no gauge
named `_count`, stays small on an 8-GPU node, and a scrape never sees the node's current
state half rebuilt. promtool is Debian's `prometheus` package (scripts/bootstrap)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.lab import scenario as sc
from cli.lab.cluster import Lab
from healthd.checks.base import CheckContext, Result, Status, fault, ok
from healthd.daemon import HealthDaemon
from healthd.ladder_wiring import attach_ladder
from healthd.metrics import DaemonMetrics, medic_version
from healthd.slurm_seen import SlurmSeen
from healthd.xid import XidBuffer
from medic_core import proc
from medic_core.api import ask
from medic_core.config import load_config
from medic_core.slurm import NodeInfo
from medic_core.store import Store, open_configured_store, open_store
from remediation import episodes as ep
from remediation import tickets
from remediation.episodes import EpisodeStore
from tests.conftest import poll
from tests.test_daemon import plain_config

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian: apt-get install prometheus; scripts/bootstrap does)",
)


def promtool(*args: str, stdin: str | None = None) -> proc.CommandResult:
    assert PROMTOOL is not None
    return proc.run([PROMTOOL, *args], timeout=60, input_text=stdin)


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def names(text: str) -> set[str]:
    return {name for name, _, _ in samples(text)}


def exportable(text: str) -> set[str]:
    """Every series name the exposition `text` can hold: its samples', and each family's
    (a histogram's _bucket, _sum, _count) even when it has no sample yet."""
    found = names(text)
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            found.add(name)
            if kind in ("histogram", "summary"):
                found |= {f"{name}_sum", f"{name}_count"}
            if kind == "histogram":
                found.add(f"{name}_bucket")
    return found


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[HealthDaemon]:
    config = load_config(plain_config(tmp_path))
    store: Store = open_configured_store(config)
    try:
        yield HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))
    finally:
        store.close()


# --- the exposition of a real daemon ------------------------------------------------------------


@needs_promtool
def test_a_real_daemons_exposition_passes_promtool_check_metrics(daemon: HealthDaemon) -> None:
    text = full_exposition(daemon)
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""


def test_no_created_series_no_count_gauges_and_process_and_build_info(
    daemon: HealthDaemon,
) -> None:
    daemon.run_checks()
    text = daemon.metrics.exposition()
    found = names(text)
    assert not [n for n in found if n.endswith("_created")]
    gauges = [f.name for f in text_string_to_metric_families(text) if f.type in ("gauge", "info")]
    assert not [n for n in gauges if n.endswith("_count")]
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= found
    [(_, labels, value)] = [s for s in samples(text) if s[0] == "medic_build_info"]
    assert labels == {"version": medic_version(), "node": daemon.node} and value == 1.0
    assert not {"medic_node_faults_count", "medic_gpu_devices_count"} & found
    assert "medic_healthd_last_round_timestamp_seconds" in found
    # The duration histogram: three buckets and +Inf per check that ran.
    buckets = {s[1]["le"] for s in samples(text) if s[0] == "medic_check_duration_seconds_bucket"}
    assert buckets == {"0.1", "1.0", "10.0", "+Inf"}


@dataclass
class Node:
    """A daemon as the metrics read it (healthd.node_metrics.RoundSource)."""

    store: Store
    results: list[Result] = field(default_factory=list)
    node: str = "n1"
    gpu: Any = None
    ladder: Any = None

    def current(self) -> list[Result]:
        return list(self.results)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'store' / 'medic.db'}") as s:
        yield s


XID_79 = fault("gpu_xid", Status.CRITICAL, "gpu.xid.79", "GPU 2 fell off the bus", target="2")


def test_the_current_state_is_read_at_scrape_time_never_half_rebuilt(store: Store) -> None:
    """A round recorded while scrapes run: every scrape shows the standing fault (before,
    the faults gauge was cleared and refilled, and a scrape in between saw none)."""
    node = Node(store, [XID_79, ok("ib", "fine")])
    metrics = DaemonMetrics("n1")
    assert "medic_node_status_code" not in names(metrics.exposition())  # no round yet
    metrics.observe_round(node)
    stop = threading.Event()

    def rounds() -> None:
        while not stop.is_set():
            metrics.observe_round(node)

    thread = threading.Thread(target=rounds)
    thread.start()
    try:
        for _ in range(100):
            found = samples(metrics.exposition())
            assert ("medic_node_status_code", {}, 3.0) in found
            fault_79 = {"status": "CRITICAL", "fault_class": "gpu.xid.79"}
            assert ("medic_node_faults", fault_79, 1.0) in found
    finally:
        stop.set()
        thread.join(10)


# --- what an operator alerts on -------------------------------------------------------------------

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _episode(store: Store, node: str, state: str, rung: int, at: dt.datetime) -> None:
    episodes = EpisodeStore(store, clock=lambda: at)
    e = episodes.open_episode(
        node,
        state=ep.WAITING_IDLE,
        fault_class="gpu.xid.79",
        target="2",
        check="gpu_xid",
        recommendation="reboot",
        rung=rung,
        message="GPU 2 fell off the bus",
        evidence={},
    )
    if state != ep.WAITING_IDLE:
        EpisodeStore(store, clock=lambda: at + dt.timedelta(minutes=5)).update(e.id, state=state)


def test_episodes_pause_and_rma_tickets_from_one_store_read(store: Store) -> None:
    _episode(store, "n1", ep.WAITING_IDLE, 1, T0)
    _episode(store, "n1", ep.NEEDS_HUMAN, 2, T0 + dt.timedelta(hours=1))
    _episode(store, "n1", ep.NEEDS_HUMAN, 3, T0 + dt.timedelta(hours=2))
    _episode(store, "n1", ep.RESOLVED, 1, T0)  # waits on nothing: not exported
    _episode(store, "n2", ep.NEEDS_HUMAN, 2, T0)  # another node's
    EpisodeStore(store).set_paused(True, "fleet signature gpu.xid.79", "medic")
    tickets.open_ticket(store, "n1", "gpu.xid.79", "GPU 2 gone", [], {}, "medic", at=T0)
    later = tickets.open_ticket(store, "n1", "gpu.ecc.dbe", "GPU 3", [], {}, "medic", at=T0)
    tickets.transition(store, later.id, "closed", "medic", note="cancelled: test")
    tickets.open_ticket(store, "n2", "gpu.xid.79", "GPU 0 gone", [], {}, "medic", at=T0)
    metrics = DaemonMetrics("n1")
    metrics.observe_round(Node(store, [ok("ib", "fine")]))
    found = samples(metrics.exposition())

    def value(name: str, **labels: str) -> float | None:
        return next((v for n, lbls, v in found if n == name and lbls == labels), None)

    assert value("medic_store_up") == 1.0
    assert value("medic_remediation_paused") == 1.0
    episodes = {(s[1]["state"], s[1]["rung"]): s[2] for s in found if s[0] == "medic_episodes"}
    assert episodes == {("waiting_idle", "1"): 1.0, ("needs_human", "2"): 1.0,
                        ("needs_human", "3"): 1.0}  # fmt: skip
    hour = 3600.0
    t0 = T0.timestamp()
    assert value("medic_episode_opened_timestamp_seconds", state="needs_human") == t0 + hour
    assert value("medic_episode_changed_timestamp_seconds", state="needs_human") == t0 + hour + 300
    assert value("medic_episode_opened_timestamp_seconds", state="waiting_idle") == t0
    assert value("medic_rma_tickets_open") == 1.0
    assert value("medic_rma_oldest_open_ticket_timestamp_seconds") == t0
    # No ticket, no pause, no episode: zeros, and no timestamps.
    quiet = DaemonMetrics("n3")
    EpisodeStore(store).set_paused(False, "", "test")
    quiet.observe_round(Node(store, node="n3"))
    found = samples(quiet.exposition())
    assert value("medic_remediation_paused") == 0.0 and value("medic_rma_tickets_open") == 0.0
    assert not [s for s in found if s[0].startswith("medic_episode")]
    assert value("medic_rma_oldest_open_ticket_timestamp_seconds") is None


def test_a_scrape_never_hangs_on_a_store_that_does_not_answer(store: Store) -> None:
    """The store read has a deadline and one thread: a hung store costs each scrape the
    deadline, answers medic_store_up 0 with the last values read, and piles up no threads."""
    metrics = DaemonMetrics("n1")
    metrics.now.store_reads.timeout = 0.3
    hang, release, calls = threading.Event(), threading.Event(), []
    real = metrics.now.read_store

    def read(store: Store, node: str) -> Any:
        calls.append(node)
        if hang.is_set():
            release.wait(30)  # a store that never answers (until the test lets it)
        return real(store, node)

    metrics.now.read_store = read
    EpisodeStore(store).set_paused(True, "test", "test")
    metrics.observe_round(Node(store, [XID_79]))
    assert ("medic_store_up", {}, 1.0) in samples(metrics.exposition())
    hang.set()
    try:
        for _ in range(3):
            began = time.monotonic()
            found = samples(metrics.exposition())
            assert time.monotonic() - began < 0.3 + 0.5
            assert ("medic_store_up", {}, 0.0) in found
            assert ("medic_remediation_paused", {}, 1.0) in found  # the last read's
            assert ("medic_node_status_code", {}, 3.0) in found  # memory: as ever
        assert len(calls) == 2  # one read hung; the scrapes after it started no other
        assert [t.name for t in threading.enumerate()].count("metrics-store") == 1
    finally:
        hang.clear()  # the next reads do not hang...
        release.set()  # ...and the hung one answers
    poll("the hung read to end", lambda: "metrics-store" not in _threads())
    assert ("medic_store_up", {}, 1.0) in samples(metrics.exposition())


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate()]


def test_a_store_read_that_fails_is_store_up_0(store: Store) -> None:
    metrics = DaemonMetrics("n1")
    metrics.observe_round(Node(store))
    store.engine.dispose()
    with store.engine.begin() as conn:  # the tables gone: every read fails at once
        conn.exec_driver_sql("DROP TABLE remediation_control")
    began = time.monotonic()
    found = samples(metrics.exposition())
    assert time.monotonic() - began < 1.0
    assert ("medic_store_up", {}, 0.0) in found
    assert "medic_remediation_paused" not in {s[0] for s in found}  # never read


def test_xid_counts_by_gpu_and_code_and_each_gpus_worst_status(store: Store) -> None:
    xids = XidBuffer()
    for at in (1.0, 100.0):
        xids.add(79, 2, source="nvml", monotonic=at)
    xids.add(79, 2, source="kmsg", monotonic=100.5)  # the same XID from the kernel log: one
    xids.add(13, 0, source="kmsg", monotonic=5.0)
    xids.add(31, None, source="kmsg", monotonic=6.0, pci="0000:ff:00.0")
    xids.clear(2)  # a reset forgets them for the checks; the counts stay
    results = [
        XID_79,
        ok("gpu_thermal", "fine", target="2"),
        fault("gpu_thermal", Status.WARN, "gpu.thermal.slowdown", "hot", target="5"),
        ok("gpu_ecc", "fine", target="0"),
        ok("gpu_driver", "fine"),  # the whole node: no GPU
        fault("ib", Status.CRITICAL, "ib.port.down", "down", target="3"),  # not a GPU check
    ]
    metrics = DaemonMetrics("n1")
    metrics.observe_round(Node(store, results, gpu=SimpleNamespace(xids=xids)))
    found = samples(metrics.exposition())
    counts = {(s[1]["gpu"], s[1]["xid"]): s[2] for s in found if s[0] == "medic_gpu_xids_total"}
    assert counts == {("2", "79"): 2.0, ("0", "13"): 1.0, ("", "31"): 1.0}
    status = {s[1]["gpu"]: s[2] for s in found if s[0] == "medic_gpu_status_code"}
    assert status == {"0": 0.0, "2": 3.0, "5": 1.0}


def test_slurms_view_is_what_the_ladders_client_last_learned(store: Store) -> None:
    in_service = NodeInfo("n1", "IDLE", frozenset())
    drained = NodeInfo("n1", "IDLE", frozenset({"DRAIN"}), reason="medic: gpu.xid.79 GPU 2")
    theirs = NodeInfo("n1", "DOWN", frozenset(), reason="power work")
    seen = SlurmSeen("n1", clock=lambda: 1000.0)
    answers = {"n1": in_service, "n2": dataclasses.replace(drained, name="n2")}
    fake = SimpleNamespace(
        node=lambda name: answers[name],
        nodes=lambda: list(answers.values()),
        drain=lambda node, reason: None,
        resume=lambda node: None,
    )
    client = seen.wrap(fake)
    metrics = DaemonMetrics("n1")
    node = Node(store, ladder=SimpleNamespace(seen=seen))
    metrics.observe_round(node)

    def view() -> tuple[float, ...]:
        found = {s[0]: s[2] for s in samples(metrics.exposition())}
        return tuple(
            found[f"medic_slurm_node_{n}"]
            for n in ("in_service", "medic_drain", "seen_timestamp_seconds")
        )

    assert not {n for n in names(metrics.exposition()) if n.startswith("medic_slurm")}
    client.node("n2")  # another node: not ours to note
    assert seen.view is None
    client.node("n1")
    assert view() == (1.0, 0.0, 1000.0)
    client.drain("n1", "medic: gpu.xid.79 GPU 2")
    assert view() == (0.0, 1.0, 1000.0)
    client.resume("n1")
    assert view() == (1.0, 0.0, 1000.0)
    answers["n1"] = theirs
    client.nodes()
    assert view() == (0.0, 0.0, 1000.0)
    answers["n1"] = drained
    client.nodes()
    assert view() == (0.0, 1.0, 1000.0)


def test_the_daemons_ladder_and_fault_answers_report_to_one_slurm_view(
    daemon: HealthDaemon,
) -> None:
    ladder = attach_ladder(daemon)
    assert ladder.ladder.slurm.seen is ladder.seen  # type: ignore[attr-defined]
    assert ladder.seen.node == daemon.node


def full_exposition(daemon: HealthDaemon) -> str:
    """A real daemon's exposition with every family it can export: a GPU node's XID, its
    ladder's view of Slurm, an episode waiting on a human and an open RMA ticket."""
    xids = XidBuffer()
    xids.add(79, 2, source="nvml", monotonic=1.0)
    daemon.gpu = SimpleNamespace(xids=xids, client=None)  # type: ignore[assignment]
    daemon.attach(attach_ladder(daemon))
    assert daemon.ladder is not None
    daemon.ladder.seen.read(NodeInfo(daemon.node, "IDLE", frozenset({"DRAIN"}), "medic: x"))
    _episode(daemon.store, daemon.node, ep.NEEDS_HUMAN, 2, T0)
    tickets.open_ticket(daemon.store, daemon.node, "gpu.xid.79", "GPU 2", [], {}, "medic", at=T0)
    daemon.run_checks()
    return daemon.metrics.exposition()


def test_the_operator_guide_lists_every_metric_and_no_other(daemon: HealthDaemon) -> None:
    text = full_exposition(daemon)
    exported = {f.name for f in text_string_to_metric_families(text)}
    guide = (Path(__file__).parents[1] / "docs" / "operator-guide.md").read_text()
    table = guide[guide.index("| Metric | Labels | Meaning |") :]
    table = table[: table.index("\n\n")]
    listed = set(re.findall(r"`((?:medic|process|python)_[a-z_]+)`", table))
    # The parser names a counter's family without its _total.
    documented = {n if n in exported else n.removesuffix("_total") for n in listed}
    assert documented <= exported, f"listed but not exported: {documented - exported}"
    assert exported <= documented, f"exported but not listed: {exported - documented}"


# --- an 8-GPU node: the real process, NVML through the injection library -------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, accept: str = "") -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cli.lab.nvml.build import build_library

    out = tmp_path_factory.mktemp("nvml")
    build_library(out)
    return out


@dataclass
class GpuNode:
    port: int
    scenario: Path
    kmsg: Path

    def inject(self, gpu: int, spec: str) -> None:
        """As the lab does: the scenario NVML reads, and the driver's line in the kernel log."""
        before = sc.read_scenario(self.scenario)
        sc.publish(self.scenario, self.kmsg, before, sc.inject(before, gpu, spec))


@pytest.fixture
def gpu_node(tmp_path: Path, nvml_dir: Path) -> Iterator[GpuNode]:
    """A real medic-healthd on 8 injected GPUs with its metrics port, once every periodic
    check has run."""

    scenario = tmp_path / "plain1.scenario"
    sc.write_scenario(scenario, sc.default_scenario("plain1", 8))
    port = _free_port()
    config = plain_config(tmp_path)
    text = config.read_text().replace('gpus = "none"', 'gpus = "required"')
    config.write_text(text.replace("metrics_port = 0", f"metrics_port = {port}"))
    venv_bin = Path(os.sys.executable).parent  # type: ignore[attr-defined]
    env = {
        **os.environ,
        "MEDIC_CONFIG": str(config),
        "MEDIC_NODE_NAME": "plain1",
        "LD_LIBRARY_PATH": str(nvml_dir),
        "NVML_INJECT_SCENARIO": str(scenario),
    }
    log = tmp_path / "healthd.log"
    pid = proc.spawn([str(venv_bin / "medic-healthd")], log_path=log, env=env)

    def checks_ran() -> bool:
        try:
            text = _scrape(port)
        except OSError:
            return False
        runs = {s[1]["check"] for s in samples(text) if s[0] == "medic_check_runs_total"}
        return "gpu_nvlink" in runs and "medic_gpu_devices" in names(text)

    try:
        poll("every periodic check's first run", checks_ran, timeout=30)
        yield GpuNode(port, scenario, tmp_path / "host" / "dev" / "kmsg")
    finally:
        os.kill(pid, 15)
        poll("medic-healthd to exit", lambda: proc_exited(pid), timeout=15)


def proc_exited(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


@needs_promtool
def test_an_8_gpu_node_scraped_over_http_passes_promtool_and_stays_small(
    gpu_node: GpuNode,
) -> None:
    text = _scrape(gpu_node.port)
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = samples(text)
    checks = {s[1]["check"] for s in found if s[0] == "medic_check_runs_total"}
    # Before: 308 samples on this node, 34 of them _created and 255 the duration histogram's.
    histogram = [s for s in found if s[0].startswith("medic_check_duration_seconds")]
    assert len(histogram) == 6 * len(checks)
    assert len(found) < 200, f"{len(found)} samples"
    assert ("medic_gpu_devices", {}, 8.0) in found
    assert {s[1]["gpu"] for s in found if s[0] == "medic_gpu_status_code"} == set("01234567")
    assert ("medic_store_up", {}, 1.0) in found
    # Prometheus asks for OpenMetrics first: no _created there either.
    open_metrics = _scrape(gpu_node.port, "application/openmetrics-text; version=1.0.0")
    assert "_created" not in open_metrics and "medic_build_info" in open_metrics


def test_an_xid_on_a_real_gpu_node_is_counted_and_its_gpu_critical(gpu_node: GpuNode) -> None:
    gpu_node.inject(2, "xid=79")

    def seen() -> bool:
        found = samples(_scrape(gpu_node.port))
        return ("medic_gpu_status_code", {"gpu": "2"}, 3.0) in found

    poll("GPU 2 CRITICAL in the metrics", seen, timeout=10)
    found = samples(_scrape(gpu_node.port))
    assert ("medic_gpu_xids_total", {"gpu": "2", "xid": "79"}, 1.0) in found
    assert ("medic_node_faults", {"status": "CRITICAL", "fault_class": "gpu.xid.79"}, 1.0) in found
    assert ("medic_gpu_status_code", {"gpu": "3"}, 0.0) in found


# --- the lab: a fault drained through Slurm -------------------------------------------------------


def test_on_the_lab_a_faulty_node_shows_medics_drain_and_its_episode_for_a_human(
    lab: Lab, tmp_path: Path
) -> None:
    """XID 79 on n1 with remediation disabled: the daemon drains n1 (Slurm's answer noted, no
    Slurm call on a scrape) and opens an episode for a human; the metrics say both."""
    config = tmp_path / "medic.toml"
    text = lab.layout.medic_conf.read_text()
    config.write_text(text.replace("[remediation]\n", "[remediation]\nenabled = false\n", 1))
    lab.start_healthd("n1", config=config)

    def metrics() -> list[tuple[str, dict[str, str], float]]:
        return samples(ask(lab.node("n1").socket, {"op": "metrics"}, timeout=5)["text"])

    poll("the first round", lambda: ("medic_store_up", {}, 1.0) in metrics(), timeout=20)
    assert not [s for s in metrics() if s[0].startswith("medic_slurm_")]  # not asked yet
    lab.inject("n1", 2, ["xid=79"])
    drained: tuple[str, dict[str, str], float] = ("medic_slurm_node_medic_drain", {}, 1.0)
    poll("Medic's drain in the metrics", lambda: drained in metrics(), timeout=15)
    poll(
        "the episode in the metrics",
        lambda: any(s[0] == "medic_episodes" for s in metrics()),
        timeout=10,
    )
    found = metrics()
    assert ("medic_slurm_node_in_service", {}, 0.0) in found
    assert ("medic_node_status_code", {}, 3.0) in found
    assert ("medic_gpu_status_code", {"gpu": "2"}, 3.0) in found
    [(_, labels, count)] = [s for s in found if s[0] == "medic_episodes"]
    assert labels["state"] == "needs_human" and count == 1.0
    seen = next(s[2] for s in found if s[0] == "medic_slurm_node_seen_timestamp_seconds")
    assert abs(time.time() - seen) < 30
