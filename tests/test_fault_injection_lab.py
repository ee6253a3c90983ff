"""Medic's dependencies failing on the lab (hardening issue, systematic search): the store
down and back (PostgreSQL) and its disk full (a tmpfs), slow and hung webhook receivers, a
hung nvmlInit, a hung filesystem (a FUSE mount nobody answers), connection exhaustion, and
slurmctld down. For each, a real medic-healthd on a lab node with a resilient job running on
it, a fault injected during the outage, and three questions: what Medic did (the drain and
the requeue that must still happen), whether anything was lost (the fault's condition and
events reach the store once the dependency is back), and whether it recovered by itself
(the same daemon process, nobody restarting anything). Everything waits by polling with a
deadline.

Covered elsewhere, not repeated here:

* the hooks' write-ahead journal with the store down or full (the prolog's gate decision
  kept and replayed): tests/test_journal.py
* idle and dripping clients of both servers, and the bounded thread count, on a plain
  daemon: tests/test_server_bounds.py (here: the same flood on a lab node that must still
  drain and requeue)
* the webhook's deadlines, retries and dripping receivers against the sender itself:
  tests/test_webhook.py (here: through a lab node's ladder thread)
* a hung NVML call after start-up (gpu.nvml.unresponsive): tests/test_daemon.py and the
  nvml_hang row of tests/test_remediation.py's fault matrix
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cli.lab.cluster import Lab, pid_alive
from cli.lab.slurm_conf import with_check_options
from medic_core import proc
from medic_core.api import HealthdUnavailable, ask
from medic_core.store import Store, open_store
from remediation import episodes as ep
from remediation.webhook import outbox
from tests.conftest import poll
from tests.lab_views import drained_by_medic, job, node_info
from tests.pg import PostgresServer, pg_server  # noqa: F401  (a pytest fixture)

LADDER_OFF = "enabled = false"


# --- helpers ------------------------------------------------------------------------------------


def node_config(
    lab: Lab,
    tmp_path: Path,
    *,
    remediation: str = "",
    first_rung: str = "",
    checks: dict[str, str] | None = None,
    healthd: str = "",
    store_url: str | None = None,
    extra: str = "",
    state_dir: Path | None = None,
) -> Path:
    """The lab's medic.toml with lines added to [remediation] and [healthd], a first rung
    override, check options, another [store] url ("" for the node's own SQLite store in
    its state_dir), another state_dir and `extra` tables at the end."""
    text = lab.layout.medic_conf.read_text()
    if state_dir is not None:
        text, count = re.subn(r"\nstate_dir = [^\n]*\n", f'\nstate_dir = "{state_dir}"\n', text)
        assert count == 1
    if first_rung:
        text = text.replace("\nfirst_rung = { ", f"\nfirst_rung = {{ {first_rung}, ", 1)
    text = text.replace("[remediation]\n", f"[remediation]\n{remediation}\n", 1)
    text = text.replace("[healthd]\n", f"[healthd]\n{healthd}\n", 1)
    if store_url is not None:
        table = f'[store]\nurl = "{store_url}"\n' if store_url else ""
        text, count = re.subn(r"\[store\]\nurl = [^\n]*\n", table, text)
        assert count == 1
    text = with_check_options(text, checks or {})
    path = tmp_path / "medic.toml"
    path.write_text(text + extra)
    return path


def requeued_off(lab: Lab, job_id: str, name: str) -> bool:
    """Medic's requeue, as Slurm shows it: the note in the job's AdminComment."""
    return f"requeued off {name}" in str(job(lab, job_id).get("admin_comment") or "")


def only_on(lab: Lab, name: str) -> str:
    return "--exclude=" + ",".join(n for n in lab.node_names() if n != name)


def resilient_job(lab: Lab, tmp_path: Path, name: str) -> str:
    """A resilient job whose script runs on `name` (not pinned there), once it runs."""
    started = tmp_path / f"started-{name}-{len(list(tmp_path.glob('started-*')))}"
    out = lab.slurm(
        ["sbatch", "--parsable", "--resilient=2", only_on(lab, name),
         f"--output={tmp_path / 'job-%j.out'}", "--wrap", f"touch {started}; sleep 600"]
    ).stdout  # fmt: skip
    job_id = out.strip().split(";")[0]
    poll(f"job {job_id} running on {name}", started.exists, timeout=60)
    return job_id


def critical(store: Store, name: str) -> set[str]:
    return {c.reason for c in store.conditions(name, status="CRITICAL")}


def answers(sock: Path, timeout: float = 2.0) -> bool:
    try:
        ask(sock, {"op": "ping"}, timeout=timeout)
    except HealthdUnavailable:
        return False
    return True


def log_of(lab: Lab, name: str) -> str:
    return lab.node(name).healthd_log.read_text(errors="replace")


def same_daemon(lab: Lab, name: str, pid: int) -> None:
    """Recovered by itself: the daemon that saw the outage is the one still answering."""
    assert pid_alive(pid), f"medic-healthd on {name} died:\n{log_of(lab, name)[-3000:]}"
    assert ask(lab.node(name).socket, {"op": "ping"}, timeout=5)["pid"] == pid


@pytest.fixture
def lab_store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


# --- the store: PostgreSQL down and back, its disk full and freed ----------------------------


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(target: Path, size: str) -> None:
    done = proc.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                     str(target)], timeout=10)  # fmt: skip
    if not done.ok:
        pytest.skip(f"cannot mount a tmpfs here: {done.describe_failure()}")


def unmount(target: Path) -> None:
    if _libc().umount2(str(target).encode(), 2) != 0:  # MNT_DETACH: even while busy
        err = ctypes.get_errno()
        if err != 22:  # EINVAL: not a mount point (any more)
            raise OSError(err, os.strerror(err), str(target))


def fill(filler: Path) -> None:
    """Write zeros into `filler` until its filesystem is full (ENOSPC)."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


