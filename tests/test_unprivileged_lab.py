"""A user without privileges attacks Medic on the lab (hardening issue, systematic search):
each attack runs as a real non-root account (`medic-mallory`, created here if absent) with
setpriv, against a lab whose directories are traversable by everyone as a production
node's are (/etc/slurm, /run, /var/lib; the lab lives outside pytest's root-only temporary
directory for that). Every test asserts the attack fails and that Medic keeps working
afterwards: a fault is still drained and a resilient job still requeued. What the intruder
runs (Python, `medic`) comes from the installed wheel (tests/installed.py), as on a node:
the checkout and its .venv may be where no other user can read them.

What a user can reach, and what these tests show of it:

* the daemon's socket: nothing. It is 0600 root (the lab's `socket_group = ""`) or 0660
  root:`socket_group` (production: SlurmUser's group). Behind the mode, rights per op come
  from SO_PEERCRED: a group member may send what the hooks send (`event` and
  `job_summary` write events), and `check` is root's only (tests/test_socket_permissions.py),
  so `socket_group` must still hold only Slurm's own account.
* the metrics port (TCP, loopback): any local user can connect; the server's bounds hold.
* the store (SQLite, -wal, -shm): 0600 root; `medic rma list` and `medic jobs` as a user
  fail with one line, showing nothing.
* the hooks' journal (`<state_dir>/journal`, else `<socket dir>/journal`): 0700 root in
  root-only directories.
* Slurm: a user's job name and comment (any bytes), and files in group-writable mounts
  that the filesystems check probes.

The same attacks covered from root's side, not repeated here:

* planted symlinks and FIFOs at a guessed probe name (the random part forced):
  tests/test_probe_files.py
* Slurm output with bytes that are not UTF-8 and odd restart counts, parsed:
  tests/test_slurm_fuzz.py
* idle and dripping clients of both servers on a plain daemon: tests/test_server_bounds.py
* an admin's reason quoted as `"medic: ..."` refused by `medic node drain|reboot`, and what
  Slurm stores of it: tests/test_reserved_reason.py
* the store's modes on creation and on open, a symlink or FIFO at its name:
  tests/test_store_permissions.py
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.lab.cluster import SYSTEM_PATH, Lab, pid_alive
from cli.lab.slurm_conf import with_check_options
from medic_core import proc
from medic_core.api import ask
from medic_core.store import Store, open_store
from remediation import tickets
from tests.conftest import poll
from tests.installed import installed_medic
from tests.lab_views import drained_by_medic, job, node_info

USER = "medic-mallory"
VENV_BIN = Path(sys.executable).parent  # root's medic: the checkout's
# The ladder off (the drain and the requeue are what must go on), and a drain cap of 2 of the
# 5 nodes, so one test may see Medic drain two.
REMEDIATION = "enabled = false\nmax_drained_share = 0.4"
SECRET = "SERIAL-1654321000003-SECRET"


# --- the intruder and the lab it can reach --------------------------------------------------


@dataclass(frozen=True)
class Intruder:
    name: str
    uid: int
    gid: int

    def argv(self, *argv: str) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--", *argv]  # fmt: skip


@pytest.fixture(scope="module")
def intruder() -> Intruder:
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        proc.run(
            ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", "/usr/sbin/nologin", USER],
            timeout=30, check=True,
        )  # fmt: skip
        entry = pwd.getpwnam(USER)
    assert entry.pw_uid != 0
    return Intruder(USER, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="module")
def lab_session() -> Iterator[Lab]:
    """This module's own lab, below a directory everyone may traverse (not list): pytest's
    temporary root is root-only, and pytest tightens it again at every start."""
    if os.geteuid() != 0:
        pytest.fail("the lab tests run munged, slurmctld and slurmd: run them as root")
    top = Path(tempfile.mkdtemp(prefix="medic-unpriv-"))
    top.chmod(0o711)
    lab = Lab(top / "lab")
    try:
        lab.up()
    except BaseException:
        shutil.rmtree(top, ignore_errors=True)
        raise
    try:
        yield lab
    finally:
        lab.down()
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def home(lab: Lab, intruder: Intruder) -> Path:
    """The intruder's own directory (its jobs' working directory and output)."""
    path = lab.root / "home" / intruder.name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    path.parent.chmod(0o711)
    os.chown(path, intruder.uid, intruder.gid)
    path.chmod(0o700)
    return path


def user_env(lab: Lab, home: Path) -> dict[str, str]:
    return {"PATH": SYSTEM_PATH, "HOME": str(home), "LANG": "C.UTF-8", **lab.env()}


def as_user(
    intruder: Intruder, lab: Lab, home: Path, *argv: str, timeout: float = 30
) -> proc.CommandResult:
    return proc.run(intruder.argv(*argv), env=user_env(lab, home), cwd=home, timeout=timeout)


def python_as_user(
    intruder: Intruder, lab: Lab, home: Path, script: str, *args: str, timeout: float = 30
) -> Any:
    """Run `script` as the intruder; it prints one JSON document, returned."""
    done = as_user(intruder, lab, home, str(installed_medic().python), "-I", "-c", script,
                   *args, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- Medic on the lab -----------------------------------------------------------------------


def node_config(lab: Lab, tmp_path: Path, *, checks: dict[str, str] | None = None,
                healthd: str = "") -> Path:  # fmt: skip
    text = lab.layout.medic_conf.read_text()
    text = text.replace("[remediation]\n", f"[remediation]\n{REMEDIATION}\n", 1)
    text = text.replace("[healthd]\n", f"[healthd]\n{healthd}\n", 1)
    path = tmp_path / "medic.toml"
    path.write_text(with_check_options(text, checks or {}))
    return path


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def only_on(lab: Lab, name: str) -> str:
    return "--exclude=" + ",".join(n for n in lab.node_names() if n != name)


def resilient_job(lab: Lab, tmp_path: Path, name: str) -> str:
    started = tmp_path / f"started-{len(list(tmp_path.glob('started-*')))}"
    out = lab.slurm(
        ["sbatch", "--parsable", "--resilient=2", only_on(lab, name),
         f"--output={tmp_path / 'job-%j.out'}", "--wrap", f"touch {started}; sleep 600"]
    ).stdout  # fmt: skip
    job_id = out.strip().split(";")[0]
    poll(f"job {job_id} running on {name}", started.exists, timeout=60)
    return job_id


def medic_still_works(lab: Lab, tmp_path: Path, name: str, gpu: int) -> str:
    """After the attack: a fault on `name` is drained and its resilient job requeued."""
    job_id = resilient_job(lab, tmp_path, name)
    lab.inject(name, gpu, ["xid=79"])
    poll(f"{name} drained", lambda: drained_by_medic(lab, name), timeout=15)
    poll(
        "the resilient job requeued",
        lambda: f"requeued off {name}" in str(job(lab, job_id).get("admin_comment") or ""),
        timeout=15,
    )
    return job_id


def quiet(result: proc.CommandResult) -> str:
    return result.stdout + result.stderr


# --- 1: symlinks and FIFOs where the filesystems check writes its probe ----------------------

PLANT = r"""
import json, os, sys, time
scratch, victim, host, pid, seconds = sys.argv[1:6]
planted = []
old = os.path.join(scratch, f".medic-probe.{host}.{pid}")  # the name Medic once used
os.symlink(victim, old)
planted.append(old)
for n in range(64):  # guesses at the random name: FIFOs and links to the victim
    fifo = os.path.join(scratch, f".medic-probe.{n:032x}")
    os.mkfifo(fifo)
    link = os.path.join(scratch, f".medic-probe.{n + 64:032x}")
    os.symlink(victim, link)
    planted += [fifo, link]
