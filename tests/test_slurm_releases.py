"""The Slurm client on output recorded from real Slurm releases newer than the lab's 22.05:
24.11.5 (Debian 13, data_parser v0.0.42) and 26.05.5 (Debian sid, data_parser v0.0.45),
recorded with `scripts/slurm-root record` in the same states (tests/fixtures/slurm/README.md).
Every value asserted here is the one in the file."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from medic_core.slurm import (
    NODE_PARSERS,
    SUPPORTED_LAYOUTS,
    CliSlurm,
    JobInfo,
    NodeInfo,
    gpu_indices,
    layout_of,
    parse_jobs,
    parse_nodes,
    parse_scontrol_node,
)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
# release directory -> (data_parser layout, meta.slurm.release)
RELEASES = {"24.11": ("v0.0.42", "24.11.5"), "26.05": ("v0.0.45", "26.05.5")}
# When each recording's n1 got its reason "medic: x" (epoch seconds, from the file).
DRAINED_AT = {"24.11": 1795841211, "26.05": 1795841249}
REBOOT_ASKED_AT = {"24.11": 1795841213, "26.05": 1795841250}
N2_DRAINED_AT = {"24.11": 1795841212, "26.05": 1795841249}
BOOT_TIME = 1795838771  # both roots share this host's kernel, so its boot time
ADMIN = "admin: fan replaced, ticket OPS-1234"


def read(release: str, name: str) -> str:
    return (FIXTURES / release / name).read_text()


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """scontrol without SLURM_TIME_FORMAT prints local time; the roots recorded in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    "name",
    ["squeue.json", "scontrol_show_nodes.json", "sinfo.json", "scontrol_show_nodes_reboot.json"],
)
def test_each_document_names_its_layout_and_release(release: str, name: str) -> None:
    layout, slurm_release = RELEASES[release]
    doc = json.loads(read(release, name))
    assert layout_of(doc, name) == layout
    assert doc["meta"]["plugin"]["data_parser"] == f"data_parser/{layout}"
    assert doc["meta"]["slurm"]["release"] == slurm_release


def test_every_recorded_layout_is_supported_and_read_by_the_flag_list_parser() -> None:
    for layout, _ in RELEASES.values():
        assert layout in SUPPORTED_LAYOUTS
        assert NODE_PARSERS[layout] is NODE_PARSERS["v0.0.42"]


@pytest.mark.parametrize("release", RELEASES)
def test_nodes_from_scontrol_show_nodes_json(release: str) -> None:
    nodes = {n.name: n for n in parse_nodes(read(release, "scontrol_show_nodes.json"))}
    assert nodes == {
        "n1": NodeInfo(
            name="n1", state="MIXED", flags=frozenset({"DRAIN"}), reason="medic: x",
            reason_user="root", partitions=("gpu",), reason_time=DRAINED_AT[release],
            gres="gpu:8", gres_used="gpu:5", boot_time=BOOT_TIME,
        ),
        "n2": NodeInfo(
            name="n2", state="MIXED", flags=frozenset({"DRAIN"}), reason=ADMIN,
            reason_user="root", partitions=("gpu",), reason_time=N2_DRAINED_AT[release],
            gres="gpu:8", gres_used="gpu:6", boot_time=BOOT_TIME,
        ),
    }  # fmt: skip
    assert nodes["n1"].drained and not nodes["n1"].reboot_pending


@pytest.mark.parametrize("release", RELEASES)
def test_a_requested_reboot_is_a_flag_in_the_state_list(release: str) -> None:
    nodes = {n.name: n for n in parse_nodes(read(release, "scontrol_show_nodes_reboot.json"))}
    n1 = nodes["n1"]
    assert n1.states == {"MIXED", "DRAIN", "REBOOT_REQUESTED"}
    assert (n1.reboot_pending, n1.reason, n1.reason_time) == (
        True, "medic: y ladder: reboot", REBOOT_ASKED_AT[release],
    )  # fmt: skip
    assert nodes["n2"].states == {"MIXED", "DRAIN"} and not nodes["n2"].reboot_pending


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    ("text", "json_doc"),
    [
        ("scontrol_show_node_d_epoch.txt", "scontrol_show_nodes.json"),
        ("scontrol_show_node_reboot.txt", "scontrol_show_nodes_reboot.json"),
    ],
)
def test_one_node_line_reads_as_the_json_does(release: str, text: str, json_doc: str) -> None:
    """What CliSlurm.node runs (`SLURM_TIME_FORMAT=%s scontrol -o -d show node n1`), taken
    right after the JSON: the same NodeInfo field for field. 26.05 prints one space before
    `Reason=` (24.11 two) and adds `SuspendTime=`; neither prints 22.05's `ExtSensors...`:
    the parser is keyed on none of these."""
    from_json = {n.name: n for n in parse_nodes(read(release, json_doc))}["n1"]
    assert parse_scontrol_node(read(release, text), "n1") == from_json


@pytest.mark.parametrize("release", RELEASES)
def test_one_node_line_without_d_has_no_gres_used_and_local_times(release: str) -> None:
    node = parse_scontrol_node(read(release, "scontrol_show_node.txt"), "n1")
    assert node == NodeInfo(
        name="n1", state="MIXED", flags=frozenset({"DRAIN"}), reason="medic: x",
        reason_user="root", partitions=("gpu",), reason_time=DRAINED_AT[release],
        gres="gpu:8", gres_used="", boot_time=BOOT_TIME,
    )  # fmt: skip


