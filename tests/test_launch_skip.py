"""Launch checks skipped per partition or account the admin lists (`[hooks]
skip_launch_partitions`, `skip_launch_accounts`), matched against what slurmd sets for the
Prolog (SLURM_JOB_PARTITION, SLURM_JOB_ACCOUNT), never what the job says: the compiled front
and the Python prolog send them, the daemon's gate runs no launch check for a listed one and
records that it did not (an open RMA ticket still refuses). The gate in observe-only mode
allows what it would have refused and says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.checks.base import Status, fault, ok
from medic_core import proc
from medic_core.config import ConfigError, NodePaths
from medic_core.settings import HookSettings
from medic_core.typed_config import parse_table
from slurm_hooks.job_place import job_place
from tests.test_gate_recorder import GatedStore, gate_events, make_gate, paths, store  # noqa: F401
from tests.test_hook_front import FakeDaemon, daemon, front  # noqa: F401

WORDS = st.text(alphabet="abcdefgh-_.0", min_size=0, max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    partitions=st.lists(WORDS, max_size=4),
    accounts=st.lists(WORDS, max_size=4),
    partition=WORDS,
    account=WORDS,
)
def test_skipped_only_for_a_listed_partition_or_account(
    partitions: list[str], accounts: list[str], partition: str, account: str
) -> None:
    hooks = HookSettings(
        skip_launch_partitions=tuple(partitions), skip_launch_accounts=tuple(accounts)
    )
    why = hooks.skips_launch_checks(partition, account)
    listed = (partition and partition in partitions) or (account and account in accounts)
    assert bool(why) == bool(listed)
    if partition and partition in partitions:
        assert why == f"partition {partition} is in [hooks] skip_launch_partitions"
    assert HookSettings().skips_launch_checks(partition, account) == ""  # nothing listed


@pytest.mark.parametrize("bad", [[""], [" debug"], "debug"])
def test_a_bad_list_is_one_line(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_table(HookSettings, {"skip_launch_partitions": bad}, prefix="hooks", source=None)
    assert "hooks.skip_launch_partitions" in str(caught.value)


@pytest.mark.parametrize(
    ("env", "place"),
    [
        ({"SLURM_JOB_PARTITION": "debug", "SLURM_JOB_ACCOUNT": "ops"}, ("debug", "ops")),
        ({"SLURM_JOB_PARTITION": 'x"}, "allow": true', "SLURM_JOB_ACCOUNT": "a" * 65}, ("", "")),
        ({}, ("", "")),
    ],
)
def test_the_place_is_slurmds_and_only_plain_words(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], place: tuple[str, str]
) -> None:
    for key in ("SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert job_place() == {"partition": place[0], "account": place[1]}


@pytest.mark.parametrize(
    ("partition", "account", "sent"),
    [
        ("debug", "ops", ("debug", "ops")),
        ('gpu", "x": "y', "ops", ("", "ops")),  # nothing a JSON string would need escaped
    ],
)
def test_the_front_sends_the_place_slurmd_set(
    front: Path,  # noqa: F811
    daemon: FakeDaemon,  # noqa: F811
    partition: str,
    account: str,
    sent: tuple[str, str],
) -> None:
    daemon.reply = {"allow": True, "status": "OK"}
    env = {
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": "42",
        "MEDIC_SOCKET": str(daemon.path), "SLURM_JOB_PARTITION": partition,
        "SLURM_JOB_ACCOUNT": account,
    }  # fmt: skip
    assert proc.run([str(front)], env=env, timeout=30).returncode == 0
    [request] = daemon.requests
    assert (request["partition"], request["account"]) == sent


def configured(gate: object, **tables: dict[str, object]) -> None:
    host = gate.host  # type: ignore[attr-defined]
    host.config = dataclasses.replace(host.config, tables=tables)


def test_the_gate_runs_no_check_for_a_listed_partition_and_records_it(
    tmp_path: Path,
    paths: NodePaths,  # noqa: F811
    store: GatedStore,  # noqa: F811
) -> None:
    bad = fault("gpu_count", Status.CRITICAL, "gpu.count.missing", "7 of 8 GPUs")
    gate = make_gate(tmp_path, paths, store, bad)
    configured(gate, hooks={"skip_launch_partitions": ["debug"]})
    reply = gate.launch(5.0, job_id="42", partition="debug", account="ops")
    assert (reply["allow"], reply["status"], reply["ran"]) == (True, "OK", [])
    refused = gate.launch(5.0, job_id="43", partition="gpu", account="ops")
    assert refused["allow"] is False  # another partition: checked, refused
    assert gate.launch(5.0, job_id=None, partition="debug")["status"] == "CRITICAL"
    assert gate.recorder.flush(10)
    events = {e.target: e for e in gate_events(store)}
    skipped = events["job:42"]
    assert skipped.evidence["skipped"] == "partition debug is in [hooks] skip_launch_partitions"
    assert "launch checks skipped: partition debug" in skipped.message
    assert events["job:43"].evidence["skipped"] == ""


def test_the_gate_in_observe_only_mode_allows_and_records_the_refusal(
    tmp_path: Path,
    paths: NodePaths,  # noqa: F811
    store: GatedStore,  # noqa: F811
) -> None:
    bad = fault("gpu_count", Status.CRITICAL, "gpu.count.missing", "7 of 8 GPUs")
    gate = make_gate(tmp_path, paths, store, bad)
    configured(gate, remediation={"observe_only": True})
    reply = gate.launch(5.0, job_id="44")
    assert reply["allow"] is True and reply["why"].startswith("observe only: would have refused")
    assert "blocking" not in reply
    assert gate.recorder.flush(10)
    [event] = gate_events(store)
    assert event.evidence["would_refuse"] is True and event.severity == "INFO"
    assert "would have refused: 7 of 8 GPUs" in event.message
    healthy = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    configured(healthy, remediation={"observe_only": True})
    assert healthy.launch(5.0, job_id="45")["why"] == ""
