"""Burn-in without the daemon (issue 23, finding 4): the pass file the daemon mirrors into the
node's state dir (remediation/burn_in_marker.py), the prolog's decision on it
(slurm_hooks/gate.py), the compiled front and the Python prolog as processes with no daemon,
the daemon's side (written on a pass, removed otherwise, brought in line at its start), and
the opt-in systemd drop-in that makes slurmd require the daemon. On Slurm:
tests/test_burn_in_gate_lab.py."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from medic_core import proc
from medic_core.config import MedicConfig, load_config
from medic_core.drain_reason import format_reason, is_burn_in_reason
from medic_core.settings import HookSettings
from medic_core.status import Status
from medic_core.vocabulary import Verdict
from remediation import burn_in as bi
from remediation import burn_in_marker as marker
from remediation.actions import drain_reason_for
from remediation.burn_in_record import mirror, record_pass, write_record
from remediation.decide import GateDecision
from slurm_hooks import gate
from slurm_hooks.native.build import build_hook
from tests.test_burn_in import DEEP, BurnWorld, bw  # noqa: F401  (the fixture)
from tests.test_daemon import plain_config
from tests.test_ladder_unit import template_db, world  # noqa: F401  (the fixtures)
from tests.test_systemd_unit import SYSTEMD, unit_lines

NODE = "plain1"


def passed(state_dir: Path, node: str = NODE) -> None:
    marker.write_marker(state_dir, marker.marker_for(node, bi.NEW_NODE, (DEEP,)))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    return path


# --- the pass file as the prolog reads it ---------------------------------------------------


def test_a_pass_written_by_the_daemon_reads_as_a_pass(state_dir: Path) -> None:
    passed(state_dir)
    assert marker.refusal(state_dir, NODE) is None
    held = json.loads((state_dir / marker.MARKER).read_text())
    assert held["node"] == NODE and held["checks"] == [DEEP] and held["reason"] == "new_node"
    assert abs(held["passed_at"] - time.time()) < 60
    assert list(state_dir.iterdir()) == [state_dir / marker.MARKER]  # no temporary left


def test_no_file_is_no_pass_a_re_imaged_node_is_burnt_in_again(state_dir: Path) -> None:
    why = marker.refusal(state_dir, NODE)
    assert why is not None and "never burnt in here, or re-imaged" in why
    missing = marker.refusal(state_dir / "gone", NODE)  # not even the state dir
    assert missing is not None and "never burnt in here" in missing


def test_another_nodes_pass_a_copied_disk_image_is_no_pass(state_dir: Path) -> None:
    passed(state_dir, node="n7")
    why = marker.refusal(state_dir, NODE)
    assert why is not None and "not this node's pass" in why


@pytest.mark.parametrize(
    "content",
    [b"", b"passed\n", b"[" * 4000, b'{"node": ["plain1"]}', b'"plain1"', b"\xff\xfe"],
    ids=["empty", "text", "deep", "node-list", "string", "binary"],
)
def test_a_file_that_does_not_read_is_no_pass(state_dir: Path, content: bytes) -> None:
    (state_dir / marker.MARKER).write_bytes(content)
    why = marker.refusal(state_dir, NODE)
    assert why is not None and "\n" not in why


def test_a_planted_symlink_fifo_directory_or_huge_file_is_no_pass(
    state_dir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    passed(elsewhere)  # a valid pass, reached through a link
    path = state_dir / marker.MARKER
    path.symlink_to(elsewhere / marker.MARKER)
    assert "symlink" in str(marker.refusal(state_dir, NODE))
    path.unlink()
    os.mkfifo(path)  # opened without blocking: no writer needed
    started = time.monotonic()
    assert "not a regular file" in str(marker.refusal(state_dir, NODE))
    assert time.monotonic() - started < 1.0
    path.unlink()
    path.mkdir()
    assert marker.refusal(state_dir, NODE) is not None
    path.rmdir()
    path.write_text(json.dumps({"node": NODE, "pad": "x" * marker.MAX_BYTES}))
    assert "larger than" in str(marker.refusal(state_dir, NODE))


def test_a_file_or_dir_others_may_write_is_no_pass(state_dir: Path) -> None:
    passed(state_dir)
    path = state_dir / marker.MARKER
    path.chmod(0o666)
    assert "writable by others" in str(marker.refusal(state_dir, NODE))
    path.chmod(0o644)
    state_dir.chmod(0o777)
    assert "not trusted" in str(marker.refusal(state_dir, NODE))
    state_dir.chmod(0o755)
    assert marker.refusal(state_dir, NODE) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_file_owned_by_a_user_is_no_pass(state_dir: Path) -> None:
    passed(state_dir)
    os.chown(state_dir / marker.MARKER, 65534, 65534)
    assert "not root's" in str(marker.refusal(state_dir, NODE))
    os.chown(state_dir / marker.MARKER, 0, 0)
    os.chown(state_dir, 65534, 65534)
    assert "not trusted" in str(marker.refusal(state_dir, NODE))


# --- the prolog's decision ------------------------------------------------------------------


def config_with(tmp_path: Path, new_node: str) -> MedicConfig:
    path = plain_config(tmp_path, f"[remediation.burn_in]\nnew_node = {new_node}\n")
    return load_config(path, environ={"MEDIC_NODE_NAME": NODE})


def test_burn_in_off_reads_nothing(tmp_path: Path) -> None:
    config = config_with(tmp_path, "[]")
    config.paths.state_dir.mkdir()
    os.mkfifo(config.paths.state_dir / marker.MARKER)  # would refuse, were it read
    assert gate.burn_in_refusal(config) is None


def test_burn_in_on_without_a_pass_is_medics_burn_in_drain(tmp_path: Path) -> None:
    config = config_with(tmp_path, '["deep_dcgm"]')
    config.paths.state_dir.mkdir()
    finding = gate.burn_in_refusal(config)
    assert finding is not None and finding.status is Status.CRITICAL
    assert finding.check == bi.CONDITION
    reason = format_reason(finding.fault_class, finding.target, finding.message)
    # The daemon's burn-in runner takes this drain as its own: it burns in and resumes.
    assert is_burn_in_reason(reason) and reason.startswith("medic: burn-in node not passed")
    passed(config.paths.state_dir)
    assert gate.burn_in_refusal(config) is None


@pytest.fixture
def slow_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """gate_slow_path with the inline tier, the recording and the refusal's drain seen."""
    seen: dict[str, Any] = {"inline": 0, "refused": None, "recorded": None}

    def inline(config: MedicConfig, budget: float) -> Verdict:
        seen["inline"] += 1
        return Verdict(Status.OK, (), "inline", 0.01, "")

    def refuse(config: MedicConfig, s: HookSettings, job: str, d: GateDecision) -> str:
        seen["refused"] = d
        assert d.first is not None
        return f"{config.node_name} refused job {job}: {drain_reason_for(d.first)}"

    monkeypatch.setattr(gate, "run_inline", inline)
    monkeypatch.setattr(gate, "refuse_launch", refuse)
    monkeypatch.setattr(gate, "record_gate", lambda c, j, v, d: seen.update(recorded=d))
    yield seen


