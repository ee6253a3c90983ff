"""The remediation ladder end to end: its pure policy, a fault matrix on the lab (real
daemons, real argv against the simulated GPUs, real reboots through Slurm's RebootProgram),
the IB re-check, the drain cap and the fleet-wide pause on every node at once, and one crash
and restart through real Slurm. The ladder's edges (a crash at every step of every rung, the
cap, the pause, the lemon rule, RMA keep-out, admin drains, cool-downs, Slurm errors) are
unit tests with fakes: tests/test_ladder_unit.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.lab.cluster import Lab
from cli.lab.slurm_conf import with_check_options
from healthd.checks import registry
from medic_core.drain_book import DrainBook
from medic_core.settings import RemediationSettings
from medic_core.slurm import CliSlurm
from medic_core.status import Status
from medic_core.store import Store, open_store
from medic_core.vocabulary import Finding
from remediation import episodes as ep
from remediation.ladder import Ladder
from remediation.policy import LemonScore, Rung, after_failure, drain_cap, first_rung
from tests.conftest import poll

# --- policy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault_class", "recommendation", "overrides", "expected"),
    [
        ("gpu.xid.95", "gpu_reset", {}, Rung.GPU_RESET),
        ("gpu.xid.79", "reboot", {}, Rung.REBOOT),
        ("gpu.xid.140", "rma", {}, Rung.RMA),
        ("gpu.retired_pages.pending", "gpu_reset_when_idle", {}, Rung.GPU_RESET),
        ("ib.port.rate", "drain", {}, None),
        ("gpu.xid.13", "none", {}, None),
        ("gpu.xid.79", "reboot", {"gpu.xid": "gpu_reset"}, Rung.GPU_RESET),
        ("gpu.xid.79", "reboot", {"gpu.xid": "gpu_reset", "gpu.xid.79": "rma"}, Rung.RMA),
        ("gpu.xid.79", "reboot", {"gpu": "none"}, None),
    ],
)
def test_first_rung(
    fault_class: str, recommendation: str, overrides: dict[str, str], expected: Rung | None
) -> None:
    assert first_rung(fault_class, recommendation, overrides) == expected


@pytest.mark.parametrize(
    ("rung", "made", "allowed", "expected"),
    [
        (Rung.GPU_RESET, 1, 2, Rung.GPU_RESET),
        (Rung.GPU_RESET, 2, 2, Rung.DRIVER_RELOAD),
        (Rung.DRIVER_RELOAD, 1, 1, Rung.REBOOT),
        (Rung.REBOOT, 1, 1, Rung.RMA),
        (Rung.RMA, 5, 1, Rung.RMA),
    ],
)
def test_after_failure(rung: Rung, made: int, allowed: int, expected: Rung) -> None:
    assert after_failure(rung, made, allowed) == expected


@pytest.mark.parametrize(
    ("nodes", "share", "minimum", "cap"), [(5, 0.1, 1, 1), (100, 0.1, 1, 10), (15, 0.1, 1, 1)]
)
def test_drain_cap(nodes: int, share: float, minimum: int, cap: int) -> None:
    assert drain_cap(nodes, share, minimum) == cap


def test_lemon_score() -> None:
    assert LemonScore(3, 0, 3, 2).is_lemon
    assert LemonScore(1, 2, 3, 2).is_lemon
    assert not LemonScore(2, 1, 3, 2).is_lemon


# --- the fault matrix on the lab ---------------------------------------------------------------


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def fast_config(lab: Lab, tmp_path: Path, extra: str = "") -> Path:
    """The lab's medic.toml with every check every 2 s, so polled faults show at once."""
    special = {
        "gpu_count": "expected_count = 8\n",
        # A halved PCIe link is a gray failure worth a reset here (the default is WARN).
        "gpu_pcie": 'status = "CRITICAL"\n',
    }
    options = {s.name: f"interval = 2\n{special.get(s.name, '')}" for s in registry()}
    path = tmp_path / "medic.toml"
    path.write_text(with_check_options(lab.layout.medic_conf.read_text(), options) + extra)
    return path


def node_info(lab: Lab, name: str) -> dict[str, Any]:
    return next(n for n in lab.sinfo_nodes() if n["name"] == name)


def wait_closed(store: Store, node: str, timeout: float) -> ep.Episode:
    episodes = ep.EpisodeStore(store)

    def closed() -> bool:
        found = episodes.find(node=node)
        return bool(found) and found[-1].state in ep.CLOSED_STATES

    poll(f"an episode on {node} to close", closed, timeout=timeout)
    return episodes.find(node=node)[-1]