# Then race: whatever root creates there is replaced by a link to the victim (the directory
# is group-writable without the sticky bit, so the user may remove root's files in it).
swapped, ends = 0, time.monotonic() + float(seconds)
while time.monotonic() < ends:
    for entry in os.scandir(scratch):
        try:
            if entry.stat(follow_symlinks=False).st_uid == 0:
                os.unlink(entry.path)
                os.symlink(victim, entry.path)
                swapped += 1
        except OSError:
            pass
print(json.dumps({"planted": planted, "swapped": swapped}))
"""


def test_planted_links_fifos_and_a_racer_in_a_group_writable_mount_change_nothing(
    lab: Lab, tmp_path: Path, intruder: Intruder, home: Path, store: Store
) -> None:
    node = lab.node("n1")
    scratch = node.host_root / "scratch"
    os.chown(scratch, 0, intruder.gid)
    scratch.chmod(0o2775)  # a project directory: group-writable, no sticky bit
    victim = lab.root / "victim"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    fs = 'interval = 1\nrequired_mounts = ["/scratch"]\nmount_timeout = 1.0\n'
    pid = lab.start_healthd("n1", config=node_config(lab, tmp_path, checks={"filesystems": fs}))
    poll("the first probe", lambda: bool(store.conditions("n1", type="filesystems")), timeout=20)
    host = socket.gethostname()
    result = python_as_user(
        intruder, lab, home, PLANT, str(scratch), str(victim), host, str(pid), "6", timeout=60
    )
    assert victim.read_text() == "root only\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.stat().st_uid == 0
    # Probes went on all along and found /scratch writable: the planted names were never
    # opened, the racer only ever replaced names, and every probe wrote through its own fd.
    [scratch_now] = [c for c in store.conditions("n1", type="filesystems")
                     if c.target == "/scratch"]  # fmt: skip
    assert str(scratch_now.status) == "OK", scratch_now.message
    for path in result["planted"]:
        assert os.path.lexists(path)  # not Medic's to remove
    poll(
        "no probe file of root's left behind",
        lambda: not [p for p in scratch.iterdir() if p.lstat().st_uid == 0],
        timeout=5,
    )
    medic_still_works(lab, tmp_path, "n1", 3)
    assert pid_alive(pid)


# --- 2: a job name that is not UTF-8 and a bogus resilience tag ------------------------------


def test_a_users_job_name_in_bad_utf8_and_a_bogus_tag_stop_no_requeue_and_no_medic_jobs(
    lab: Lab, tmp_path: Path, intruder: Intruder, home: Path, store: Store
) -> None:
    lab.start_healthd("n1", config=node_config(lab, tmp_path))
    bad_name = "bad\udcff\udcfe"  # the bytes 0xff 0xfe on the command line
    held = as_user(
        intruder, lab, home, "sbatch", "--parsable", "-J", bad_name, "--hold",
        "--output=/dev/null", "--wrap", "true",
    )  # fmt: skip
    assert held.ok, quiet(held)
    mark = home / "running"
    running = as_user(
        intruder, lab, home, "sbatch", "--parsable", "-J", bad_name,
        "--comment=medic:resilient=\u00b2", "--requeue", only_on(lab, "n1"),
        "--output=/dev/null", "--wrap", f"touch {mark}; sleep 600",
    )  # fmt: skip
    assert running.ok, quiet(running)
    users_job = running.stdout.strip().split(";")[0]
    poll("the user's job running on n1", mark.exists, timeout=60)

    job_id = medic_still_works(lab, tmp_path, "n1", 2)
    theirs = job(lab, users_job)
    # Not resilient (the tag is not a number Medic reads): left running, its owner told.
    assert (theirs["job_state"], theirs["restart_cnt"]) == ("RUNNING", 0), theirs
    actions = {e.target: e.evidence.get("action") for e in store.events("n1", kind="job_action")}
    assert actions.get(f"job:{job_id}") == "requeued", actions
    assert actions.get(f"job:{users_job}") not in (None, "requeued"), actions

    conf = str(lab.layout.medic_conf)
    for args in (["jobs", "--all", "--json"], ["jobs", "--all"]):
        shown = proc.run([str(VENV_BIN / "medic"), *args, "--config", conf],
                         env=lab.process_env(), timeout=60)  # fmt: skip
        assert shown.ok and "Traceback" not in shown.stderr, quiet(shown)
        assert users_job in shown.stdout and job_id in shown.stdout, shown.stdout
    listed = json.loads(
        proc.run(
            [str(VENV_BIN / "medic"), "jobs", "--all", "--json", "--config", conf],
            env=lab.process_env(),
            timeout=60,
        ).stdout
    )
    [row] = [j for j in listed if j["job_id"] == users_job]
    assert "bad" in json.dumps(row), row


# --- 3: a user's connection flood ----------------------------------------------------------

FLOOD = r"""
import json, os, socket, sys, time
port, sock_path, stop, count, seconds = sys.argv[1:6]
held, unix = [], {}
for _ in range(int(count)):
    held.append(socket.create_connection(("127.0.0.1", int(port)), timeout=5))
