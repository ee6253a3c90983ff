"""The Slurm client: parsers on JSON exactly as Slurm prints it (tests/fixtures/slurm), the
drain-reason convention, and contract tests that every importable backend must pass against
the lab's real slurmctld/slurmd."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from medic_core.drain_book import DrainBook
from medic_core.drain_reason import (
    MAX_REASON,
    DrainOutcome,
    MedicReason,
    drain_if_allowed,
    format_reason,
    is_medic_reason,
    parse_reason,
)
from medic_core.slurm import (
    CliSlurm,
    JobInfo,
    NodeInfo,
    SlurmClient,
    SlurmError,
    expand_hostlist,
    layout_of,
    parse_jobs,
    parse_nodes,
)
from medic_core.store import open_store
from remediation.give_back import give_back
from tests.conftest import poll
from tests.fakes import FakeSlurm

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_name(nodes: list[NodeInfo]) -> dict[str, NodeInfo]:
    return {n.name: n for n in nodes}


# --- parsers on recorded output --------------------------------------------------------------


def test_sinfo_2205_nodes_states_reasons_and_gres() -> None:
    nodes = by_name(parse_nodes(fixture("22.05/sinfo.json")))
    assert sorted(nodes) == ["n1", "n2", "n3"]
    n1, n2, n3 = nodes["n1"], nodes["n2"], nodes["n3"]
    assert (n1.state, n1.flags, n1.reason, n1.reason_user, n1.reason_time) == (
        "MIXED", frozenset(), "", "", 0,
    )  # fmt: skip
    assert n2.states == {"IDLE", "DRAIN"} and n2.drained and not n2.down
    assert (n2.reason, n2.reason_user, n2.reason_time) == (
        "admin: fan replaced, ticket OPS-1234", "root", 1795394218,
    )  # fmt: skip
    assert n3.states == {"MIXED", "DRAIN"}  # draining: a job still runs
    assert n3.reason == "medic: gpu.xid.79 gpu2 GPU has fallen off the bus"
    assert (n3.gres, n3.gres_used, n3.partitions) == ("gpu:8", "gpu:4", ("gpu",))
    assert n3.boot_time == 1795385159


def test_sinfo_2205_reboot_requested_is_a_flag() -> None:
    n1 = by_name(parse_nodes(fixture("22.05/sinfo_reboot.json")))["n1"]
    assert n1.states == {"MIXED", "DRAIN", "REBOOT_REQUESTED"}
    assert n1.reboot_pending and n1.drained
    assert n1.reason == "medic: gpu.xid.79 gpu2 ladder: reboot"


def test_an_empty_queue_is_no_jobs_not_an_error() -> None:
    """squeue --json on an idle cluster says "jobs": [] (an empty list was read as missing
    and refused, so a fault on an idle cluster's node could not look for its jobs)."""
    doc = json.loads(fixture("22.05/squeue.json"))
    doc["jobs"] = []
    assert parse_jobs(json.dumps(doc)) == []
    del doc["jobs"]
    assert parse_jobs(json.dumps(doc)) == []


def test_squeue_2205_jobs() -> None:
    jobs = {j.job_id: j for j in parse_jobs(fixture("22.05/squeue.json"))}
    assert jobs["1"] == JobInfo(
        job_id="1",
        name="train",
        user="root",
        state="RUNNING",
        reason="None",
        nodes="n1",
        requeue=True,
        restart_count=0,
        comment="medic:resilient=3",
        admin_comment="medic: requeued off n4 (gpu.xid.79); restart 1/3",
        required_nodes="n1",
        partition="gpu",
    )
    assert (jobs["2"].state, jobs["2"].node_names) == ("RUNNING", ["n3"])
    held = jobs["3"]
    assert (held.state, held.reason, held.nodes, held.held) == ("PENDING", "JobHeldUser", "", True)


@pytest.mark.parametrize(
    ("path", "layout", "name", "gres", "boot_time"),
    [
        ("23.02/slurmrestd_node.json", "v0.0.39", "node01", "cpu:24,gpu:tesla:4(S:0),test:8",
         1688652669),
        ("24.11/slurmrestd_node.json", "v0.0.42", "host1", "gpu:fake1:1(S:0),gpu:fake2:1(S:0)",
         1720820315),
    ],
)  # fmt: skip
def test_newer_node_layouts(path: str, layout: str, name: str, gres: str, boot_time: int) -> None:
    text = fixture(path)
    assert layout_of(json.loads(text), path) == layout
    (node,) = parse_nodes(text, path)
    assert (node.name, node.state, node.flags, node.partitions) == (
        name, "IDLE", frozenset(), ("debug",),
    )  # fmt: skip
    assert (node.gres, node.boot_time, node.reason, node.reason_time) == (gres, boot_time, "", 0)


def _newer(version: str, body: dict[str, object]) -> str:
    """A hand-written document in the 23.11+ shape (no authoritative squeue output of those
    releases was found; see tests/fixtures/slurm/README.md)."""
    meta = {"plugin": {"type": "openapi/slurmctld", "data_parser": f"data_parser/{version}"},
            "slurm": {"release": "24.05.1"}}  # fmt: skip
    return json.dumps({"meta": meta, **body, "errors": [], "warnings": []})


def test_newer_layout_node_flags_and_number_objects() -> None:
    raw = {
        "name": "gpu-005",
        "state": ["MIXED", "DRAIN", "REBOOT_ISSUED"],
        "reason": "medic: gpu.xid.79 gpu2 x",
        "reason_set_by_user": "root",
        "reason_changed_at": {"set": True, "infinite": False, "number": 1789000000},
        "partitions": ["gpu"],
    }
    (node,) = parse_nodes(_newer("v0.0.41", {"nodes": [raw]}))
    assert node.states == {"MIXED", "DRAIN", "REBOOT_ISSUED"} and node.state == "MIXED"
    assert (node.reason_time, node.reboot_pending) == (1789000000, True)


def test_newer_layout_jobs_state_list_and_counters() -> None:
    jobs = [
        {"job_id": 7, "name": "a", "user_name": "u", "job_state": ["RUNNING", "COMPLETING"],
         "state_reason": "None", "nodes": "gpu-[001-002]", "requeue": True, "restart_cnt": 2},
        {"job_id": 8, "job_state": ["PENDING", "REQUEUED"], "state_reason": "BeginTime",
         "restart_cnt": {"set": True, "infinite": False, "number": 1}},
    ]  # fmt: skip
    seven, eight = parse_jobs(_newer("v0.0.40", {"jobs": jobs}))
    assert (seven.state, seven.flags, seven.restart_count) == (
        "COMPLETING", frozenset({"COMPLETING"}), 2,
    )  # fmt: skip
    assert seven.node_names == ["gpu-001", "gpu-002"]
    assert (eight.state, eight.restart_count, eight.requeue) == ("REQUEUED", 1, False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Unable to contact slurm controller", "sinfo --json: not JSON"),
        ("[]", "sinfo --json: expected a JSON object, got list"),
        ('{"nodes": []}', "sinfo --json: no layout version in meta.plugin (Slurm unknown release)"),
        (
            '{"meta": {"plugin": {"type": "openapi/v0.0.37"}, "Slurm": {"release": "21.08.8-2"}}}',
            "sinfo --json: unsupported JSON layout v0.0.37 (Slurm 21.08.8-2); "
            "Medic reads v0.0.38 to v0.0.45",
        ),
        (
            # a layout newer than any Medic knows (26.05's v0.0.45 is read: test_slurm_releases)
            '{"meta": {"plugin": {"data_parser": "data_parser/v0.0.99"}, '
            '"slurm": {"release": "99.05.0"}}, "nodes": []}',
            "sinfo --json: unsupported JSON layout v0.0.99 (Slurm 99.05.0); "
            "Medic reads v0.0.38 to v0.0.45",
        ),
        (
            '{"meta": {"plugin": {"data_parser": "data_parser/v0.0.40"}}, "sinfo": []}',
            "sinfo --json: no 'nodes' list (keys: sinfo)",
        ),
    ],
)
def test_unreadable_documents_fail_with_one_line(text: str, message: str) -> None:
    with pytest.raises(SlurmError) as caught:
        parse_nodes(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("", []),
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1-2,5],gpu7", ["n1", "n2", "n5", "gpu7"]),
        ("gpu-a[08-10]-ib", ["gpu-a08-ib", "gpu-a09-ib", "gpu-a10-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_expand_hostlist(hostlist: str, names: list[str]) -> None:
    assert expand_hostlist(hostlist) == names


# --- the CLI backend without a cluster: search path, errors, timeouts -----------------------


def fake_bin(tmp: Path, name: str, script: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return tmp


def test_missing_binary_names_the_search_path(tmp_path: Path) -> None:
    client = CliSlurm(env={}, bin_dirs=[tmp_path / "a", tmp_path / "b"])
    with pytest.raises(SlurmError, match=r"^sinfo not found in .*/a, .*/b: install slurm-client"):
        client.nodes()


def test_a_hung_command_times_out(tmp_path: Path) -> None:
    client = CliSlurm(env={}, timeout=0.3, bin_dirs=[fake_bin(tmp_path, "scontrol", "sleep 30")])
    with pytest.raises(SlurmError, match=r"^scontrol requeue 12: timed out after 0\.3s$"):
        client.requeue("12")


def test_grouped_sinfo_of_newer_releases_reads_nodes_from_scontrol(tmp_path: Path) -> None:
    grouped = _newer("v0.0.42", {"sinfo": []})
    bin_dir = fake_bin(tmp_path, "sinfo", f"echo '{grouped}'")
    nodes = FIXTURES / "24.11/slurmrestd_node.json"
    fake_bin(bin_dir, "scontrol", f'[ "$*" = "show nodes --json" ] && exec cat {nodes}; exit 3')
    client = CliSlurm(env={}, bin_dirs=[bin_dir])
    assert [n.name for n in client.nodes()] == ["host1"]
    (bin_dir / "sinfo").unlink()
    assert [n.name for n in client.nodes()] == ["host1"]  # the second read goes to scontrol


def test_env_is_the_whole_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDIC_LEAK", "leaked")
    bin_dir = fake_bin(tmp_path, "scontrol", 'echo "$SLURM_CONF:${MEDIC_LEAK-unset}" >&2; exit 1')
    client = CliSlurm(env={"SLURM_CONF": "/x/slurm.conf"}, bin_dirs=[bin_dir])
    with pytest.raises(SlurmError, match=r"^scontrol hold 1: exit 1: /x/slurm.conf:unset$"):
        client.hold("1")
    inherited = CliSlurm(bin_dirs=[bin_dir])  # env=None: this process's environment
    with pytest.raises(SlurmError, match=r":leaked$"):
        inherited.hold("1")


# --- the drain-reason convention -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault_class", "where", "evidence", "reason"),
    [
        ("gpu.xid.79", "2", "GPU has fallen off the bus",
         "medic: gpu.xid.79 gpu2 GPU has fallen off the bus"),
        ("gpu.ecc.dbe", "gpu3", "", "medic: gpu.ecc.dbe gpu3"),
        ("fs.mount", "", "/scratch not mounted", "medic: fs.mount node /scratch not mounted"),
        ("ib.port", "mlx5_0/1", "state=DOWN\nphys=Polling",
         "medic: ib.port mlx5_0/1 state:DOWN phys:Polling"),
        ("mem.edac", "mc 0", "  ce  ", "medic: mem.edac mc_0 ce"),
    ],
)  # fmt: skip
def test_format_reason(fault_class: str, where: str, evidence: str, reason: str) -> None:
    assert format_reason(fault_class, where, evidence) == reason
    parsed = parse_reason(reason)
    assert parsed is not None and parsed.fault_class == fault_class


@pytest.mark.parametrize("evidence", ["x" * 500, "é" * 300, "word " * 100])
def test_long_evidence_is_cut_first_and_fits_in_bytes(evidence: str) -> None:
    reason = format_reason("gpu.xid.79", "2", evidence)
    assert len(reason.encode()) <= MAX_REASON
    assert reason.startswith("medic: gpu.xid.79 gpu2 ") and reason.endswith("...")
    parsed = parse_reason(reason)
    assert parsed is not None and (parsed.fault_class, parsed.where) == ("gpu.xid.79", "gpu2")


def test_an_absurd_fault_class_is_cut_too() -> None:
    reason = format_reason("x" * 300, "2", "evidence")
    assert len(reason.encode()) == MAX_REASON and reason.startswith("medic: xxx")


@pytest.mark.parametrize(
    ("reason", "parsed"),
    [
        ("medic: gpu.xid.79 gpu2 GPU has fallen off the bus",
         MedicReason("gpu.xid.79", "gpu2", "GPU has fallen off the bus")),
        ("medic: gpu.ecc.dbe gpu3", MedicReason("gpu.ecc.dbe", "gpu3", "")),
        ("medic: smoke", MedicReason("smoke", "", "")),
        ("admin: fan replaced", None),
        ("NHC: check_fs_mount: /scratch not mounted", None),
        ("Prolog error", None),
        ("medic:no-space", None),
        ("", None),
        (None, None),
    ],
)  # fmt: skip
def test_parse_reason(reason: str | None, parsed: MedicReason | None) -> None:
    assert parse_reason(reason) == parsed
    assert is_medic_reason(reason) is (parsed is not None)


def fake_with(node: NodeInfo | None) -> FakeSlurm:
    """In-memory Slurm holding `node` (or no node) for the drain/resume rules; the real
    cluster is below."""
    return FakeSlurm([] if node is None else [node])


def _node(state: str, flags: Sequence[str] = (), reason: str = "") -> NodeInfo:
    return NodeInfo("n1", state, frozenset(flags), reason, "root" if reason else "")


OURS = "medic: gpu.xid.79 gpu2 GPU has fallen off the bus"


@pytest.mark.parametrize(
    ("node", "outcome", "drained"),
    [
        (_node("IDLE"), DrainOutcome.DRAINED, True),
        (_node("ALLOCATED"), DrainOutcome.DRAINED, True),
        (_node("IDLE", ["DRAIN"], "admin: fan replaced"), DrainOutcome.NOT_OURS_KEPT, False),
        (_node("MIXED", ["DRAIN"], "Prolog error"), DrainOutcome.NOT_OURS_KEPT, False),
        (_node("DOWN", ["NOT_RESPONDING"], "Not responding"), DrainOutcome.NOT_OURS_KEPT, False),
        (_node("IDLE", ["DRAIN"], "medic: gpu.ecc.dbe gpu1"), DrainOutcome.ALREADY_MEDIC, False),
        (_node("DOWN"), DrainOutcome.DRAINED, True),  # down without a reason: say why
        (None, DrainOutcome.UNKNOWN_NODE, False),
    ],
)
def test_drain_if_allowed(node: NodeInfo | None, outcome: DrainOutcome, drained: bool) -> None:
    fake = fake_with(node)
    assert drain_if_allowed(fake, "n1", OURS) is outcome
    assert fake.calls == ([("drain", "n1", OURS)] if drained else [])


def test_drain_if_allowed_takes_only_medic_reasons() -> None:
    with pytest.raises(ValueError, match="not a Medic drain reason"):
        drain_if_allowed(fake_with(_node("IDLE")), "n1", "maintenance")


@pytest.mark.parametrize(
    ("node", "outcome"),
    [
        (_node("IDLE", ["DRAIN"], OURS), DrainOutcome.RESUMED),
        (_node("DOWN", ["DRAIN"], OURS), DrainOutcome.RESUMED),
        (_node("DOWN", [], OURS), DrainOutcome.RESUMED),  # after reboot nextstate=DOWN
        (_node("IDLE", ["DRAIN"], "admin: fan replaced"), DrainOutcome.NOT_OURS),
        (_node("DOWN", ["NOT_RESPONDING"], "Not responding"), DrainOutcome.NOT_OURS),
        (_node("IDLE"), DrainOutcome.NOT_DRAINED),
        (None, DrainOutcome.UNKNOWN_NODE),
    ],
)
def test_resume_of_medics_recorded_drain(
    node: NodeInfo | None, outcome: DrainOutcome, tmp_path: Path
) -> None:
    fake = fake_with(node)
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as store:
        book = DrainBook.of(store)
        book.record_drain("n1", OURS, actor="daemon")  # Medic's record of its drain
        done = give_back(fake, book, "n1", actor="test")
    assert done.outcome is outcome
    assert fake.calls == ([("resume", "n1")] if outcome is DrainOutcome.RESUMED else [])


# --- contract tests: every backend that imports, against the lab's real Slurm ----------------


@pytest.fixture(params=["cli", "pyslurm"])
def backend(request: pytest.FixtureRequest, lab: Lab) -> tuple[SlurmClient, Lab]:
    # `lab` named here, not fetched at run time: collection then marks these tests `lab`
    # (tests/conftest.py), and `pytest -m "not lab"` starts no lab for them.
    if request.param == "pyslurm":
        pytest.importorskip("pyslurm", reason="pyslurm needs Slurm 25.11; the lab runs 22.05")
        module = pytest.importorskip("slurm_hooks.slurm_pyslurm", reason="no pyslurm backend yet")
        # libslurm reads SLURM_CONF from the process environment.
        request.getfixturevalue("monkeypatch").setenv("SLURM_CONF", lab.env()["SLURM_CONF"])
        return module.PyslurmSlurm(), lab
    return CliSlurm(env=lab.env(), timeout=15), lab


def submit(lab: Lab, *args: str) -> str:
    argv = ["sbatch", "--parsable", "--output=/dev/null", *args]
    return lab.slurm(argv).stdout.strip().split(";")[0]


def the_job(client: SlurmClient, job_id: str) -> JobInfo:
    (job,) = client.jobs([job_id])
    return job


def test_nodes_of_the_lab(backend: tuple[SlurmClient, Lab]) -> None:
    client, lab = backend
    nodes = by_name(client.nodes())
    assert sorted(nodes) == lab.node_names()
    assert all(n.states == {"IDLE"} and n.gres == "gpu:8" for n in nodes.values())
    assert nodes["n1"].partitions == ("gpu",)
    assert client.node("n1") == nodes["n1"]
    assert client.node("nope") is None


def test_one_node_reads_as_the_whole_table_in_every_state(
    backend: tuple[SlurmClient, Lab],
) -> None:
    """node(name) (scontrol -o show node NAME on the CLI backend) and nodes() (sinfo --json)
    agree field for field: a node running a job with GPUs and drained with a reason holding
    '=', brackets and bytes that are not UTF-8; an admin's DOWN+DRAIN; a two-line reason."""
    client, lab = backend
    job = submit(lab, "-w", "n1", "--gres=gpu:4", "--wrap", "sleep 300")
    poll("the job running", lambda: the_job(client, job).state == "RUNNING")
    odd = "medic: gpu.xid.79 gpu2 a=b State=IDLE [root@1] \udcff\udcfe tab\there"
    lab.slurm(["scontrol", "update", "nodename=n1", "state=drain", f"reason={odd}"])
    for state in ("drain", "down"):
        lab.slurm(["scontrol", "update", "nodename=n2", f"state={state}", "reason=admin: PSU"])
    lab.slurm(["scontrol", "update", "nodename=n3", "state=drain", "reason=one\ntwo"])
    names = lab.node_names()

    def agree() -> bool:
        return by_name(client.nodes()) == {name: client.node(name) for name in names}

    poll("node() and nodes() to agree", agree)
    n1, n2, n3 = (client.node(n) for n in ("n1", "n2", "n3"))
    assert n1 is not None and n2 is not None and n3 is not None
    assert n1.states == {"MIXED", "DRAIN"} and n1.gres_used == "gpu:4"
    assert n1.reason == "medic: gpu.xid.79 gpu2 a=b State=IDLE [root@1] \ufffd\ufffd tab\there"
    assert n2.states == {"DOWN", "DRAIN"} and (n2.reason, n2.reason_user) == ("admin: PSU", "root")
    assert n3.reason == "one\ntwo" and n3.reason_time > 0


def test_drain_shows_reason_user_and_time_then_resume(backend: tuple[SlurmClient, Lab]) -> None:
    client, _ = backend
    client.drain("n2", OURS)
    node = client.node("n2")
    assert node is not None and node.drained
    assert (node.reason, node.reason_user) == (OURS, "root") and node.reason_time > 0
    client.resume("n2")

    def idle() -> bool:
        now = client.node("n2")
        return (
            now is not None and now.states == {"IDLE"} and (now.reason, now.reason_time) == ("", 0)
        )

    poll("n2 idle again", idle)


def test_medic_never_overwrites_nor_resumes_an_admin_drain(
    backend: tuple[SlurmClient, Lab], tmp_path: Path
) -> None:
    client, lab = backend
    lab.slurm(["scontrol", "update", "nodename=n3", "state=drain", "reason=admin: fan noise"])
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as store:
        book = DrainBook.of(store)
        assert drain_if_allowed(client, "n3", OURS, book) is DrainOutcome.NOT_OURS_KEPT
        assert give_back(client, book, "n3", actor="test").outcome is DrainOutcome.NOT_OURS
    node = client.node("n3")
    assert node is not None and node.drained and node.reason == "admin: fan noise"


def test_medic_drains_once_and_resumes_its_own(
    backend: tuple[SlurmClient, Lab], tmp_path: Path
) -> None:
    client, _ = backend
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as store:
        book = DrainBook.of(store)
        assert drain_if_allowed(client, "n4", OURS, book) is DrainOutcome.DRAINED
        later = format_reason("gpu.ecc.dbe", "1", "second fault")
        assert drain_if_allowed(client, "n4", later, book) is DrainOutcome.ALREADY_MEDIC
        node = client.node("n4")
        assert node is not None and node.reason == OURS  # the first evidence is kept
        assert give_back(client, book, "n4", actor="test").outcome is DrainOutcome.RESUMED

        def resumed() -> bool:
            return give_back(client, book, "n4", actor="t").outcome is DrainOutcome.NOT_DRAINED

        poll("n4 not drained", resumed)


def test_jobs_on_a_node_including_multi_node_jobs(backend: tuple[SlurmClient, Lab]) -> None:
    client, _ = backend
    single = submit(backend[1], "-w", "n1", "--job-name=one", "--wrap", "sleep 300")
    multi = submit(backend[1], "-N2", "-w", "n4,n5", "--job-name=two", "--wrap", "sleep 300")
    poll(
        "both jobs running", lambda: {j.state for j in client.jobs([single, multi])} == {"RUNNING"}
    )
    assert [j.job_id for j in client.jobs_on("n1")] == [single]
    assert [j.job_id for j in client.jobs_on("n5")] == [multi]
    assert client.jobs_on("n2") == []
    job = the_job(client, multi)
    assert (job.name, job.user, job.nodes, job.node_names) == (
        "two",
        "root",
        "n[4-5]",
        ["n4", "n5"],
    )
    assert client.jobs(["999999"]) == []


def test_requeue_hold_release_and_start_now(backend: tuple[SlurmClient, Lab]) -> None:
    client, lab = backend
    job_id = submit(lab, "-w", "n2", "--requeue", "--wrap", "sleep 300")
    poll("the job running", lambda: the_job(client, job_id).state == "RUNNING")
    assert the_job(client, job_id).requeue
    client.requeue(job_id)
    requeued_second = client.controller_time()  # the revocation's second, or a later one
    assert abs(requeued_second - time.time()) < 5  # slurmctld runs on this host
    poll("requeued", lambda: the_job(client, job_id).state == "PENDING")
    assert the_job(client, job_id).restart_count == 1
    client.hold(job_id)
    poll("held", lambda: the_job(client, job_id).reason == "JobHeldAdmin")
    client.release(job_id)
    poll("released", lambda: not the_job(client, job_id).held)
    # n2 refuses a credential issued in the second it revoked the old one (Slurm's cred.c)
    # and kills the job: the releaser waits for slurmctld's next second, and so does this.
    poll("the revocation's second to pass", lambda: client.controller_time() > requeued_second)
    client.start_now(job_id)  # else it waits cred_expire + 1 s after the requeue
    poll("running again", lambda: the_job(client, job_id).state == "RUNNING", timeout=20)
    assert client.jobs_on("n2")[0].restart_count == 1  # on the node that revoked the old one


def test_admin_comment_leaves_the_users_comment(backend: tuple[SlurmClient, Lab]) -> None:
    client, lab = backend
    job_id = submit(lab, "--hold", "--comment=medic:resilient=2", "--wrap", "true")
    client.set_admin_comment(job_id, "medic: requeued off n3 (gpu.xid.79); restart 1/2")
    job = the_job(client, job_id)
    assert job.admin_comment == "medic: requeued off n3 (gpu.xid.79); restart 1/2"
    assert job.comment == "medic:resilient=2"


def test_reboot_through_scontrol_returns_the_node(backend: tuple[SlurmClient, Lab]) -> None:
    client, _ = backend
    before = client.node("n5")
    assert before is not None
    client.reboot("n5", format_reason("test.reboot", "", "contract test"))

    def back() -> bool:
        node = client.node("n5")
        return node is not None and node.boot_time != before.boot_time and node.states == {"IDLE"}

    try:
        poll("n5 rebooted and idle", back, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; before: {before}; now: {client.node('n5')}") from None
    with pytest.raises(ValueError, match="nextstate"):
        client.reboot("n5", OURS, nextstate="IDLE")


def test_slurm_errors_carry_slurms_message(backend: tuple[SlurmClient, Lab]) -> None:
    client, _ = backend
    with pytest.raises(SlurmError) as drained:
        client.drain("n99", OURS)
    assert str(drained.value) == (
        "scontrol update nodename=n99 state=drain reason=medic: gpu.xid.79 gpu2 GPU has fallen "
        "off the bus: exit 1: slurm_update error: Invalid node name specified"
    )
    with pytest.raises(SlurmError, match=r"^scontrol requeue 999999: exit 1: .*Invalid job id"):
        client.requeue("999999")


def test_no_path_and_no_slurm_conf_in_a_hook_environment(lab: Lab) -> None:
    # What HealthCheckProgram gets: neither PATH nor SLURM_CONF. The binaries are still found
    # and the caller-supplied env is what reaches Slurm.
    assert "PATH" not in lab.env()
    bare = CliSlurm(env={"SLURM_CONF": lab.env()["SLURM_CONF"]})
    assert [n.name for n in bare.nodes()] == lab.node_names()
    # Slurm retries a missing slurm.conf for 60 s: only the timeout ends it.
    lost = CliSlurm(env={"SLURM_CONF": "/nonexistent/slurm.conf"}, timeout=1.5)
    with pytest.raises(SlurmError) as caught:
        lost.nodes()
    assert str(caught.value) == (
        "sinfo --json: timed out after 1.5s; last said: sinfo: error: s_p_parse_file: cannot "
        "stat file /nonexistent/slurm.conf: No such file or directory, retrying in 1sec up to 60sec"
    )