class StoreOutage:
    """n1's store and a way to take it away and give it back: PostgreSQL stopped and
    started again (its data kept), or the SQLite store's filesystem (a 4 MiB tmpfs) filled
    and freed."""

    def __init__(self, kind: str, store: Store, conf: Path, server: PostgresServer | None,
                 filler: Path | None) -> None:  # fmt: skip
        self.kind, self.store, self.conf = kind, store, conf
        self.server, self.filler = server, filler

    def down(self) -> None:
        if self.server is not None:
            self.server.outage()
        else:
            assert self.filler is not None
            fill(self.filler)

    def back(self) -> None:
        if self.server is not None:
            self.server.back()
        elif self.filler is not None:
            self.filler.unlink(missing_ok=True)


NVLINK = {"gpu_nvlink": "interval = 2\n"}


@pytest.fixture(params=["postgresql", "disk full"])
def outage(lab: Lab, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreOutage]:
    """n1's daemon on a store that can fail (the ladder off: the drain and the requeue are
    the subject); the store is back and the tmpfs gone whatever the test did.

    The daemon keeps its state (and so its journal) in a directory of its own: the lab's
    HealthCheckProgram, which runs with the lab's medic.toml and store, replays the
    journal of <node>/state into that other store, and once took the outage's events
    there (as it should on a node, where every Medic process reads one medic.toml)."""
    private_state = tmp_path / "n1-state"
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("pg_server")
        url = server.create_database("medic_outage")
        conf = node_config(lab, tmp_path, remediation=LADDER_OFF, store_url=url, checks=NVLINK,
                           state_dir=private_state)  # fmt: skip
        with open_store(url) as store:
            it = StoreOutage(request.param, store, conf, server, None)
            try:
                yield it
            finally:
                with contextlib.suppress(RuntimeError, TimeoutError):
                    it.back()
        return
    disk = tmp_path / "store-disk"  # the store's filesystem, the one that fills
    disk.mkdir()
    mount_tmpfs(disk, "4m")
    try:
        url = f"sqlite:///{disk / 'medic.db'}"
        conf = node_config(lab, tmp_path, remediation=LADDER_OFF, store_url=url, checks=NVLINK,
                           state_dir=private_state)  # fmt: skip
        with open_store(url) as store:
            yield StoreOutage(request.param, store, conf, None, disk / "filler")
    finally:
        lab.stop_healthd("n1")
        unmount(disk)


