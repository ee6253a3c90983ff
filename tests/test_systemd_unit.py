"""medic-healthd under systemd (deployment issue, item 5): the shipped unit's lines, the log
lines journald reads priorities from, and the notify messages (STATUS=, RELOADING=1 and
READY=1 around a reload) on a real AF_UNIX datagram socket."""

from __future__ import annotations

import grp
import logging
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.lab.production import setpriv_argv, unit_capabilities
from healthd import logs, sdnotify
from healthd.checks.base import CheckContext, Status, fault, ok
from healthd.daemon import EXIT_CONFIG, HealthDaemon, main
from healthd.watchdog import Heartbeat
from medic_core import proc
from medic_core.api import ask
from medic_core.config import load_config
from medic_core.store import open_configured_store
from tests.conftest import poll
from tests.fakes import FakeClock
from tests.test_daemon import plain_config, start_daemon, stop_daemon

SYSTEMD = Path(__file__).parent.parent / "systemd"
UNIT = SYSTEMD / "medic-healthd.service"


def unit_lines(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value it is given (systemd.syntax(7): comments, sections,
    Key=Value; a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path}: {raw!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: {raw!r} is not Key=Value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


# --- the unit file ----------------------------------------------------------------------------


def test_the_unit_does_not_restart_a_bad_config_and_orders_after_the_nvidia_services() -> None:
    unit = unit_lines(UNIT)
    service, order = unit["Service"], unit["Unit"]
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    assert service["Restart"] == ["always"]
    # The daemon's exit status for a configuration it cannot use is not restarted.
    assert service["RestartPreventExitStatus"] == [str(EXIT_CONFIG)]
    assert EXIT_CONFIG == 78  # EX_CONFIG: systemd names it "78/CONFIG"
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["WatchdogSec"] == ["60s"]
    # Log priorities from the <N> prefixes (systemd's default, stated so nobody turns it off).
    assert service["SyslogLevelPrefix"] == ["yes"]
    assert "StandardError" not in service and "StandardOutput" not in service  # the journal
    after = " ".join(order["After"]).split()
    assert {"nvidia-persistenced.service", "nvidia-fabricmanager.service"} <= set(after)
    # Ordering only: a CPU node has neither, and a failed one must not keep medic down.
    wanted = " ".join(order.get("Wants", []) + order.get("Requires", [])).split()
    assert wanted == ["network-online.target"]
    assert "BindsTo" not in order and "Requisite" not in order


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the shipped unit and its slice; ExecStart points at this
    venv's medic-healthd (verify wants an executable there), nothing else changes."""
    venv_healthd = Path(sys.executable).parent / "medic-healthd"
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/medic-healthd\n" in text
    (tmp_path / UNIT.name).write_text(
        text.replace("ExecStart=/usr/local/bin/medic-healthd", f"ExecStart={venv_healthd}")
    )
    shutil.copy(SYSTEMD / "medic.slice", tmp_path / "medic.slice")
    done = proc.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / UNIT.name)],
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""  # not even an unknown key


# --- log lines for the journal ----------------------------------------------------------------


def record(level: int, message: str, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            info = sys.exc_info()
    return logging.LogRecord("medic.healthd", level, __file__, 1, message, (), info)


def test_journal_lines_carry_the_syslog_priority_on_every_line_and_no_timestamp() -> None:
    formatter = logs.JournalFormatter()
    assert formatter.format(record(logging.ERROR, "reload refused")) == (
        "<3>ERROR medic.healthd: reload refused"
    )
    assert [
        formatter.format(record(level, "x"))[:3]
        for level in (logging.CRITICAL, logging.WARNING, logging.INFO, logging.DEBUG)
    ] == ["<2>", "<4>", "<6>", "<7>"]
    # journald makes every line an entry: each line of a traceback is an error too.
    lines = formatter.format(record(logging.ERROR, "scheduler iteration failed", exc=True))
    assert len(lines.splitlines()) > 3
    assert all(line.startswith("<3>") for line in lines.splitlines())
    assert lines.splitlines()[-1] == "<3>RuntimeError: boom"
    assert not re.search(r"\d{4}-\d\d-\d\d", lines)  # journald stamps entries itself


def test_stderr_is_the_journal_only_when_journal_stream_names_it(tmp_path: Path) -> None:
    with open(tmp_path / "stderr", "w") as stream, open(tmp_path / "other", "w") as other:
        st = (tmp_path / "stderr").stat()
        named = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logs.is_journal(stream, named)
        assert not logs.is_journal(other, named)  # inherited, but stderr went elsewhere
        assert not logs.is_journal(stream, {})
        assert not logs.is_journal(stream, {"JOURNAL_STREAM": "garbage"})

        root = logging.getLogger()
        saved = root.handlers[:], root.level
        try:
            assert logs.configure("info", stream, named)
            logging.getLogger("medic.healthd").warning("a warning")
            assert not logs.configure("info", other, named)  # replaces the first handler
            logging.getLogger("medic.healthd").info("plain")
        finally:
            root.handlers[:], _ = saved
            root.setLevel(saved[1])
    assert (tmp_path / "stderr").read_text() == "<4>WARNING medic.healthd: a warning\n"
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO medic.healthd: plain\n",
        (tmp_path / "other").read_text(),
    )


