"""medic-hook, the compiled front of the Prolog and Epilog, against a real Unix socket that
answers like medic-healthd, with a stand-in for the Python prolog it hands over to. (The lab
tests run it inside slurmd: tests/test_hooks.py.)"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from medic_core import proc
from slurm_hooks.native.build import build_hook

HANDED_OVER = 7  # the stand-in prolog's exit status


@dataclass
class FakeDaemon:
    """A Unix socket server speaking the daemon's protocol: one JSON line in, one out."""

    path: Path
    reply: dict[str, object] = field(default_factory=dict)
    silent: bool = False  # accept, read, never answer (a hung daemon)
    requests: list[dict[str, object]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def front(tmp_path: Path) -> Path:
    stand_in = tmp_path / "python-prolog"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'printf "%s" "${{MEDIC_LAUNCH_REPLY-<unset>}}" > {tmp_path}/handed-over\n'
        f'printf "%s" "${{MEDIC_LAUNCH_NOREPLY-<unset>}}" > {tmp_path}/no-reply\n'
        f'printf "%s" "${{MEDIC_LAUNCH_STARTED-<unset>}}" > {tmp_path}/started\n'
        f"exit {HANDED_OVER}\n"
    )
    stand_in.chmod(0o755)
    return build_hook(tmp_path / "bin", prolog=stand_in)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    fake = FakeDaemon(tmp_path / "healthd.sock")

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            fake.requests.append(json.loads(self.rfile.readline()))
            if fake.silent:
                fake.release.wait(10)
                return
            self.wfile.write(json.dumps(fake.reply).encode() + b"\n")

    server = socketserver.ThreadingUnixStreamServer(str(fake.path), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield fake
    fake.release.set()
    server.shutdown()
    server.server_close()


def run_front(front: Path, socket: Path, context: str, job: str = "42") -> proc.CommandResult:
    env = {"SLURM_SCRIPT_CONTEXT": context, "SLURM_JOB_ID": job, "MEDIC_SOCKET": str(socket)}
    return proc.run([str(front)], env=env, timeout=30)


def handed_over(tmp_path: Path) -> str | None:
    mark = tmp_path / "handed-over"
    return mark.read_text() if mark.exists() else None


def test_an_allowed_launch_never_starts_python(
    front: Path, daemon: FakeDaemon, tmp_path: Path
) -> None:
    daemon.reply = {"allow": True, "status": "OK"}
    done = run_front(front, daemon.path, "prolog_slurmd")
    assert done.returncode == 0, done.stderr
    assert handed_over(tmp_path) is None
    # No budget of its own: a fresh-only question, which the daemon answers at once.
    assert daemon.requests == [
        {"op": "launch", "fresh_only": True, "job_id": "42", "partition": "", "account": ""}
    ]


def test_a_refusal_hands_the_daemons_answer_to_the_python_prolog(
    front: Path, daemon: FakeDaemon, tmp_path: Path
) -> None:
    daemon.reply = {"allow": False, "status": "CRITICAL", "results": [{"check": "gpu_xid"}]}
    done = run_front(front, daemon.path, "prolog_slurmd")
    assert done.returncode == HANDED_OVER
    assert json.loads(handed_over(tmp_path) or "") == daemon.reply
    assert len(daemon.requests) == 1  # the Python prolog does not ask (and record) again


@pytest.mark.parametrize("why", ["no daemon", "hung daemon", "odd job id"])
def test_anything_else_goes_to_the_python_prolog_with_nothing(
    front: Path, daemon: FakeDaemon, tmp_path: Path, why: str
) -> None:
    socket, job = daemon.path, "42"
    if why == "no daemon":
        socket = tmp_path / "absent.sock"
    elif why == "hung daemon":
        daemon.silent = True  # the front gives up after its fixed 0.5 s wait
    else:
        job = "42; rm -rf /"
    done = run_front(front, socket, "prolog_slurmd", job=job)
    assert done.returncode == HANDED_OVER
    assert handed_over(tmp_path) == "<unset>"
    no_reply = (tmp_path / "no-reply").read_text()
    if why == "odd job id":  # not asked: the Python prolog asks, with the job id quoted
        assert no_reply == "<unset>"
    else:  # asked, no answer: the Python prolog judges inline at once
        assert no_reply != "<unset>" and no_reply
    if why == "hung daemon":
        assert "within its fixed wait" in no_reply


def test_the_front_hands_its_start_to_the_python_prolog_and_waits_no_budget(
    front: Path, daemon: FakeDaemon, tmp_path: Path
) -> None:
    """The deadline counts from the front's start, whatever the budget: the front stamps it
    (CLOCK_MONOTONIC, what time.monotonic() reads) and a hung daemon costs it only its fixed
    0.5 s wait, so the Python prolog has the rest of the configured budget."""
    daemon.silent = True
    before = time.monotonic()
    done = run_front(front, daemon.path, "prolog_slurmd")
    after = time.monotonic()
    assert done.returncode == HANDED_OVER
    started = float((tmp_path / "started").read_text())
    assert before <= started <= after
    assert 0.4 <= after - started < 1.5  # the fixed wait, not the old 3 s nor any budget


def test_stale_results_go_to_the_python_prolog_to_run_within_the_budget(
    front: Path, daemon: FakeDaemon, tmp_path: Path
) -> None:
    daemon.reply = {"node": "n1", "tier": "launch", "stale": ["gpu_count"]}
    done = run_front(front, daemon.path, "prolog_slurmd")
    assert done.returncode == HANDED_OVER
    assert json.loads(handed_over(tmp_path) or "") == daemon.reply
    assert (tmp_path / "no-reply").read_text() == "<unset>"


def test_the_epilog_reports_the_job_end_and_always_exits_0(
    front: Path, daemon: FakeDaemon, tmp_path: Path
) -> None:
    daemon.reply = {"ok": True}
    done = run_front(front, daemon.path, "epilog_slurmd", job="77")
    assert done.returncode == 0
    assert daemon.requests == [{"op": "job_end", "job_id": "77"}]
    gone = run_front(front, tmp_path / "absent.sock", "epilog_slurmd", job="78")
    assert gone.returncode == 0 and handed_over(tmp_path) is None
    assert "job 78: no post-job checks" in gone.stderr


def test_the_build_is_skipped_when_up_to_date_and_redone_for_another_prolog(
    tmp_path: Path,
) -> None:
    first = build_hook(tmp_path, prolog=Path("/opt/a/medic-prolog"))
    built = first.stat().st_mtime_ns
    assert build_hook(tmp_path, prolog=Path("/opt/a/medic-prolog")).stat().st_mtime_ns == built
    build_hook(tmp_path, prolog=Path("/opt/b/medic-prolog"))
    assert b"/opt/b/medic-prolog" in first.read_bytes()