def start_with_a_job(lab: Lab, tmp_path: Path, outage: StoreOutage) -> tuple[int, str]:
    pid = lab.start_healthd("n1", config=outage.conf)
    job_id = resilient_job(lab, tmp_path, "n1")
    poll("first round", lambda: bool(outage.store.conditions("n1", type="gpu_xid")), timeout=20)
    return pid, job_id


def fault_during_the_outage(lab: Lab, outage: StoreOutage) -> None:
    """XID 79 on GPU 2 with the store down, until the daemon's log says it failed."""
    before = log_of(lab, "n1").count("the store refused a write")
    outage.down()
    lab.inject("n1", 2, ["xid=79"])
    poll(
        "the daemon's log naming the store's failure",
        lambda: log_of(lab, "n1").count("the store refused a write") > before,
        timeout=20,
    )
    assert answers(lab.node("n1").socket), f"the socket stopped answering ({outage.kind})"


def test_store_down_a_fault_is_still_drained_and_its_job_requeued(
    lab: Lab, tmp_path: Path, outage: StoreOutage
) -> None:
    _, job_id = start_with_a_job(lab, tmp_path, outage)
    outage.down()
    lab.inject("n1", 2, ["xid=79"])
    poll("n1 drained with the store down", lambda: drained_by_medic(lab, "n1"), timeout=20)
    poll("the job requeued", lambda: requeued_off(lab, job_id, "n1"), timeout=20)


def test_store_down_and_back_the_outages_fault_is_answered_without_a_restart(
    lab: Lab, tmp_path: Path, outage: StoreOutage
) -> None:
    pid, job_id = start_with_a_job(lab, tmp_path, outage)
    fault_during_the_outage(lab, outage)
    outage.back()
    # The XID's condition waited in the daemon's memory and is written at its next round.
    poll(
        "the outage's XID 79 in the store",
        lambda: "gpu.xid.79" in critical(outage.store, "n1"),
        timeout=45,
    )
    poll("n1 drained", lambda: drained_by_medic(lab, "n1"), timeout=20)
    poll("the job requeued", lambda: requeued_off(lab, job_id, "n1"), timeout=20)
    same_daemon(lab, "n1", pid)


def test_store_down_and_back_nothing_seen_during_the_outage_is_lost(
    lab: Lab, tmp_path: Path, outage: StoreOutage
) -> None:
    _, job_id = start_with_a_job(lab, tmp_path, outage)
    fault_during_the_outage(lab, outage)  # XID 79 on GPU 2: a condition, answered at once
    lab.inject("n1", 3, ["nvlink.1=down"])  # gpu_nvlink runs every 2 s here
    poll(
        "both faults answered during the outage (the job requeued)",
        lambda: all(
            line in log_of(lab, "n1")
            for line in ("n1: gpu.nvlink.down: drain=", f"job {job_id}: requeued")
        ),
        timeout=30,
    )
    back_at = dt.datetime.now(dt.UTC)
    outage.back()

    def missing() -> list[str]:
        lost = []
        found = critical(outage.store, "n1")
        if "gpu.nvlink.down" not in found:
            lost.append("the NVLink condition")
        if "gpu.xid.79" not in found:
            lost.append("the XID's condition")
        # The answer given during the outage, kept in the node's journal and replayed with
        # its own time (a second answer follows once the store is back: it opens the episode).
        answered = outage.store.events("n1", kind="job_action")
        if not any(e.fault_class == "gpu.xid.79" and e.at < back_at for e in answered):
            lost.append("the event of the outage's drain and requeue")
        return lost

    with contextlib.suppress(AssertionError):
        poll("everything in the store", lambda: not missing(), timeout=30)
    assert not missing(), (
        f"lost with the store {outage.kind}: {missing()}\n{log_of(lab, 'n1')[-4000:]}"
    )


# --- the webhook's receiver slow or hung ------------------------------------------------------