def test_a_bad_config_exits_78_with_one_error_line_for_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = plain_config(tmp_path, "[checks.ib]\nmin_rate_gbps = -5\n")
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        assert main(["--config", str(config)]) == EXIT_CONFIG
        plain = capsys.readouterr().err
        monkeypatch.setattr(logs, "is_journal", lambda stream, environ=None: True)
        assert main(["--config", str(config)]) == EXIT_CONFIG
        journal = capsys.readouterr().err
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    assert plain.startswith(f"medic-healthd: {config}: checks.ib.min_rate_gbps: ")
    assert journal == "<3>" + plain


# --- notify messages on a real socket ---------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify.sock"))
    listener.settimeout(10)
    yield listener, {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    listener.close()


def received(listener: socket.socket) -> str:
    return listener.recv(4096).decode()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[HealthDaemon]:
    config = load_config(plain_config(tmp_path))
    store = open_configured_store(config)
    yield HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))
    store.close()


def test_a_reload_is_bracketed_by_reloading_and_ready(
    daemon: HealthDaemon, notify_socket: tuple[socket.socket, dict[str, str]]
) -> None:
    listener, env = notify_socket
    daemon.notify = lambda message: sdnotify.notify(message, env)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert daemon.reload()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    start = received(listener)
    assert re.fullmatch(r"RELOADING=1\nMONOTONIC_USEC=\d+", start)
    assert before <= int(start.rsplit("=", 1)[1]) <= after  # CLOCK_MONOTONIC, microseconds
    assert received(listener) == "READY=1"
    # A refused file ends the reload too: the daemon runs on with the old configuration.
    source = daemon.config.source
    assert source is not None
    source.write_text(source.read_text() + "\n[checks.ib]\nmin_rate_gbps = -5\n")
    assert not daemon.reload()
    assert received(listener).startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert received(listener) == "READY=1"


def test_the_status_line_names_gpus_the_last_round_and_the_faults(daemon: HealthDaemon) -> None:
    clock = FakeClock(500.0)
    daemon.heartbeat = Heartbeat(clock)
    assert daemon.status_line() == "watching no GPUs (CPU node); no check round yet; 0 CRITICAL"
    daemon.heartbeat.beat()
    clock.now += 2.4
    now = time.monotonic()
    daemon.recorder._latest = {
        "ib": (now, (fault("ib", Status.CRITICAL, "ib.port.down", "down", target="mlx5_0/1"),)),
        "memory": (now, (fault("memory", Status.WARN, "mem.ce.rate", "many CEs"),)),
        "cpus": (now, (ok("cpus", "fine"),)),
    }
    assert daemon.status_line() == (
        "watching no GPUs (CPU node); last round 2 s ago; 1 CRITICAL, 1 WARN"
    )
    daemon.scheduler.busy_since = now - 95  # a deep probe holds the runner
    assert daemon.status_line().endswith("; periodic checks waiting 95 s for a run in progress")
    daemon.scheduler.busy_since = None
    # A GPU node counts its GPUs from gpu_count's latest result.
    daemon.gpu = object()  # type: ignore[assignment]
    assert daemon.status_line().startswith("watching GPUs (not counted yet); ")
    counted = ok("gpu_count", "8 GPUs", evidence={"count": 8})
    daemon.recorder._latest["gpu_count"] = (now, (counted,))
    assert daemon.status_line().startswith("watching 8 GPUs; last round 2 s ago; ")