def lab_diagnosis(lab: Lab, store: Store, node: str) -> str:
    """The node's episodes with their steps, every node's Slurm state and the daemon's
    last log lines."""
    episodes = ep.EpisodeStore(store)
    lines = [f"slurm: {[(n.name, n.state, sorted(n.flags), n.reason) for n in lab.nodes()]}"]
    for episode in episodes.find(node=node):
        lines.append(
            f"episode {episode.id}: {episode.state} rung={episode.rung} "
            f"{episode.fault_class}/{episode.target}: {episode.message}"
        )
        lines += [
            f"  step {s.action} {s.state}: {s.output[:200]}" for s in episodes.steps(episode.id)
        ]
    log = lab.node(node).healthd_log
    tail = log.read_text(errors="replace").splitlines()[-60:] if log.exists() else []
    return "\n".join([*lines, f"{log} (last {len(tail)} lines):", *tail])


MATRIX = [
    # id, gpu, specs, first rung, end state
    ("xid48_dbe", 1, ["xid=48"], Rung.GPU_RESET, ep.RESOLVED),
    ("xid64", 2, ["xid=64"], Rung.GPU_RESET, ep.RESOLVED),
    ("xid74_nvlink", 3, ["xid=74"], Rung.GPU_RESET, ep.RESOLVED),
    ("xid79_off_the_bus", 4, ["xid=79"], Rung.REBOOT, ep.RESOLVED),
    # XID 94 restarts the application only; the row remap it leaves pending is its own
    # finding (gpu.remap.pending), whose GPU reset once idle resolves it.
    (
        "xid94_contained_remap_pending",
        4,
        ["xid=94", "remap.pending=1"],
        Rung.GPU_RESET,
        ep.RESOLVED,
    ),
    ("xid95_uncontained", 5, ["xid=95"], Rung.GPU_RESET, ep.RESOLVED),
    ("xid119_gsp", 6, ["xid=119"], Rung.GPU_RESET, ep.RESOLVED),
    ("ecc_dbe", 7, ["ecc.dbe=1"], Rung.GPU_RESET, ep.RESOLVED),
    ("retired_pages_pending", 0, ["retired.pending=1"], Rung.GPU_RESET, ep.RESOLVED),
    ("row_remap_failure", 1, ["remap.failure=1"], Rung.RMA, ep.RMA),
    ("nvlink_down", 2, ["nvlink.3=down"], Rung.GPU_RESET, ep.RESOLVED),
    ("pcie_width_x8", 3, ["pcie.width=8"], Rung.GPU_RESET, ep.RESOLVED),
    ("missing_gpu", 4, ["missing=1"], Rung.REBOOT, ep.RESOLVED),
    ("hardware_fault_everything_fails", 5, ["hardware_fault=1", "xid=95"], Rung.GPU_RESET, ep.RMA),
    ("nvml_hang", 6, ["hang.nvmlDeviceGetHandleByIndex_v2=forever"], Rung.REBOOT, ep.RESOLVED),
]


# Every row runs in production mode (tests/test_production_lab.py: the wheel, the unit's
# sandbox, each node's own store); here, one per rung and outcome on the lab's shared store,
# as a fleet with one PostgreSQL runs it.
SHARED_STORE_CASES = ("xid48_dbe", "xid79_off_the_bus", "row_remap_failure")


@pytest.mark.parametrize(
    ("gpu", "specs", "rung", "end"),
    [m[1:] for m in MATRIX if m[0] in SHARED_STORE_CASES],
    ids=[m[0] for m in MATRIX if m[0] in SHARED_STORE_CASES],
)
def test_fault_matrix(
    lab: Lab, store: Store, tmp_path: Path, gpu: int, specs: list[str], rung: Rung, end: str
) -> None:
    fault_matrix_case(lab, store, tmp_path, gpu, specs, rung, end)