class FlakyReceiver:
    """An HTTP receiver on 127.0.0.1 whose behaviour can change while it runs: "hung" (reads
    the request and never answers until it is fixed, at most 60 s), "slow" (answers 200
    after `slow_seconds`, past the sender's deadline), "ok". It records what it got."""

    def __init__(self, mode: str, slow_seconds: float = 3.0) -> None:
        self.mode = mode
        self.slow_seconds = slow_seconds
        self.fixed = threading.Event()
        self.got: list[tuple[str, str, dict[str, Any]]] = []  # (mode, delivery id, body)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                delivery = self.headers.get("X-Medic-Delivery", "")
                mode = receiver.mode
                receiver.got.append((mode, delivery, json.loads(body)))
                if mode == "hung":
                    receiver.fixed.wait(60)
                    return  # closes without an answer
                if mode == "slow":
                    receiver.fixed.wait(receiver.slow_seconds)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/medic"

    def fix(self) -> None:
        self.mode = "ok"
        self.fixed.set()

    def close(self) -> None:
        self.fixed.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.mark.parametrize("mode", ["hung", "slow"])
def test_a_slow_or_hung_webhook_receiver_holds_up_nothing_and_gets_the_event_later(
    lab: Lab, tmp_path: Path, lab_store: Store, mode: str
) -> None:
    receiver = FlakyReceiver(mode)
    try:
        webhook = (
            f'\n[remediation.webhook]\nurl = "{receiver.url}"\nsecret = "k"\nallow_http = true\n'
            "timeout = 1.0\nmax_attempts = 2\nbackoff_base = 0.1\nbackoff_cap = 0.5\n"
        )
        conf = node_config(lab, tmp_path, first_rung='"gpu.xid.79" = "rma"', extra=webhook)
        pid = lab.start_healthd("n1", config=conf)
        job_id = resilient_job(lab, tmp_path, "n1")
        lab.inject("n1", 2, ["xid=79"])
        # What Medic did: drain, requeue, and the RMA ticket, while the receiver holds up.
        poll("n1 drained", lambda: drained_by_medic(lab, "n1"), timeout=15)
        poll("the job requeued", lambda: requeued_off(lab, job_id, "n1"), timeout=15)
        episodes = ep.EpisodeStore(lab_store)

        def in_rma() -> bool:
            found = episodes.find(node="n1")
            return bool(found) and found[-1].state == ep.RMA

        poll("the episode in RMA with its ticket", in_rma, timeout=30)
        ticket_id = episodes.find(node="n1")[-1].ticket_id
        assert ticket_id is not None
        poll("the receiver held up", lambda: len(receiver.got) >= 1, timeout=15)
        # The ladder's thread is not the one waiting: a second fault is answered at once.
        lab.inject("n1", 5, ["xid=79"])
        poll(
            "the second fault answered",
            lambda: any(e.target == "5" for e in lab_store.events("n1", kind="job_action")),
            timeout=10,
        )
        assert answers(lab.node("n1").socket, timeout=1.0)
        assert all(d.state != "delivered" for d in outbox(lab_store, ticket_id))
        receiver.fix()
        poll(
            "the ticket's event delivered",
            lambda: {d.state for d in outbox(lab_store, ticket_id)} == {"delivered"},
            timeout=30,
        )
        [delivery] = [d for d in outbox(lab_store, ticket_id) if d.event == "ticket.opened"]
        taken = [(m, d) for m, d, _ in receiver.got if d == delivery.delivery_id]
        assert taken and taken[-1][0] in ("ok", "slow"), receiver.got
        # Every attempt at that event carried its one delivery id: a receiver that stored
        # it while Medic had already given up (slow) drops the repeat by that id.
        opened = [d for _, d, body in receiver.got if body.get("event") == "ticket.opened"]
        assert set(opened) == {delivery.delivery_id}, opened
        same_daemon(lab, "n1", pid)
    finally:
        receiver.close()


# --- a hung nvmlInit ----------------------------------------------------------------------------