for _ in range(int(count)):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sock_path)
        held.append(s)
        unix["connected"] = unix.get("connected", 0) + 1
    except OSError as exc:
        unix[type(exc).__name__] = unix.get(type(exc).__name__, 0) + 1
        s.close()
print(json.dumps({"tcp": len(held) - unix.get("connected", 0), "unix": unix}), flush=True)
ends = time.monotonic() + float(seconds)
while not os.path.exists(stop) and time.monotonic() < ends:
    time.sleep(0.1)
"""


def test_a_users_connection_flood_stops_neither_answers_nor_checks(
    lab: Lab, tmp_path: Path, intruder: Intruder, home: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    conf = node_config(lab, tmp_path, healthd=f"metrics_port = {port}")
    conf.write_text(conf.read_text().replace("metrics_port = 0\n", "", 1))
    pid = lab.start_healthd("n1", config=conf)
    sock = lab.node("n1").socket
    out = home / "flood.out"
    stop = home / "stop"
    argv = intruder.argv(str(installed_medic().python), "-I", "-c", FLOOD, str(port),
                         str(sock), str(stop), "300", "120")  # fmt: skip
    flood = proc.spawn(argv, log_path=out, env=user_env(lab, home), cwd=home)
    try:
        poll("the flood in place", lambda: out.exists() and "{" in out.read_text(), timeout=30)
        summary = json.loads(out.read_text().strip().splitlines()[0])
        assert summary["tcp"] == 300
        assert summary["unix"] == {"PermissionError": 300}, summary  # the socket: root only
        begin = time.monotonic()
        poll("a ping", lambda: ask(sock, {"op": "ping"}, timeout=2)["pid"] == pid, timeout=8)
        assert time.monotonic() - begin < 8
        medic_still_works(lab, tmp_path, "n1", 6)
    finally:
        stop.touch()
        with contextlib.suppress(ProcessLookupError):
            os.kill(flood, signal.SIGTERM)
        poll("the flood gone", lambda: not pid_alive(flood), timeout=10)
    assert pid_alive(pid)


# --- 4: a user cannot drain, resume or set a reason that reads as Medic's ---------------------


def test_a_user_can_neither_resume_medics_drain_nor_set_a_medic_reason(
    lab: Lab, tmp_path: Path, intruder: Intruder, home: Path
) -> None:
    conf = node_config(lab, tmp_path)
    lab.start_healthd("n1", config=conf)
    lab.inject("n1", 1, ["xid=79"])
    poll("n1 drained by Medic", lambda: drained_by_medic(lab, "n1"), timeout=15)
    reason = node_info(lab, "n1")["reason"]
    users_conf = str(lab.layout.medic_conf)  # world-readable, as /etc/medic/medic.toml
    medic = str(installed_medic().command("medic"))
    attempts = [
        ["scontrol", "update", "nodename=n1", "state=resume"],
        ["scontrol", "update", "nodename=n2", "state=drain", 'reason="medic: gpu.xid.79 fake"'],
        ["scontrol", "update", "nodename=n1", "reason=medic: gpu.ok"],
        [medic, "node", "resume", "n1", "--reason", "mine", "--config", users_conf],
        [medic, "node", "drain", "n2", "--reason", "admin: mine", "--config", users_conf],
        [medic, "node", "drain", "n2", "--reason", '"medic: fake"', "--config", users_conf],
    ]  # fmt: skip
    for argv in attempts:
        done = as_user(intruder, lab, home, *argv)
        assert done.returncode not in (0, None), f"{argv}: {quiet(done)}"
        assert "Traceback" not in done.stderr, f"{argv}: {done.stderr}"
        print(f"\n{argv[0].rsplit('/', 1)[-1]} {' '.join(argv[1:3])}: {quiet(done).strip()}")
    assert drained_by_medic(lab, "n1") and node_info(lab, "n1")["reason"] == reason
    n2 = node_info(lab, "n2")
    assert "DRAIN" not in n2.get("state_flags", []) and not n2.get("reason"), n2
    lab.start_healthd("n2", config=conf)
    medic_still_works(lab, tmp_path, "n2", 0)


# --- 6: the store, the journal, the socket and the RMA tickets ------------------------------

PROBE = r"""
import json, os, socket, sys
out = {}
for path in sys.argv[1:4]:  # the store and its -wal and -shm: reading
    try:
        open(path, "rb").read(1)
        out[path] = "read"
    except OSError as exc:
        out[path] = type(exc).__name__