def fault_matrix_case(
    lab: Lab,
    store: Store,
    tmp_path: Path,
    gpu: int,
    specs: list[str],
    rung: Rung,
    end: str,
    timeout: float = 90,
) -> list[ep.Step]:
    """One row of MATRIX on n2, whose episodes are in `store`: the episode's first rung and
    end state, and n2 back in service or kept out with Medic's reason. Its steps."""
    lab.start_healthd("n2", config=fast_config(lab, tmp_path))
    poll("first round", lambda: bool(store.conditions("n2", type="gpu_count")), timeout=20)
    lab.inject("n2", gpu, specs)
    try:
        episode = wait_closed(store, "n2", timeout=timeout)
    except AssertionError as exc:  # say where it stood: a CI failure is read once
        raise AssertionError(f"{exc}\n{lab_diagnosis(lab, store, 'n2')}") from None
    assert (episode.first_rung, episode.state) == (int(rung), end), episode.message
    steps = ep.EpisodeStore(store).steps(episode.id)
    if end == ep.RESOLVED:
        assert "DRAIN" not in node_info(lab, "n2")["state_flags"]
        assert steps and steps[-1].state == "done"
    else:

        def out() -> bool:
            node = node_info(lab, "n2")
            return "DRAIN" in node["state_flags"] or node["state"].upper() == "DOWN"

        # Out of service either way: drained, or DOWN (22.05 spells the base state in lower
        # case). After a reboot rung ReturnToService may put it back a moment before the
        # ladder's next tick drains it again (its RMA keep-out): kept out within a tick.
        poll("n2 kept out of service", out, timeout=10)
        node = node_info(lab, "n2")
        assert node["reason"].startswith("medic:")
    return steps