def test_no_daemon_and_no_pass_the_job_is_refused_without_running_checks(
    tmp_path: Path, slow_path: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_with(tmp_path, '["deep_dcgm"]')
    settings = HookSettings.from_config(config)
    reply = {"allow": None, "note": "medic-healthd: no such file"}
    code = gate.gate_slow_path(config, settings, "42", reply, time.monotonic() + 5)
    assert code == 1 and slow_path["inline"] == 0
    refused: GateDecision = slow_path["refused"]
    assert not refused.allow and refused.first is not None
    assert refused.first.fault_class == "burn-in" and "not passed" in refused.first.message
    assert slow_path["recorded"] is refused or slow_path["recorded"] == refused
    assert "burn-in" in capsys.readouterr().err

    passed(config.paths.state_dir)
    slow_path["refused"] = None
    assert gate.gate_slow_path(config, settings, "43", reply, time.monotonic() + 5) == 0
    assert slow_path["inline"] == 1 and slow_path["refused"] is None


def test_a_daemons_answer_stands_the_pass_file_is_only_for_its_absence(
    tmp_path: Path, slow_path: dict[str, Any]
) -> None:
    """The daemon burns its node in itself (drained before READY): its refusal is acted on
    with its own reasons, never replaced by the file's."""
    config = config_with(tmp_path, '["deep_dcgm"]')
    settings = HookSettings.from_config(config)
    critical = {"check": "gpu_ecc", "status": "CRITICAL", "fault_class": "gpu.ecc.dbe",
                "target": "0", "message": "2 DBE"}  # fmt: skip
    reply = {"allow": False, "status": "CRITICAL", "results": [critical]}
    assert gate.gate_slow_path(config, settings, "44", reply, time.monotonic() + 5) == 1
    assert slow_path["refused"].first.fault_class == "gpu.ecc.dbe"


# --- the compiled front and the Python prolog, as processes, with no daemon ----------------


def front_without_daemon(tmp_path: Path, new_node: str) -> tuple[Path, dict[str, str]]:
    """The compiled front (handing over to this venv's medic-prolog) and the environment
    slurmd gives it, on a node with no daemon and no Slurm; `new_node`: burn-in's list."""
    prolog = Path(sys.executable).parent / "medic-prolog"
    front = build_hook(tmp_path / "bin", prolog=prolog)
    config = plain_config(tmp_path, f"[remediation.burn_in]\nnew_node = {new_node}\n")
    env = {
        "MEDIC_CONFIG": str(config),
        "SLURMD_NODENAME": NODE,
        "SLURM_JOB_ID": "",  # no releaser: there is no Slurm here
        "MEDIC_SOCKET": str(tmp_path / "healthd.sock"),  # no daemon
        "PATH": "/usr/bin:/bin",
    }
    return front, env


def test_the_front_hands_over_and_the_python_prolog_refuses_a_node_never_burnt_in(
    tmp_path: Path,
) -> None:
    front, env = front_without_daemon(tmp_path, '["deep_dcgm"]')
    refused = proc.run([str(front)], env=env, timeout=60)
    assert refused.returncode == 1, refused.stderr
    assert "burn-in" in refused.stderr and "not passed" in refused.stderr
    passed(tmp_path / "state")
    allowed = proc.run([str(front)], env=env, timeout=60)
    assert allowed.returncode == 0, allowed.stderr


# --- the daemon's side: the file follows the record -----------------------------------------


def test_the_runner_writes_the_pass_and_removes_it_for_a_run(
    bw: BurnWorld,  # noqa: F811
    tmp_path: Path,
) -> None:
    dirs = {name: tmp_path / name for name in ("n1", "n2")}
    for name, path in dirs.items():
        bw.w.daemon(name)
        bw.runners[name].state_dir = lambda path=path: path  # type: ignore[misc]
    bw.burn("n1")
    assert marker.refusal(dirs["n1"], "n1") is None
    # A run starting again (the record says running): no pass until it passes.
    bw.runners["n1"].write(bi.Record(bi.Phase.RUNNING, bi.NEW_NODE, (DEEP,), 1), "again")
    assert not (dirs["n1"] / marker.MARKER).exists()
    # A node whose deep check fails gets no pass.
    bw.node("n2").deep_bad = True
    bw.burn("n2")
    record = bw.record("n2")
    assert record is not None and record.phase is bi.Phase.FAILED
    assert not (dirs["n2"] / marker.MARKER).exists()


def test_the_daemons_start_brings_the_file_in_line_with_the_record(
    bw: BurnWorld,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A node that passed before the file existed (an upgrade) gets it before READY; one
    whose record is gone loses it; a valid file is left as it was."""
    state = tmp_path / "n1"
    bw.w.daemon("n1")
    runner = bw.runners["n1"]
    runner.state_dir = lambda: state
    write_record(bw.w.store, "n1", bi.Record(bi.Phase.PASSED, bi.NEW_NODE, (DEEP,), 1), "old")
    assert not (state / marker.MARKER).exists()
    assert not runner.drain_first()
    assert marker.refusal(state, "n1") is None
    written = (state / marker.MARKER).stat().st_mtime_ns
    runner.drain_first()
    assert (state / marker.MARKER).stat().st_mtime_ns == written
    mirror(state, "n1", None)
    assert not (state / marker.MARKER).exists()


def test_a_pass_recorded_by_the_ladder_writes_the_file(
    bw: BurnWorld,  # noqa: F811
    tmp_path: Path,
) -> None:
    failed = bi.Record(bi.Phase.FAILED, bi.NEW_NODE, (DEEP,), 1, episode=3)
    write_record(bw.w.store, "n3", failed, "failed", state_dir=tmp_path)
    assert not (tmp_path / marker.MARKER).exists()
    record_pass(bw.w.store, "n3", bi.AFTER_REBOOT, (DEEP,), tmp_path)
    assert marker.refusal(tmp_path, "n3") is None
    assert json.loads((tmp_path / marker.MARKER).read_text())["reason"] == bi.AFTER_REBOOT


def test_a_file_that_cannot_be_written_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    mirror(blocked, "n1", bi.Record(bi.Phase.PASSED, bi.NEW_NODE, (DEEP,)))
    assert "not updated" in caplog.text


# --- systemd: slurmd requiring the daemon, opted in -----------------------------------------


def test_the_opt_in_drop_in_makes_slurmd_require_the_daemons_readiness() -> None:
    drop_in = unit_lines(SYSTEMD / "slurmd.service.d" / "medic-healthd.conf")
    order = drop_in["Unit"]
    assert order["Requires"] == ["medic-healthd.service"]
    assert order["After"] == ["medic-healthd.service"]
    # Readiness is READY=1 (the daemon sends it after the burn-in drain, once its socket
    # answers): After= on a Type=notify unit waits for it.
    daemon = unit_lines(SYSTEMD / "medic-healthd.service")
    assert daemon["Service"]["Type"] == ["notify"]
    # The shipped default stays ordering only: the drop-in is the operator's choice.
    assert daemon["Unit"]["Before"] == ["slurmd.service"] and "Requires" not in daemon["Unit"]


def test_a_refusals_drain_is_waited_for_past_the_deadline_a_hung_recording_is_not(
    tmp_path: Path,
    slow_path: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A verdict reached late (a loaded machine): the refusal's drain still gets its
    REFUSAL_GRACE, so the node keeps Medic's reason, not Slurm's "Prolog error"; recording
    the verdict gets only ACTIONS_GRACE past the deadline and is left behind when it hangs."""
    config = config_with(tmp_path, '["deep_dcgm"]')
    settings = HookSettings.from_config(config)
    never = threading.Event()
    drained: list[str] = []

    def slow_drain(config: MedicConfig, s: HookSettings, job: str, d: GateDecision) -> str:
        time.sleep(gate.ACTIONS_GRACE + 0.2)  # a slow slurmctld, past the recording's grace
        drained.append(job)
        return f"{config.node_name} refused job {job}: burn-in (drain: drained)"

    monkeypatch.setattr(gate, "refuse_launch", slow_drain)
    monkeypatch.setattr(gate, "record_gate", lambda c, j, v, d: never.wait())

    def exit_now(code: int) -> NoReturn:
        raise SystemExit(code)

    monkeypatch.setattr(gate, "exit_now", exit_now)
    reply = {"allow": None, "note": "medic-healthd: no such file"}
    with pytest.raises(SystemExit) as ended:
        gate.gate_slow_path(config, settings, "45", reply, time.monotonic() - 1.0)
    assert ended.value.code == 1 and drained == ["45"]
    err = capsys.readouterr().err
    assert "recording still going at the launch deadline; left" in err
    assert "the refusal's drain still going" not in err
    assert "refused job 45: burn-in (drain: drained)" in err