for journal in sys.argv[4:6]:  # the hooks' journal, and its fallback: writing
    try:
        os.makedirs(journal, exist_ok=True)
        with open(os.path.join(journal, "00000000000000000000-1-aa.json"), "x") as f:
            f.write("{}")
        out[journal] = "written"
    except OSError as exc:
        out[journal] = type(exc).__name__
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[6])
    s.sendall(b'{"op": "event", "kind": "gate", "message": "forged"}\n')
    out["socket"] = s.recv(1000).decode()
except OSError as exc:
    out["socket"] = type(exc).__name__
print(json.dumps(out))
"""


def test_the_store_the_journal_the_socket_and_rma_tickets_are_closed_to_a_user(
    lab: Lab, tmp_path: Path, intruder: Intruder, home: Path, store: Store
) -> None:
    conf = node_config(lab, tmp_path)
    lab.start_healthd("n1", config=conf)
    node = lab.node("n1")
    # A ticket of another node (a ticket keeps its node out of service).
    ticket = tickets.open_ticket(
        store, "n5", "gpu.xid.79", f"GPU 3 off the bus, {SECRET}",
        [tickets.Gpu(3, "GPU-x", SECRET, "00000000:47:00.0")], {"note": SECRET}, "test",
    )  # fmt: skip
    db = str(lab.layout.store_db)
    poll("the store's -wal and -shm", lambda: Path(f"{db}-wal").exists(), timeout=10)
    journals = [str(node.state_dir / "journal"), str(node.socket.parent / "journal")]
    found = python_as_user(
        intruder, lab, home, PROBE, db, f"{db}-wal", f"{db}-shm", *journals, str(node.socket)
    )
    assert found == {
        db: "PermissionError",
        f"{db}-wal": "PermissionError",
        f"{db}-shm": "PermissionError",
        journals[0]: "PermissionError",
        journals[1]: "PermissionError",
        "socket": "PermissionError",
    }, found
    for suffix in ("", "-wal", "-shm"):
        assert stat.S_IMODE(os.stat(f"{db}{suffix}").st_mode) == 0o600, suffix
    assert stat.S_IMODE(node.socket.stat().st_mode) == 0o600

    users_conf = str(lab.layout.medic_conf)  # world-readable, as /etc/medic/medic.toml
    assert stat.S_IMODE(lab.layout.medic_conf.stat().st_mode) & 0o004
    for args in (["rma", "list"], ["rma", "show", str(ticket.id)], ["jobs"], ["events"]):
        shown = as_user(intruder, lab, home, str(installed_medic().command("medic")), *args,
                        "--config", users_conf, timeout=60)  # fmt: skip
        assert shown.returncode not in (0, None), f"{args}: {quiet(shown)}"
        assert SECRET not in quiet(shown), f"{args}: {quiet(shown)}"
        assert "Traceback" not in shown.stderr, f"{args}: {shown.stderr}"
        assert shown.stderr.startswith("medic: "), f"{args}: {shown.stderr}"
        assert "cannot open the store" in shown.stderr, f"{args}: {shown.stderr}"
    assert not [e for e in store.events("n1") if "forged" in e.message]
    medic_still_works(lab, tmp_path, "n1", 5)