def test_a_hung_nvml_init_at_start_and_the_daemon_recovers_when_it_returns(
    lab: Lab, tmp_path: Path, lab_store: Store
) -> None:
    conf = node_config(lab, tmp_path, checks={"gpu_count": "interval = 1\n"})
    lab.inject("n1", None, ["hang.nvmlInit=forever"])
    begin = time.monotonic()
    # The socket answers without waiting for nvmlInit (it waited 41 s: nvmlInit's own
    # deadline, then the XID listener's): INIT_WAIT (2 s) and the daemon's own start.
    pid = lab.start_healthd("n1", config=conf, timeout=20)
    socket_after = time.monotonic() - begin
    print(f"\nsocket answered {socket_after:.1f}s after the start, nvmlInit hung")
    # Not a healthy node while NVML is silent, once its first round is in (under load the
    # socket may answer before the round has run).
    poll(
        "the daemon's status not OK while nvmlInit hangs",
        lambda: ask(lab.node("n1").socket, {"op": "status"}, timeout=5)["status"] != "OK",
        timeout=30,
    )
    assert not drained_by_medic(lab, "n1")  # a slow driver is not yet a fault to drain for
    lab.inject("n1", None, ["hang.nvmlInit=0"])
    poll(
        "the GPUs seen once nvmlInit returns",
        lambda: any(c.status == "OK" for c in lab_store.conditions("n1", type="gpu_count")),
        timeout=30,
    )
    job_id = resilient_job(lab, tmp_path, "n1")
    lab.inject("n1", 4, ["xid=79"])  # the XID listener registered: an event is heard
    poll("n1 drained", lambda: drained_by_medic(lab, "n1"), timeout=15)
    poll("the job requeued", lambda: requeued_off(lab, job_id, "n1"), timeout=15)
    same_daemon(lab, "n1", pid)


# --- a hung filesystem --------------------------------------------------------------------------


class HungMount:
    """A FUSE filesystem that never answers: the kernel waits for its server's reply to
    INIT, so every statvfs, open or create on it blocks, as on an NFS or Lustre mount
    whose server is gone. `release` closes the server's end (blocked calls fail with
    ENOTCONN) and detaches the mount: the directory below is plain again."""

    def __init__(self, target: Path) -> None:
        self.target = target
        try:
            self.fd: int | None = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            pytest.skip(f"no FUSE here: {exc}")
        options = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other"
        if _libc().mount(b"medic-hung", str(target).encode(), b"fuse", 0, options.encode()):
            err = ctypes.get_errno()
            os.close(self.fd)
            pytest.skip(f"cannot mount FUSE here: {os.strerror(err)}")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        unmount(self.target)


def test_a_hung_filesystem_drains_and_the_check_recovers_when_it_answers(
    lab: Lab, tmp_path: Path, lab_store: Store
) -> None:
    fs = 'interval = 1\nrequired_mounts = ["/scratch"]\nmount_timeout = 0.5\ntimeout = 3.0\n'
    conf = node_config(lab, tmp_path, checks={"filesystems": fs})
    node = lab.node("n1")
    pid = lab.start_healthd("n1", config=conf)
    poll(
        "/scratch checked",
        lambda: bool(lab_store.conditions("n1", type="filesystems")),
        timeout=20,
    )
    job_id = resilient_job(lab, tmp_path, "n1")
    hung = HungMount(node.host_root / "scratch")
    try:
        poll("fs.hung", lambda: "fs.hung" in critical(lab_store, "n1"), timeout=15)
        poll("n1 drained", lambda: drained_by_medic(lab, "n1"), timeout=15)
        poll("the job requeued", lambda: requeued_off(lab, job_id, "n1"), timeout=15)
        assert answers(node.socket, timeout=1.0), "the socket stopped answering"
        # No pile-up: one probe waits on the hung mount, the next runs do not add more.
        threads = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("Threads:")
            )
        )
        assert threads < 100, threads
    finally:
        hung.release()

    def scratch_ok() -> bool:
        return any(
            c.target == "/scratch" and c.status == "OK"
            for c in lab_store.conditions("n1", type="filesystems")
        )

    poll("/scratch OK again", scratch_ok, timeout=20)
    # By design a hung mount waits for a human (no rung repairs a file server): the node
    # stays drained, its episode says so.
    [episode] = ep.EpisodeStore(lab_store).find(node="n1")
    assert (episode.fault_class, episode.state) == ("fs.hung", ep.NEEDS_HUMAN), episode.message
    assert drained_by_medic(lab, "n1")
    same_daemon(lab, "n1", pid)