def test_ib_port_down_is_rechecked_and_returns_when_the_link_does(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    """A link fault is re-checked, never rebooted or sent to RMA: the node comes back by
    itself once the port is up again (defect 10)."""
    lab.start_healthd("n3", config=fast_config(lab, tmp_path))
    poll("first round", lambda: bool(store.conditions("n3", type="ib")), timeout=20)
    port = lab.node("n3").host_root / "sys/class/infiniband/mlx5_4/ports/1/state"
    up = port.read_text()
    port.write_text("1: DOWN\n")
    episodes = ep.EpisodeStore(store)
    poll("an episode", lambda: bool(episodes.find(node="n3")), timeout=30)
    poll("drained", lambda: "DRAIN" in node_info(lab, "n3")["state_flags"], timeout=30)
    episode = episodes.find(node="n3")[-1]
    assert (episode.fault_class, episode.first_rung, episode.state) == (
        "ib.port.down",
        0,
        ep.VERIFYING,
    )
    [seen] = episode.evidence["findings"]
    assert (seen["target"], seen["evidence"]["hca"], seen["evidence"]["port"]) == (
        "mlx5_4/1",
        "mlx5_4",
        1,
    ), seen
    port.write_text(up)
    episode = wait_closed(store, "n3", timeout=60)
    assert episode.state == ep.RESOLVED, episode.message
    assert episodes.steps(episode.id) == [], "no reboot, no reset: a re-check only"
    assert "DRAIN" not in node_info(lab, "n3")["state_flags"]


def test_faults_everywhere_respect_the_cap_and_pause(lab: Lab, store: Store) -> None:
    names = lab.node_names()
    for name in names:
        lab.start_healthd(name)
    for name in names:
        lab.inject(name, 0, ["xid=79"])
    episodes = ep.EpisodeStore(store)
    poll("an episode per node", lambda: len(episodes.find()) == len(names), timeout=30)
    control = episodes.control()
    assert control.paused and "gpu.xid.79" in control.reason
    drained = [
        n["name"]
        for n in lab.sinfo_nodes()
        if "DRAIN" in n["state_flags"] and n["reason"].startswith("medic:")
    ]
    assert len(drained) <= 1  # 10 % of 5 nodes, at least 1
    # Past the cap an episode waits for it (undrained); within it, repairs are paused.
    held = [e for e in episodes.find() if e.state in (ep.PAUSED, ep.WAITING_CAP)]
    assert len(held) >= len(names) - 1
    capped = [e for e in episodes.find() if e.state == ep.WAITING_CAP]
    assert len(capped) >= len(names) - 1
    events = [e for e in store.events(kind="remediation") if "AUTOMATION PAUSED" in e.message]
    assert events


# --- one crash and restart through real Slurm (every crash point: test_ladder_unit.py) --------


class LabHost:
    """The ladder's host for one lab node, in this test process: the daemon's part played
    by the test, the node, Slurm and the store are real."""

    def __init__(self, lab: Lab, node: str) -> None:
        self.lab, self.node = lab, node
        self.events: list[str] = []

    def boot_id(self) -> str:
        path = self.lab.node(self.node).host_root / "proc/sys/kernel/random/boot_id"
        return path.read_text().strip()

    def jobs_running(self) -> bool:
        return False

    def gpu_busy(self, gpu: int) -> bool:
        return False

    def release_gpus(self) -> None:
        pass

    def reacquire_gpus(self) -> None:
        pass

    def after_repair(self, gpu: int | None, before: float) -> None:
        pass

    def verify(self, extra_checks: Any) -> list[Finding]:
        return [Finding("gpu_count", Status.OK, "", "", "8 GPUs")]

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None:
        self.events.append(message)

    def open_rma(self, episode: ep.Episode, why: str) -> int | None:
        return None


def test_a_restart_between_asking_slurm_and_recording_it_reboots_once(
    lab: Lab, store: Store
) -> None:
    """The daemon asked Slurm for the reboot and died before recording it: the restarted
    ladder reads Slurm's reboot flags (or the new boot id), never asks again, verifies and
    resumes the node. Every other crash point: tests/test_ladder_unit.py."""
    node = "n5"
    episodes = ep.EpisodeStore(store)
    slurm = CliSlurm(env=lab.env(), timeout=15)
    host = LabHost(lab, node)
    lab.slurm(["scontrol", "update", f"nodename={node}", "state=drain", "reason=medic: test"])
    episode = episodes.open_episode(
        node,
        state=ep.WAITING_IDLE,
        fault_class="gpu.xid.79",
        target="1",
        check="gpu_xid",
        recommendation="reboot",
        rung=int(Rung.REBOOT),
        message="test",
        evidence={},
    )
    boot = host.boot_id()
    reason = "medic: gpu.xid.79 gpu1 ladder: reboot"
    episodes.record_intent(episode, Rung.REBOOT, "reboot", ["scontrol", "reboot"], boot)
    episodes.update(episode.id, state=ep.REBOOTING)
    # The ladder records its drain before it asks (medic_core.drain_book), then asks Slurm;
    # the daemon dies before recording the step.
    DrainBook.of(store).record_drain(node, reason, actor="ladder", episode_id=episode.id)
    slurm.reboot(node, reason, nextstate="DOWN")
    restarted = Ladder(node, episodes, slurm, host, RemediationSettings())

    def resolved() -> bool:
        current = restarted.tick()
        return current is None or current.state == ep.RESOLVED

    poll("episode resolved", resolved, timeout=60)
    assert host.boot_id() != boot
    [step] = [s for s in episodes.steps(episode.id) if s.action == "reboot"]
    assert step.state == "done", step.output
    assert "DRAIN" not in node_info(lab, node)["state_flags"]


@pytest.mark.parametrize("xid", [63, 13])
def test_application_and_ignorable_xids_start_nothing(lab: Lab, store: Store, xid: int) -> None:
    """XID 63 (IGNORE: a page retirement recorded) and 13 (RESTART_APP: the application's
    to restart, no follow-up) are recorded, and the node stays in service. XID 94 restarts
    the application and resets the GPU once idle: the matrix."""
    lab.start_healthd("n1")
    poll("first round", lambda: bool(store.conditions("n1", type="gpu_xid")), timeout=20)
    lab.inject("n1", 3, [f"xid={xid}"])

    def recorded() -> bool:
        return any(e.fault_class == f"gpu.xid.{xid}" for e in store.events("n1"))

    poll(f"XID {xid} recorded", recorded, timeout=10)
    assert ep.EpisodeStore(store).find(node="n1") == []
    assert "DRAIN" not in node_info(lab, "n1")["state_flags"]
    assert store.conditions("n1", status="CRITICAL") == []


def test_a_repaired_node_sees_the_next_fault(lab: Lab, store: Store) -> None:
    """The same fault twice on one node: the daemon that kept running through the reset (its
    XIDs from before the repair forgotten) sees the second one, and the ladder repairs again.
    After a reboot, and the ladder's side of it: tests/test_ladder_unit.py."""
    xid = 95
    lab.start_healthd("n2")
    poll("first round", lambda: bool(store.conditions("n2", type="gpu_xid")), timeout=20)
    for attempt in (1, 2):
        lab.inject("n2", 0, [f"xid={xid}"])

        def opened(n: int = attempt) -> bool:
            return len(ep.EpisodeStore(store).find(node="n2")) == n

        poll(f"episode {attempt} opened", opened, timeout=10)
        episode = wait_closed(store, "n2", timeout=90)
        assert episode.state == ep.RESOLVED, episode.message
        assert "DRAIN" not in node_info(lab, "n2")["state_flags"]
