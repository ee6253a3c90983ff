"""The compiled front's part in post-job hygiene: the daemon's job_end reply says
`"hygiene": true` ([hygiene] enabled) and the front execs `medic-epilog --hygiene`, with the
job's environment; without it (or without a daemon) it never starts Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_hooks.native.build import build_hook
from tests.test_hook_front import FakeDaemon, run_front
from tests.test_hook_front import daemon as daemon  # the fixture


@pytest.fixture
def front(tmp_path: Path) -> Path:
    epilog = tmp_path / "python-epilog"
    epilog.write_text(f'#!/bin/sh\nprintf "%s %s" "$*" "$SLURM_JOB_ID" > {tmp_path}/ran\nexit 3\n')
    epilog.chmod(0o755)
    return build_hook(tmp_path / "bin", prolog=tmp_path / "python-prolog", epilog=epilog)


def test_the_front_hands_over_to_the_python_epilog_when_the_daemon_says_hygiene(
    front: Path, daemon: FakeDaemon, tmp_path: Path
) -> None:
    daemon.reply = {"node": "n1", "job_id": "77", "queued": True, "hygiene": True}
    done = run_front(front, daemon.path, "epilog_slurmd", job="77")
    assert daemon.requests == [{"op": "job_end", "job_id": "77"}]
    assert (tmp_path / "ran").read_text() == "--hygiene 77" and done.returncode == 3


@pytest.mark.parametrize("reply", [{"queued": True, "hygiene": False}, {"queued": True}])
def test_without_hygiene_the_front_never_starts_python(
    front: Path, daemon: FakeDaemon, tmp_path: Path, reply: dict[str, object]
) -> None:
    daemon.reply = reply
    done = run_front(front, daemon.path, "epilog_slurmd", job="78")
    assert done.returncode == 0 and not (tmp_path / "ran").exists()
    gone = run_front(front, tmp_path / "absent.sock", "epilog_slurmd", job="79")
    assert gone.returncode == 0 and not (tmp_path / "ran").exists()
