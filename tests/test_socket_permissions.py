"""Per-operation rights on the daemon's socket (hardening issue, "socket per-op
permissions"): the kernel says who connected (SO_PEERCRED), not the request. root may send
every op; a member of `socket_group` (SlurmdUser's group) only what the hooks send, so
`check` (any check by name, the deep tier's hour of burn-in included) is refused to it.

The real medic-healthd, with its socket given to `nogroup`; the peer is `nobody` (whose
group that is) through setpriv, running the project's own client (medic_core.api.ask) from
the installed wheel, as a node has it (tests/installed.py: the checkout may be unreadable)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.socket_api import ROOT_ONLY_OPS, SOCKET_OPS
from medic_core import proc
from medic_core.api import ask
from tests.installed import installed_medic
from tests.test_daemon import plain_config, start_daemon, stop_daemon

ASK = """
import json, sys
from medic_core.api import HealthdUnavailable, ask
try:
    print(json.dumps(ask(sys.argv[1], json.loads(sys.argv[2]), timeout=20)))
except HealthdUnavailable as exc:  # the client's form of an error reply
    print(json.dumps({"error": str(exc).split(": ", 1)[1]}))
"""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@pytest.fixture
def daemon_dir() -> Iterator[Path]:
    """A directory `nobody` can traverse (pytest's own is root-only), as /run/medic is."""
    top = Path(f"/tmp/medic-socket-perms-{os.getpid()}")
    top.mkdir(mode=0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def socket_path(daemon_dir: Path) -> Iterator[Path]:
    group = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
    config = plain_config(daemon_dir)
    config.write_text(config.read_text().replace('socket_group = ""', f'socket_group = "{group}"'))
    pid = start_daemon(daemon_dir, config)
    try:
        yield daemon_dir / "healthd.sock"
    finally:
        stop_daemon(pid, daemon_dir / "healthd.log")


def as_nobody(socket_path: Path, request: dict[str, Any]) -> dict[str, Any]:
    nobody = pwd.getpwnam("nobody")
    done = proc.run(
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
         "--", str(installed_medic().python), "-I", "-c", ASK, str(socket_path),
         json.dumps(request)],
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def test_check_is_roots_only_and_the_hooks_ops_answer_the_group(socket_path: Path) -> None:
    assert sorted(ROOT_ONLY_OPS) == ["adopt", "check"] and "check" in SOCKET_OPS
    nobody = pwd.getpwnam("nobody").pw_uid
    refused = as_nobody(socket_path, {"op": "check", "tier": "deep", "budget": 3600})
    assert refused == {"error": f"check: permission denied for uid {nobody}: root only"}
    adopt = as_nobody(socket_path, {"op": "adopt"})  # only the HealthCheckProgram (root)
    assert adopt == {"error": f"adopt: permission denied for uid {nobody}: root only"}
    # What the hooks send still works for the group (the prolog as a non-root SlurmdUser).
    assert as_nobody(socket_path, {"op": "ping"})["node"] == "plain1"
    assert "results" in as_nobody(socket_path, {"op": "status"})
    launch = as_nobody(socket_path, {"op": "launch", "budget": 5, "job_id": "7"})
    assert launch.get("allow") is True, launch
    # root (this process) may still run checks.
    ran = ask(socket_path, {"op": "check", "checks": ["cpus"]}, timeout=20)
    assert [r["check"] for r in ran["results"]] == ["cpus"]
    log = (socket_path.parent / "healthd.log").read_text()
    assert "socket: check refused to uid" in log and "Traceback" not in log


def test_a_request_cannot_claim_to_be_root(socket_path: Path) -> None:
    """Rights come from the kernel: fields in the request change nothing."""
    forged = as_nobody(socket_path, {"op": "check", "uid": 0, "user": "root", "checks": ["cpus"]})
    assert "permission denied" in forged.get("error", ""), forged