# --- connection exhaustion ----------------------------------------------------------------------


def test_a_flood_of_idle_connections_stops_neither_the_drain_nor_the_requeue(
    lab: Lab, tmp_path: Path, lab_store: Store
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    conf = node_config(lab, tmp_path, remediation=LADDER_OFF, healthd=f"metrics_port = {port}")
    conf.write_text(conf.read_text().replace("metrics_port = 0\n", "", 1))
    pid = lab.start_healthd("n1", config=conf)
    job_id = resilient_job(lab, tmp_path, "n1")
    sock = lab.node("n1").socket
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for _ in range(100):  # more than the socket's 64: the rest are told "busy"
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(str(sock))
            idle.append(s)
        injected = time.monotonic()
        lab.inject("n1", 2, ["xid=79"])
        poll("n1 drained", lambda: drained_by_medic(lab, "n1"), timeout=15)
        poll("the job requeued", lambda: requeued_off(lab, job_id, "n1"), timeout=15)
        print(f"\n400 idle connections: drained and requeued {time.monotonic() - injected:.1f}s")
        poll("a ping", lambda: answers(sock), timeout=10)
    finally:
        for s in idle:
            s.close()
    assert "gpu.xid.79" in critical(lab_store, "n1")
    same_daemon(lab, "n1", pid)


# --- slurmctld down -----------------------------------------------------------------------------

# Seconds slurmctld stays down. The issue asks for 60; 20 keeps the two tests below under a
# minute each and is already longer than every Slurm call Medic makes (slurm_timeout 15 s).
SLURMCTLD_OUTAGE = 20.0


@pytest.fixture
def ctld_outage(lab: Lab, tmp_path: Path, lab_store: Store) -> Iterator[tuple[int, str]]:
    """n1's daemon (ladder off) with a resilient job on it; slurmctld is stopped, XID 79
    comes, Medic answers what it can, and slurmctld comes back SLURMCTLD_OUTAGE later.
    Yields (daemon pid, job id); slurmctld runs again whatever the test did."""
    try:
        pid = lab.start_healthd("n1", config=node_config(lab, tmp_path, remediation=LADDER_OFF))
        job_id = resilient_job(lab, tmp_path, "n1")
        lab.stop_slurmctld()
        down_at = time.monotonic()
        lab.inject("n1", 2, ["xid=79"])
        poll("XID 79 seen with slurmctld down", lambda: "gpu.xid.79" in critical(lab_store, "n1"))
        assert answers(lab.node("n1").socket), "the socket stopped answering"

        def answered() -> bool:
            return any(e.target == "2" for e in lab_store.events("n1", kind="job_action"))

        poll("Medic's answer to the fault, recorded", answered, timeout=SLURMCTLD_OUTAGE + 15)
        [answer] = [e for e in lab_store.events("n1", kind="job_action") if e.target == "2"]
        print(f"\nwith slurmctld down: {answer.message}")
        assert answer.message.startswith("gpu.xid.79: not drained: "), answer.message
        poll(
            "the outage's end",
            lambda: time.monotonic() - down_at >= SLURMCTLD_OUTAGE,
            timeout=SLURMCTLD_OUTAGE + 1,
        )
        lab.start_slurmctld()
        yield pid, job_id
    finally:
        lab.start_slurmctld()


def test_slurmctld_down_the_node_is_drained_once_it_is_back(
    lab: Lab, lab_store: Store, ctld_outage: tuple[int, str]
) -> None:
    pid, _ = ctld_outage
    back = time.monotonic()
    poll("n1 drained", lambda: drained_by_medic(lab, "n1"), timeout=90)
    info = node_info(lab, "n1")
    print(f"drained {time.monotonic() - back:.0f}s after slurmctld came back: {info['reason']}")
    assert info["reason"].startswith("medic: gpu.xid.79"), info["reason"]
    same_daemon(lab, "n1", pid)


def test_slurmctld_down_the_resilient_job_is_requeued_once_it_is_back(
    lab: Lab, ctld_outage: tuple[int, str]
) -> None:
    _, job_id = ctld_outage
    poll("the job requeued", lambda: requeued_off(lab, job_id, "n1"), timeout=60)
