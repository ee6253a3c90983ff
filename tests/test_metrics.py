"""The Prometheus exposition of medic-healthd (goodput issue, Prometheus part): what a real
daemon exports passes `promtool check metrics`, carries no `_created` series and no gauge
named `_count`, stays small on an 8-GPU node, and a scrape never sees the node's current
state half rebuilt. promtool is Debian's `prometheus` package (scripts/bootstrap)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healthd.checks.base import CheckContext, Result, Status, fault, ok
from healthd.daemon import HealthDaemon
from healthd.metrics import DaemonMetrics
from medic_core import proc
from medic_core.config import load_config
from medic_core.store import Store, open_configured_store
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
    daemon.run_checks()
    text = daemon.metrics.exposition()
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
    assert labels["version"] and value == 1.0
    assert not {"medic_node_faults_count", "medic_gpu_devices_count"} & found
    assert "medic_healthd_last_round_timestamp_seconds" in found
    # The duration histogram: three buckets and +Inf per check that ran.
    buckets = {s[1]["le"] for s in samples(text) if s[0] == "medic_check_duration_seconds_bucket"}
    assert buckets == {"0.1", "1.0", "10.0", "+Inf"}


def test_the_current_state_is_read_at_scrape_time_never_half_rebuilt() -> None:
    """A round recorded while scrapes run: every scrape shows the standing fault (before,
    the faults gauge was cleared and refilled, and a scrape in between saw none)."""
    xid = fault("gpu_xid", Status.CRITICAL, "gpu.xid.79", "GPU 2 fell off the bus", target="2")
    results: list[Result] = [xid, ok("ib", "fine")]

    class Source:
        def current(self) -> list[Result]:
            return list(results)

    metrics = DaemonMetrics("n1")
    assert "medic_node_status_code" not in names(metrics.exposition())  # no round yet
    metrics.observe_round(Source())
    stop = threading.Event()

    def rounds() -> None:
        while not stop.is_set():
            metrics.observe_round(Source())

    thread = threading.Thread(target=rounds)
    thread.start()
    try:
        for _ in range(200):
            text = metrics.exposition()
            assert ("medic_node_status_code", {}, 3.0) in samples(text)
            assert (
                "medic_node_faults",
                {"status": "CRITICAL", "fault_class": "gpu.xid.79"},
                1.0,
            ) in samples(text)
    finally:
        stop.set()
        thread.join(10)


def test_the_operator_guide_lists_every_metric_and_no_other(daemon: HealthDaemon) -> None:
    daemon.run_checks()
    exported = {f.name for f in text_string_to_metric_families(daemon.metrics.exposition())}
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


@pytest.fixture
def gpu_node(tmp_path: Path, nvml_dir: Path) -> Iterator[int]:
    """A real medic-healthd on 8 injected GPUs with its metrics port; yields the port once
    every periodic check has run."""
    from cli.lab import scenario as sc

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
        yield port
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
def test_an_8_gpu_node_scraped_over_http_passes_promtool_and_stays_small(gpu_node: int) -> None:
    text = _scrape(gpu_node)
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = samples(text)
    checks = {s[1]["check"] for s in found if s[0] == "medic_check_runs_total"}
    # Before: 308 samples on this node, 34 of them _created and 255 the duration histogram's.
    histogram = [s for s in found if s[0].startswith("medic_check_duration_seconds")]
    assert len(histogram) == 6 * len(checks)
    assert len(found) < 200, f"{len(found)} samples"
    gauge = [s for s in found if s[0] == "medic_gpu_devices"]
    assert gauge == [("medic_gpu_devices", {}, 8.0)]
    # Prometheus asks for OpenMetrics first: no _created there either.
    open_metrics = _scrape(gpu_node, "application/openmetrics-text; version=1.0.0")
    assert "_created" not in open_metrics and "medic_build_info" in open_metrics
