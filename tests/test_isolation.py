"""Single-GPU isolation without Slurm: the pure decision and plan (remediation.isolation),
the settings table, and the isolator's record across crashes with a Slurm in memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medic_core import proc
from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.drain_book import DrainBook
from medic_core.drain_reason import format_reason
from medic_core.settings import IsolationSettings, load_settings
from medic_core.slurm import NodeInfo, SlurmClient
from medic_core.store import Store, open_store
from remediation import episodes as ep
from remediation.isolation import (
    APPLIED,
    EVIDENCE_KEY,
    INTENT,
    RESTORED,
    RESTORING,
    decide_isolation,
    gres_count,
    index_ranges,
    plan,
    recorded,
)
from remediation.isolator import IsolationError, Isolator

ON = IsolationSettings(enabled=True, apply=("apply", "{node}", "{keep}"))


# --- the pure decision --------------------------------------------------------------------------


def decide(fault: str = "gpu.xid.94", target: str = "5", isolated: Sequence[int] = (), **kw: Any):
    config = dataclasses.replace(ON, **kw)
    return decide_isolation(fault, target, gpus_total=8, isolated=isolated, settings=config)


def test_an_allowed_fault_on_one_gpu_isolates_it() -> None:
    decision = decide()
    assert decision.isolate and decision.gpus == (5,)


@pytest.mark.parametrize(
    ("fault", "target", "kw", "why"),
    [
        ("gpu.xid.94", "5", {"enabled": False}, "isolation is off"),
        ("gpu.xid.94", "", {}, "not on one GPU"),
        ("gpu.xid.94", "gpu5", {}, "not on one GPU"),
        ("gpu.xid.94", "８", {}, "not on one GPU"),  # a full-width digit is not an index
        ("gpu.xid.94", "8", {}, "not one of the node's 8 GPUs"),
        ("gpu.xid.79", "5", {}, "not among the faults"),
        ("gpu.xid.940", "5", {}, "not among the faults"),  # a prefix is a whole word
        ("gpu.xid.79", "5", {"faults": ("gpu.xid",), "nvswitch": True}, "NVSwitch"),
    ],
)
def test_what_drains_the_whole_node(fault: str, target: str, kw: dict[str, Any], why: str) -> None:
    decision = decide(fault, target, **kw)
    assert not decision.isolate and why in decision.why


def test_xid_79_without_nvswitch_isolates_when_allowed() -> None:
    assert decide("gpu.xid.79", faults=("gpu.xid",)).isolate


def test_the_cap_drains_the_whole_node_past_max_gpus() -> None:
    assert not decide(isolated=[3]).isolate  # max_gpus = 1
    two = decide(isolated=[3], max_gpus=2)
    assert two.isolate and two.gpus == (3, 5)
    assert decide(isolated=[5]).isolate  # the same GPU again: nothing more is taken


def test_no_gpu_is_left() -> None:
    decision = decide(isolated=[0, 1, 2, 3, 4, 6, 7], max_gpus=8)
    assert not decision.isolate and "no GPU would be left" in decision.why


@settings(max_examples=200, deadline=None)
@given(
    faults=st.lists(
        st.tuples(st.sampled_from(["gpu.xid.94", "gpu.xid.79", "gpu.xid.48"]), st.integers(0, 9)),
        max_size=20,
    ),
    cap=st.integers(1, 9),
)
def test_any_fault_sequence_keeps_the_cap_and_a_gpu(
    faults: list[tuple[str, int]], cap: int
) -> None:
    config = dataclasses.replace(ON, max_gpus=cap)
    isolated: tuple[int, ...] = ()
    for fault, gpu in faults:
        decision = decide_isolation(
            fault, str(gpu), gpus_total=8, isolated=isolated, settings=config
        )
        assert set(isolated) <= set(decision.gpus)  # never puts one back
        if decision.isolate:
            isolated = decision.gpus
        assert len(isolated) <= cap and len(isolated) < 8
        assert all(0 <= g < 8 for g in isolated)


def test_the_plan_and_its_command() -> None:
    target = plan(8, [5])
    assert (target.count, target.files, target.gres) == (7, "0-4,6-7", "gpu:7")
    assert target.argv(["x", "{node}", "{count}", "{keep}", "[{isolated}]"], "n1") == [
        "x", "n1", "7", "0-4,6-7", "[5]",
    ]  # fmt: skip
    back = plan(8, [])
    assert (back.count, back.files, back.argv(["{isolated}"], "n1")) == (8, "0-7", [""])
    assert plan(8, [9, -1]).count == 8  # out of range: ignored
    assert index_ranges([7, 0, 2, 3]) == "0,2-3,7" and index_ranges([]) == ""


@pytest.mark.parametrize(
    ("gres", "count"),
    [("gpu:7", 7), ("gpu:h100:8(S:0-1)", 8), ("nic:1,gpu:4", 4), ("(null)", None), ("", None)],
)
def test_gres_count(gres: str, count: int | None) -> None:
    assert gres_count(gres) == count


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "5",
        {"gpus": "5", "gpus_total": 8, "state": APPLIED},
        {"gpus": [-1], "gpus_total": 8, "state": APPLIED},
        {"gpus": [5], "gpus_total": 0, "state": APPLIED},
        {"gpus": [5], "gpus_total": 8, "state": "bogus"},
    ],
)
def test_a_malformed_record_is_no_record(raw: Any) -> None:
    assert recorded({EVIDENCE_KEY: raw}) is None


# --- the settings table -------------------------------------------------------------------------


def config_of(tmp_path: Path, body: str) -> MedicConfig:
    path = tmp_path / "medic.toml"
    path.write_text(body)
    return load_config(path, environ={})


def test_the_table_parses(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        "[remediation.isolation]\nenabled = true\nmax_gpus = 2\nnvswitch = true\n"
        'apply = ["/usr/local/sbin/gres-isolate", "{node}", "{keep}"]\n',
    )
    parsed = IsolationSettings.from_config(config)
    assert parsed.enabled and parsed.max_gpus == 2 and parsed.nvswitch
    assert load_settings(config).remediation.enabled  # [remediation] ignores the sub-table


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("enabled = true\n", "apply: is empty"),
        ('enabled = true\napply = ["x", "{gpu}"]\n', "{gpu}"),
        ("max_gpus = 0\n", "max_gpus"),
        ("colour = 1\n", "unknown key"),
    ],
)
def test_a_bad_table_is_refused_on_one_line(tmp_path: Path, body: str, words: str) -> None:
    config = config_of(tmp_path, "[remediation.isolation]\n" + body)
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert words in str(caught.value) and "remediation.isolation" in str(caught.value)
    assert "\n" not in str(caught.value)


# --- the isolator: Slurm in memory, the store on disk ------------------------------------------


class MemorySlurm:
    """One node; the apply command (`run`) changes its GPU count as a restart would."""

    def __init__(self) -> None:
        self.info = NodeInfo("n1", "IDLE", frozenset(), gres="gpu:8")
        self.applied: list[list[str]] = []
        self.envs: list[dict[str, str]] = []  # the apply command's environment, each run
        self.fail_apply = False

    def node(self, name: str) -> NodeInfo | None:
        return self.info if name == "n1" else None

    def drain(self, name: str, reason: str) -> None:
        self.info = dataclasses.replace(self.info, flags=frozenset({"DRAIN"}), reason=reason)

    def resume(self, name: str) -> None:
        self.info = dataclasses.replace(self.info, flags=frozenset(), reason="")

    def run(
        self, argv: list[str], timeout: float, env: dict[str, str] | None = None
    ) -> proc.CommandResult:
        self.applied.append(argv)
        self.envs.append(env or {})
        if self.fail_apply:
            return proc.CommandResult(tuple(argv), 1, "", "no such file", 0.01)
        count = 8 - len([g for g in argv[-1].split(",") if g]) if argv[-1] else 8
        self.info = dataclasses.replace(self.info, gres=f"gpu:{count}")
        return proc.CommandResult(tuple(argv), 0, "", "", 0.01)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as s:
        yield s


def world(store: Store) -> tuple[MemorySlurm, ep.EpisodeStore, Isolator, ep.Episode]:
    slurm = MemorySlurm()
    episodes = ep.EpisodeStore(store)
    config = dataclasses.replace(ON, apply=("apply", "{node}", "{isolated}"), settle_timeout=1)
    client: SlurmClient = slurm  # type: ignore[assignment]
    isolator = Isolator("n1", episodes, client, config, run=slurm.run, sleep=lambda _s: None)
    reason = format_reason("gpu.xid.94", "gpu5")
    DrainBook.of(store).record_drain("n1", reason, actor="daemon")  # Medic's drain, recorded
    slurm.drain("n1", reason)
    episode = episodes.open_episode(
        "n1", state=ep.WAITING_IDLE, fault_class="gpu.xid.94", target="5", check="gpu_xid",
        recommendation="gpu_reset", rung=1, message="XID 94", evidence={"xid": 94},
    )  # fmt: skip
    return slurm, episodes, isolator, episode


def state_of(episode: ep.Episode | None) -> str:
    assert episode is not None
    record = recorded(episode.evidence)
    return record.state if record else "none"


def test_isolate_then_restore(store: Store) -> None:
    slurm, _, isolator, episode = world(store)
    isolated = isolator.isolate(episode, 8)
    assert state_of(isolated) == APPLIED and slurm.info.gres == "gpu:7" and not slurm.info.drained
    assert isolated is not None and isolated.evidence["xid"] == 94  # the evidence is kept
    assert isolator.isolate(isolated, 8) == isolated  # once: no second apply
    assert len(slurm.applied) == 1
    busy = isolator.restore(isolated, jobs_running=True)
    assert state_of(busy) == RESTORING and slurm.info.drained and len(slurm.applied) == 1
    done = isolator.restore(busy, jobs_running=False)
    assert state_of(done) == RESTORED and slurm.info.gres == "gpu:8" and not slurm.info.drained
    assert slurm.applied[-1] == ["apply", "n1", ""]
    assert isolator.restore(done, jobs_running=False) == done  # nothing more to undo


@pytest.mark.parametrize(
    ("printed", "change", "release"),
    [
        ("22.05.8", "restart", "22.05.8"),  # reconfigure keeps the old count: INVAL
        ("24.11.5", "reconfigure", "24.11.5"),  # measured: reconfigure takes it
        ("26.05.5", "reconfigure", "26.05.5"),
        ("24.05.4", "restart", "24.05.4"),  # not measured: the restart, always right
        ("error: no such thing", "restart", None),
    ],
)
def test_the_apply_command_is_told_how_the_release_slurm_reports_takes_the_change(
    store: Store, tmp_path: Path, printed: str, change: str, release: str | None
) -> None:
    slurm, _, isolator, episode = world(store)
    scontrol = tmp_path / "scontrol"  # `scontrol show config` on a controller of that release
    scontrol.write_text(f"#!/bin/sh\necho 'SLURM_VERSION           = {printed}'\n")
    scontrol.chmod(0o755)
    vars(slurm).update(bin_dirs=(tmp_path,), env={}, timeout=5.0)  # as a CliSlurm has them
    isolator.isolate(episode, 8)
    assert slurm.envs[-1]["MEDIC_GRES_CHANGE"] == change
    assert slurm.envs[-1].get("MEDIC_SLURM_RELEASE") == release


def test_a_client_that_cannot_say_its_release_gets_the_restart(store: Store) -> None:
    slurm, _, isolator, episode = world(store)  # MemorySlurm: no scontrol to ask
    isolator.isolate(episode, 8)
    assert slurm.envs[-1]["MEDIC_GRES_CHANGE"] == "restart"
    assert "MEDIC_SLURM_RELEASE" not in slurm.envs[-1]


def test_a_crash_after_the_intent_applies_the_same_state_once_more(store: Store) -> None:
    slurm, episodes, isolator, episode = world(store)
    slurm.fail_apply = True  # the daemon "dies" here: the intent is on disk, Slurm unchanged
    with pytest.raises(IsolationError):
        isolator.isolate(episode, 8)
    after_crash = episodes.get(episode.id)
    assert state_of(after_crash) == INTENT and slurm.info.drained  # still out of service
    slurm.fail_apply = False
    assert after_crash is not None
    recovered = isolator.recover(after_crash, jobs_running=False)
    assert state_of(recovered) == APPLIED and slurm.applied[-1] == ["apply", "n1", "5"]
    assert isolator.recover(recovered, jobs_running=False) == recovered


def test_restore_never_undoes_what_medic_did_not_isolate(store: Store) -> None:
    slurm, episodes, isolator, episode = world(store)
    slurm.info = dataclasses.replace(slurm.info, gres="gpu:7")  # an admin's gres.conf
    assert isolator.restore(episode, jobs_running=False) == episode
    forged = episodes.update(episode.id, evidence={EVIDENCE_KEY: {"gpus": "all"}})
    assert isolator.restore(forged, jobs_running=False) == forged
    assert slurm.applied == [] and slurm.info.gres == "gpu:7"


def test_a_slurm_that_never_shows_the_count_is_an_error(store: Store) -> None:
    slurm, episodes, isolator, episode = world(store)
    slurm.run = lambda argv, timeout, env=None: proc.CommandResult(tuple(argv), 0, "", "", 0.0)  # type: ignore[method-assign]
    isolator.run = slurm.run
    with pytest.raises(IsolationError, match="does not show gpu:7"):
        isolator.isolate(episode, 8)
    assert state_of(episodes.get(episode.id)) == INTENT


def test_policy_refusal_leaves_no_record(store: Store) -> None:
    slurm, episodes, isolator, episode = world(store)
    other = episodes.update(episode.id, fault_class="gpu.xid.79")
    assert isolator.isolate(other, 8) is None
    assert state_of(episodes.get(episode.id)) == "none" and slurm.applied == []


def test_out_of_gres_names_the_gpus_only_while_slurm_lacks_them() -> None:
    from remediation.isolation import IsolationRecord, out_of_gres

    assert out_of_gres(None) == ()
    for state, gpus in (("intent", ()), ("applied", (5,)), ("restoring", (5,)), ("restored", ())):
        assert out_of_gres(IsolationRecord((5,), 8, state)) == gpus