def test_the_status_reporter_sends_at_once_and_then_every_period(
    notify_socket: tuple[socket.socket, dict[str, str]],
) -> None:
    listener, env = notify_socket
    lines = iter(["starting", "watching 8 GPUs;\nlast round 2 s ago; 0 CRITICAL"])
    reporter = sdnotify.StatusReporter(
        lambda: next(lines, "done"), period=0.01, notify=lambda m: sdnotify.notify(m, env)
    )
    thread = reporter.start()
    try:
        assert received(listener) == "STATUS=starting"
        assert received(listener) == "STATUS=watching 8 GPUs; last round 2 s ago; 0 CRITICAL"
        poll("more lines", lambda: received(listener) == "STATUS=done")
    finally:
        reporter.stop(timeout=5)
    assert not thread.is_alive()


def test_a_failing_status_line_costs_one_line_not_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[str] = []
    calls: list[Any] = []

    def line() -> str:
        calls.append(None)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return "fine"

    reporter = sdnotify.StatusReporter(line, period=0.01, notify=sent.append)
    reporter.start()
    try:
        poll("a line after the failure", lambda: "STATUS=fine" in sent)
    finally:
        reporter.stop(timeout=5)
    assert "STATUS= line failed" in caplog.text


# --- the unit's sandbox: scored, and the daemon within it -------------------------------------


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_security_rates_the_unit_at_most_4() -> None:
    """Hardening issue: from 7.6 EXPOSED to at most 4.0 (`--offline`: no running systemd
    here; the score comes from the unit file alone, as on a node)."""
    done = proc.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNIT)], timeout=60
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout[-2000:] + done.stderr
    assert float(found.group(1)) <= 4.0, done.stdout[-3000:]


@pytest.mark.skipif(
    shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv"
)
def test_the_daemon_works_with_only_the_units_capabilities_umask_and_no_new_privs(
    tmp_path: Path,
) -> None:
    """medic-healthd as the unit starts it: the bounding set of CapabilityBoundingSet=,
    NoNewPrivileges=, UMask=. It answers, shares its socket with the group (a chown that
    needs CAP_CHOWN), runs its checks, and keeps its store to root."""
    service = unit_lines(UNIT)["Service"]
    assert service["NoNewPrivileges"] == ["yes"] and service["UMask"] == ["0077"]
    group = grp.getgrgid(65534).gr_name  # nogroup: any group root is not in
    prefix = ["sh", "-c", 'umask 0077 && exec "$@"', "sandbox", *setpriv_argv(UNIT)]
    config = plain_config(tmp_path, '[checks.filesystems]\nrequired_mounts = ["/"]\n')
    config.write_text(config.read_text().replace('socket_group = ""', f'socket_group = "{group}"'))
    pid = start_daemon(tmp_path, config, prefix=prefix)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        bounding = int(re.search(r"CapBnd:\s*([0-9a-f]+)", status).group(1), 16)  # type: ignore[union-attr]
        assert bin(bounding).count("1") == len(unit_capabilities(UNIT))  # the sandbox holds
        sock = tmp_path / "healthd.sock"
        assert (sock.stat().st_mode & 0o777, grp.getgrgid(sock.stat().st_gid).gr_name) == (
            0o660,
            group,
        )
        reply = ask(sock, {"op": "check", "checks": ["cpus", "memory", "filesystems"]}, timeout=30)
        statuses = {r["check"]: r["status"] for r in reply["results"]}
        assert statuses == {"cpus": "OK", "memory": "OK", "filesystems": "OK"}, reply
        stored = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
        assert stored and all(p.stat().st_mode & 0o077 == 0 for p in stored), stored
    finally:
        stop_daemon(pid, tmp_path / "healthd.log")
    assert "Traceback" not in (tmp_path / "healthd.log").read_text()


def test_the_units_environment_is_read_as_systemd_reads_it(
    tmp_path: Path,
) -> None:
    from cli.lab.production import unit_environment

    assert unit_environment(UNIT) == {"PYTHONUNBUFFERED": "1", "MALLOC_ARENA_MAX": "2"}
    unit = tmp_path / "x.service"
    unit.write_text(
        "[Unit]\nEnvironment=NOT=service\n[Service]\n"
        'Environment=A=1 "B=two words"\nEnvironment=C=\n# Environment=D=1\n'
    )
    assert unit_environment(unit) == {"A": "1", "B": "two words", "C": ""}
    assert unit_environment(tmp_path / "absent.service") == {}