@pytest.mark.parametrize("release", RELEASES)
def test_jobs_from_squeue_json(release: str) -> None:
    jobs = {j.job_id: j for j in parse_jobs(read(release, "squeue.json"))}
    assert sorted(jobs) == ["1", "2", "3", "4", "5", "6"]
    # Requeued once (restart 1), started again at once, with the user's Comment and Medic's
    # AdminComment: what a resilient job looks like after Medic moved it.
    assert jobs["1"] == JobInfo(
        job_id="1", name="train", state="RUNNING", reason="None", nodes="n1",
        restart_count=1, comment="medic:resilient=3",
        admin_comment="medic: requeued off n4 (gpu.xid.79); restart 1/3",
        required_nodes="n1", gpus_by_node={"n1": frozenset({0, 1, 2, 3})},
        user="root", requeue=True, partition="gpu",
    )  # fmt: skip
    # Requeued and left: PENDING with reason BeginTime; no REQUEUED flag in the state list.
    assert jobs["6"] == JobInfo(
        job_id="6", name="requeued", state="PENDING", reason="BeginTime", nodes="",
        restart_count=1, required_nodes="n2",
        user="root", requeue=True, partition="gpu",
    )  # fmt: skip
    held = jobs["5"]
    assert (held.state, held.reason, held.held, held.flags) == (
        "PENDING", "JobHeldUser", True, frozenset(),
    )  # fmt: skip


@pytest.mark.parametrize("release", RELEASES)
def test_gpus_by_node_from_gres_detail(release: str) -> None:
    """gres_detail is one "gpu:N(IDX:...)" string per node of the job, in host-list order,
    as in 22.05; a two-node job pairs each node with its own indices."""
    jobs = {j.job_id: j for j in parse_jobs(read(release, "squeue.json"))}
    raw = {
        str(j["job_id"]): j["gres_detail"] for j in json.loads(read(release, "squeue.json"))["jobs"]
    }
    assert raw["4"] == ["gpu:1(IDX:4)", "gpu:1(IDX:5)"]
    assert {k: v.gpus_by_node for k, v in jobs.items()} == {
        "1": {"n1": frozenset({0, 1, 2, 3})},
        "2": {"n2": frozenset({0, 1})},
        "3": {"n2": frozenset({2, 3, 4})},
        "4": {"n1": frozenset({4}), "n2": frozenset({5})},
        "5": {},
        "6": {},
    }


_JOB = re.compile(r"^JobId=(\d+) ")
_NODE_GRES = re.compile(r" Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S+)")


@pytest.mark.parametrize("release", RELEASES)
def test_gres_detail_agrees_with_scontrol_show_job(release: str) -> None:
    """`scontrol -d show job -o` prints each node's `GRES=gpu:N(IDX:...)`, recorded at the
    same moment: the GPUs Medic reads from squeue's gres_detail are those."""
    jobs = {j.job_id: j for j in parse_jobs(read(release, "squeue.json"))}
    seen = 0
    for line in read(release, "scontrol_show_job.txt").splitlines():
        job = _JOB.match(line)
        assert job is not None
        for node, gres in _NODE_GRES.findall(line):
            assert jobs[job.group(1)].gpus_by_node[node] == gpu_indices(gres)
            seen += 1
    assert seen == 5  # jobs 1, 2, 3 on one node each, job 4 on two


@pytest.mark.parametrize("release", RELEASES)
def test_newer_release_parsed_as_24_11_would_be(release: str) -> None:
    """No field Medic reads changed between v0.0.42 and v0.0.45: the 26.05 documents give
    the same records when their meta is relabelled v0.0.42 (and the other way round)."""
    other = "v0.0.42" if RELEASES[release][0] == "v0.0.45" else "v0.0.45"
    for name, parse in (("squeue.json", parse_jobs), ("scontrol_show_nodes.json", parse_nodes)):
        doc = json.loads(read(release, name))
        doc["meta"]["plugin"]["data_parser"] = f"data_parser/{other}"
        assert parse(json.dumps(doc)) == parse(read(release, name))


@pytest.mark.parametrize("release", RELEASES)
def test_grouped_sinfo_sends_nodes_to_scontrol(release: str, tmp_path: Path) -> None:
    """Both releases' `sinfo --json` group nodes (`sinfo[]`, no `nodes`): CliSlurm reads the
    node table from `scontrol show nodes --json` instead."""
    assert "nodes" not in json.loads(read(release, "sinfo.json"))
    for name, argv, fixture in (
        ("sinfo", "--json", "sinfo.json"),
        ("scontrol", "show nodes --json", "scontrol_show_nodes.json"),
    ):
        script = tmp_path / name
        path = FIXTURES / release / fixture
        script.write_text(f'#!/bin/sh\n[ "$*" = "{argv}" ] && exec cat {path}\nexit 3\n')
        script.chmod(0o755)
    client = CliSlurm(env={}, bin_dirs=[tmp_path])
    nodes = client.nodes()
    assert [(n.name, n.reason) for n in nodes] == [("n1", "medic: x"), ("n2", ADMIN)]
