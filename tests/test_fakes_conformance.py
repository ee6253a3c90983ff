"""tests/fakes.FakeSlurm gives the answers the lab's real Slurm gives (through CliSlurm) for
one scenario: the node table's shape, a drain read back (flag, reason, who, when), a resume,
jobs on a node, the admin comment, hold and release, a requeue and the job's state after it,
and the refusals on the way (unknown node or job, resuming a node in service, requeuing a
job that is pending or may not be requeued). The same test body runs against both."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from medic_core.slurm import CliSlurm, JobInfo, NodeInfo, SlurmClient, SlurmError
from tests.conftest import poll
from tests.fakes import FakeSlurm

NODES = ["n1", "n2", "n3", "n4", "n5"]  # the lab's (cli.lab.slurm_conf)
OURS = "medic: gpu.xid.79 gpu2 GPU has fallen off the bus"
IDLE = frozenset({"IDLE"})


@dataclass
class Cluster:
    client: SlurmClient
    # start a job on one node: (node, requeue allowed, the user's comment) -> its id
    submit: Callable[[str, bool, str], str]
    timeout: float  # how long a change may take to show (the fake's are instant)


def fake_cluster() -> Cluster:
    idle = [NodeInfo(n, "IDLE", frozenset(), partitions=("gpu",), gres="gpu:8") for n in NODES]
    fake = FakeSlurm(idle)
    ids = itertools.count(1)

    def submit(node: str, requeue: bool, comment: str) -> str:
        job = fake.start_job(str(next(ids)), node, comment, requeue=requeue, user="root")
        return job.job_id

    return Cluster(fake, submit, timeout=0.5)


def lab_cluster(request: pytest.FixtureRequest) -> Cluster:
    from cli.lab.cluster import Lab

    lab: Lab = request.getfixturevalue("lab")
    assert lab.node_names() == NODES

    def submit(node: str, requeue: bool, comment: str) -> str:
        argv = ["sbatch", "--parsable", "--output=/dev/null", "-w", node, "--job-name=train"]
        argv += ["--requeue" if requeue else "--no-requeue", f"--comment={comment}"]
        return lab.slurm([*argv, "--wrap", "sleep 300"]).stdout.strip().split(";")[0]

    return Cluster(CliSlurm(env=lab.env(), timeout=15), submit, timeout=30)


@pytest.fixture(params=["fake", pytest.param("lab", marks=pytest.mark.lab)])
def cluster(request: pytest.FixtureRequest) -> Cluster:
    return fake_cluster() if request.param == "fake" else lab_cluster(request)


def refusal(call: Callable[[], object]) -> str:
    """The SlurmError a call raises (the test fails if it returns)."""
    with pytest.raises(SlurmError) as raised:
        call()
    return str(raised.value)


def test_the_node_table_and_a_drain_read_back_then_resumed(cluster: Cluster) -> None:
    client = cluster.client
    table = {n.name: n for n in client.nodes()}
    assert sorted(table) == NODES
    for name, node in table.items():
        assert (node.state, node.flags, node.reason) == ("IDLE", frozenset(), "")
        assert node.partitions == ("gpu",) and node.gres == "gpu:8"
        assert client.node(name) == node  # one node reads as the table has it
    assert client.node("nope") is None

    client.drain("n2", OURS)
    drained = client.node("n2")
    assert drained is not None and drained.drained and drained.states == {"IDLE", "DRAIN"}
    assert (drained.reason, drained.reason_user) == (OURS, "root") and drained.reason_time > 0
    assert {n.name: n for n in client.nodes()}["n2"] == drained
    client.drain("n2", "medic: gpu.ecc.dbe gpu1")  # a second drain replaces the reason
    assert getattr(client.node("n2"), "reason", None) == "medic: gpu.ecc.dbe gpu1"

    client.resume("n2")

    def idle() -> bool:
        now = client.node("n2")
        return now is not None and (now.states, now.reason, now.reason_time) == (IDLE, "", 0)

    poll("n2 idle again", idle, timeout=cluster.timeout)
    assert "Invalid node state specified" in refusal(lambda: client.resume("n2"))
    assert "Invalid node name specified" in refusal(lambda: client.drain("nope", OURS))
    assert "Invalid node name specified" in refusal(lambda: client.resume("nope"))


def test_a_job_commented_held_released_and_requeued(cluster: Cluster) -> None:
    client = cluster.client

    def job(job_id: str) -> JobInfo:
        (found,) = client.jobs([job_id])
        return found

    table_before = {n.name: n for n in client.nodes()}
    resilient = cluster.submit("n1", True, "medic:resilient=2")
    pinned = cluster.submit("n3", False, "")
    poll(
        "both jobs running",
        lambda: [j.state for j in client.jobs([resilient, pinned])] == ["RUNNING"] * 2,
        timeout=cluster.timeout,
    )
    assert [j.job_id for j in client.jobs_on("n1")] == [resilient]
    assert client.jobs_on("n2") == [] and client.jobs(["999999"]) == []
    running = job(resilient)
    assert (running.nodes, running.node_names, running.user) == ("n1", ["n1"], "root")
    assert running.requeue and running.restart_count == 0
    assert running.comment == "medic:resilient=2"
    assert not job(pinned).requeue
    n1 = client.node("n1")
    assert n1 is not None and n1.state in ("ALLOCATED", "MIXED")  # MIXED: not all its CPUs

    client.set_admin_comment(resilient, "medic: requeued off n1 (gpu.xid.79); restart 1/2")
    assert job(resilient).admin_comment == "medic: requeued off n1 (gpu.xid.79); restart 1/2"
    assert job(resilient).comment == "medic:resilient=2"  # the user's own is left
    client.hold(resilient)
    held = job(resilient)
    assert (held.state, held.reason, held.held) == ("RUNNING", "JobHeldAdmin", True)
    client.release(resilient)
    assert (job(resilient).reason, job(resilient).held) == ("None", False)
    assert "no longer pending execution" in refusal(lambda: client.start_now(resilient))
    assert "presently disabled" in refusal(lambda: client.requeue(pinned))
    assert "Invalid job id specified" in refusal(lambda: client.requeue("999999"))

    client.requeue(resilient)
    poll("the job pending", lambda: job(resilient).state == "PENDING", timeout=cluster.timeout)
    requeued = job(resilient)
    assert (requeued.nodes, requeued.reason, requeued.restart_count) == ("", "BeginTime", 1)
    assert requeued.admin_comment.startswith("medic: requeued off n1")
    assert client.jobs_on("n1") == []
    poll("n1 as it was", lambda: client.node("n1") == table_before["n1"], timeout=cluster.timeout)
    assert "Job is pending execution" in refusal(lambda: client.requeue(resilient))
    client.hold(resilient)
    assert job(resilient).held and job(resilient).reason == "JobHeldAdmin"
    client.release(resilient)
    assert not job(resilient).held


def test_the_fake_has_every_slurm_client_method_as_the_protocol_declares_it() -> None:
    """mypy checks FakeSlurm against SlurmClient in tests/fakes.py; this holds without mypy:
    every method, with the protocol's parameters and defaults."""
    declared = {
        name: member
        for name, member in vars(SlurmClient).items()
        if callable(member) and not name.startswith("_")
    }
    assert len(declared) >= 12  # the protocol as of today; one added is checked too
    for name, member in declared.items():
        ours = getattr(FakeSlurm, name)
        assert (
            inspect.signature(ours).parameters.keys() == inspect.signature(member).parameters.keys()
        ), name
        for param in inspect.signature(member).parameters.values():
            assert inspect.signature(ours).parameters[param.name].default == param.default


def test_a_failing_or_unreachable_slurm_refuses_as_the_real_one_does() -> None:
    fake = fake_cluster().client
    assert isinstance(fake, FakeSlurm)
    fake.fail("drain", times=2, message="Requested nodes are busy")
    for _ in range(2):
        assert refusal(lambda: fake.drain("n1", OURS)) == "Requested nodes are busy"
    fake.drain("n1", OURS)  # the third goes through
    assert fake.called("drain", "n1") == [("drain", "n1", OURS)] * 3
    fake.fail("resume", times=None)
    for _ in range(5):
        refusal(lambda: fake.resume("n1"))
    fake.fail("resume", times=0)
    fake.resume("n1")
    fake.unreachable = True
    assert "Unable to contact slurm controller" in refusal(fake.nodes)
    with pytest.raises(ValueError, match="nextstate must be one of"):
        fake.reboot("n1", OURS, nextstate="REBOOT")
    fake.unreachable = False
    strict = FakeSlurm(["n1"], forbid=["requeue"])
    with pytest.raises(AssertionError, match="unexpected Slurm call: requeue"):
        strict.requeue("1")
