"""Slurm's own drains adopted (issue 26.1): the decision (remediation.decide.decide_adopt),
the stuck tasks kept as evidence (healthd.stuck_tasks), and the real ladder over a real
store with a fake Slurm, node and clock (tests/test_ladder_unit.World): a "Kill task failed"
node is recorded as Medic's, rebooted, re-qualified and given back; an unexpected reboot is
re-qualified and given back; an admin's drain with the same words in another form, or one
of Slurm's drains left to a human by [remediation] adopt, is never touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.stuck_tasks import stuck_tasks, task_state
from medic_core.drain_book import DrainBook
from medic_core.vocabulary import Recommendation
from remediation import episodes as ep
from remediation.decide import SLURM_DRAINS, NodeFacts, decide_adopt
from remediation.policy import Rung
from tests.test_ladder_unit import World, in_service

DEFAULT = ("kill_task_failed", "unexpected_reboot")


def slurms(reason: str, recorded: bool | None = False, down: bool = False) -> NodeFacts:
    return NodeFacts(True, not down, down, reason, recorded)


def test_kill_task_failed_is_adopted_as_a_reboot() -> None:
    d = decide_adopt(slurms("Kill task failed"), enabled=DEFAULT, open_episode=None)
    assert d.adopt and d.finding is not None
    assert (d.finding.fault_class, d.finding.recommendation) == (
        "slurm.kill_task_failed", Recommendation.REBOOT,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "episode", "why"),
    [
        (slurms("Kill task failed", recorded=True), None, "already Medic's"),
        (slurms("Kill task failed", recorded=None), None, "unreachable"),
        (slurms("Kill task failed"), 7, "episode 7 is open"),
        (slurms("Not responding", down=True), None, "leaves not_responding to a human"),
        (slurms("kill task failed"), None, "not one of Slurm's own drains"),
        (slurms("medic: Kill task failed"), None, "not one of Slurm's own drains"),
        (NodeFacts(True, False, False, ""), None, "in service"),
    ],
    ids=["recorded", "unreachable", "episode", "off", "case", "admin", "in-service"],
)
def test_what_is_never_adopted(facts: NodeFacts, episode: int | None, why: str) -> None:
    d = decide_adopt(facts, enabled=DEFAULT, open_episode=episode)
    assert not d.adopt and why in d.why


@settings(max_examples=300, deadline=None)
@given(reason=st.text(max_size=40), down=st.booleans())
def test_only_slurms_exact_words_are_ever_adopted(reason: str, down: bool) -> None:
    d = decide_adopt(slurms(reason, down=down), enabled=DEFAULT, open_episode=None)
    assert d.adopt == (reason in ("Kill task failed", "Node unexpectedly rebooted"))
    assert not d.adopt or reason in SLURM_DRAINS


# --- the stuck tasks ------------------------------------------------------------------------


def proc_tree(root: Path, tasks: dict[int, tuple[str, str]]) -> Path:
    for pid, (comm, state) in tasks.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560\n")
        (d / "wchan").write_text("nv_wait_for_completion")
        (d / "stack").write_text("[<0>] nvidia_ioctl+0x1a/0x20\n[<0>] do_syscall_64+0x5c\n")
    (root / "self").mkdir()  # not a pid
    return root


def test_the_stuck_tasks_are_the_d_state_ones_with_their_stacks(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path, {
        10: ("python", "S"), 42: ("train (rank 0)", "D"), 43: ("a) b", "D"), 44: ("sh", "R"),
    })  # fmt: skip
    found = stuck_tasks(proc)
    assert [(t["pid"], t["comm"]) for t in found] == [(42, "train (rank 0)"), (43, "a) b")]
    assert found[0]["wchan"] == "nv_wait_for_completion"
    assert found[0]["stack"][0] == "[<0>] nvidia_ioctl+0x1a/0x20"


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_stat_line_parses_or_is_none(text: str) -> None:
    parsed = task_state(text)
    assert parsed is None or isinstance(parsed[1], str)


def test_no_proc_tree_is_no_stuck_tasks(tmp_path: Path) -> None:
    assert stuck_tasks(tmp_path / "missing") == []


# --- the ladder ------------------------------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "medic.db")
    yield w
    w.close()


def test_a_kill_task_failed_node_is_adopted_rebooted_and_given_back(world: World) -> None:
    world.slurm.admin_drain("n2", "Kill task failed")  # slurmctld's own words
    admission = world.daemon("n2").adopt({"stuck_tasks": [{"pid": 42, "comm": "train"}]})
    assert admission is not None and admission.episode is not None
    episode = admission.episode
    assert (episode.fault_class, episode.state, episode.rung) == (
        "slurm.kill_task_failed", ep.WAITING_IDLE, int(Rung.REBOOT),
    )  # fmt: skip
    assert episode.evidence["findings"][0]["evidence"]["stuck_tasks"][0]["pid"] == 42
    record = DrainBook.of(world.store).ownership("n2", world.slurm.by_name["n2"].info())
    assert record.recorded and "adopted" in (record.record.note if record.record else "")
    done = world.run("n2")
    assert done.state == ep.RESOLVED and in_service(world, "n2")
    assert [s.action for s in world.episodes.steps(done.id)] == ["reboot"]
    assert world.nodes["n2"].said("adopts Slurm's 'Kill task failed'")


def test_an_unexpected_reboot_is_re_qualified_and_given_back(world: World) -> None:
    n = world.slurm.by_name["n3"]
    n.state, n.reason, n.reason_time = "DOWN", "Node unexpectedly rebooted", world.clock.epoch()
    admission = world.daemon("n3").adopt()
    assert admission is not None and admission.episode is not None
    assert admission.episode.state == ep.VERIFYING
    done = world.run("n3")
    assert done.state == ep.RESOLVED and in_service(world, "n3")
    assert world.nodes["n3"].commands == []  # no repair: re-qualified only


@pytest.mark.parametrize("reason", ["Kill task failed", "bios update"])
def test_nothing_is_adopted_where_the_switch_is_off_or_the_drain_is_an_admins(
    world: World, reason: str
) -> None:
    world.configure(adopt=())
    world.slurm.admin_drain("n4", reason)
    assert world.daemon("n4").adopt() is None
    world.configure(adopt=("kill_task_failed",))
    world.slurm.admin_drain("n5", "bios update")
    assert world.daemon("n5").adopt() is None
    assert world.episodes.find(node="n4") == world.episodes.find(node="n5") == []
    assert world.slurm.called("resume") == []
