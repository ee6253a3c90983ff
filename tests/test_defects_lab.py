"""The decision core's defects (issue 10), each triggered on the lab as an operator would:
real slurmctld and slurmd, medic-healthd on the node, faults injected into the simulated
GPUs, jobs submitted with sbatch and the `medic` CLI. Every test asserts what
docs/remediation.md and docs/admin-guide.md promise.

Defects covered end to end by a lab test elsewhere:

* 10, an IB port down is re-checked and the node returns when the link does:
  tests/test_remediation.py::test_ib_port_down_is_rechecked_and_returns_when_the_link_does
* 14, the launch budget is one deadline end to end (the compiled front, the Python prolog,
  a hung daemon, the inline path with a hung nvmlInit, the daemon's runner), with real
  processes: tests/test_launch_deadline.py
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.admin import jobs, remediation
from cli.episode import episode as episode_cli
from cli.lab.cluster import Lab
from cli.lab.slurm_conf import with_check_options
from cli.node_commands import node
from medic_core import proc
from medic_core.store import Store, open_store
from remediation import episodes as ep
from remediation import tickets
from remediation.decide import Ledger
from tests.conftest import poll
from tests.lab_views import drained_by_medic, job, node_info

Command = Any


# --- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def config(
    lab: Lab,
    tmp_path: Path,
    remediation: str = "",
    *,
    first_rung: str = "",
    checks: dict[str, str] | None = None,
    shared_store: bool = True,
) -> Path:
    """The lab's medic.toml with lines added to [remediation], a first rung override
    (`"class" = "rung"`), check options, and without [store] for the default per-node
    SQLite store (state_dir/medic.db)."""
    text = lab.layout.medic_conf.read_text()
    if first_rung:
        text = text.replace("\nfirst_rung = { ", f"\nfirst_rung = {{ {first_rung}, ", 1)
    text = text.replace("[remediation]\n", f"[remediation]\n{remediation}\n", 1)
    if not shared_store:
        text, count = re.subn(r"\[store\]\nurl = [^\n]*\n", "", text)
        assert count == 1
    text = with_check_options(text, checks or {})
    path = tmp_path / "medic.toml"
    path.write_text(text)
    return path


LADDER_OFF = "enabled = false"
DRY_RUN = "dry_run = true"


def in_service(lab: Lab, name: str) -> bool:
    info = node_info(lab, name)
    flags = set(info.get("state_flags", []))
    return not flags & {"DRAIN", "DRAINED", "DRAINING"} and str(info["state"]).upper() != "DOWN"


def submit(lab: Lab, *args: str) -> str:
    out = lab.slurm(["sbatch", "--parsable", *args]).stdout.strip()
    return out.split(";")[0]


def admin_comment(lab: Lab, job_id: str) -> str:
    return str(job(lab, job_id).get("admin_comment") or "")


def only_on(lab: Lab, name: str) -> str:
    """--exclude every other node: the job runs on `name`, yet is not pinned to it (-w)."""
    return "--exclude=" + ",".join(n for n in lab.node_names() if n != name)


def running_job(lab: Lab, tmp_path: Path, *args: str) -> tuple[str, Path]:
    """Submit a 10-minute job and wait until its script runs (squeue says RUNNING while
    the prolog may still refuse it; only the job's own mark proves it runs)."""
    started = tmp_path / f"started-{len(list(tmp_path.glob('started-*')))}"
    job_id = submit(lab, *args, "--wrap", f"touch {started}; sleep 600")
    poll(f"job {job_id} running", started.exists, timeout=60)
    return job_id, started


def job_actions(store: Store, name: str, job_id: str) -> list[str]:
    return [
        str(e.evidence.get("action"))
        for e in store.events(name, kind="job_action")
        if e.target == f"job:{job_id}"
    ]


def run(command: Command, *args: str) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


def as_json(command: Command, *args: str) -> Any:
    result = run(command, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def run_hook(lab: Lab, hook: str, name: str) -> proc.CommandResult:
    """A hook the way slurmd runs it: the lab's wrapper, SLURMD_NODENAME and nothing else."""
    return proc.run([str(lab.layout.bin_dir / hook)], timeout=60, env={"SLURMD_NODENAME": name})


def episode_of(store: Store, name: str) -> ep.Episode | None:
    found = ep.EpisodeStore(store).find(node=name)
    return found[-1] if found else None


def wait_episode(store: Store, name: str, states: tuple[str, ...], timeout: float) -> ep.Episode:
    def there() -> bool:
        e = episode_of(store, name)
        return e is not None and e.state in states

    try:
        poll(f"an episode on {name} in {states}", there, timeout=timeout)
    except AssertionError as exc:
        last = episode_of(store, name)
        seen = f"{last.state}: {last.message}" if last else "none"
        raise AssertionError(f"{exc}; the episode: {seen}") from None
    e = episode_of(store, name)
    assert e is not None
    return e


# --- 1: after `medic remediation resume`, paused episodes move again ------------------------


def test_1_paused_episode_moves_after_resume_and_a_later_fault_opens_its_own(
    lab: Lab, store: Store
) -> None:
    conf = ("--config", str(lab.layout.medic_conf))
    lab.start_healthd("n1")
    assert run(remediation, "pause", "--reason", "firmware roll-out", *conf).exit_code == 0
    lab.inject("n1", 2, ["xid=95"])
    paused = wait_episode(store, "n1", (ep.PAUSED,), timeout=15)
    assert "firmware roll-out" in paused.message
    poll("n1 drained while paused", lambda: drained_by_medic(lab, "n1"), timeout=10)

    refused = run(node, "resume", "n1", "--reason", "impatient", *conf)
    assert refused.exit_code == 1
    assert f"medic episode close {paused.id} --reason TEXT" in refused.stderr, refused.stderr

    assert run(remediation, "resume", "--reason", "roll-out done", *conf).exit_code == 0
    done = wait_episode(store, "n1", (ep.RESOLVED, ep.NEEDS_HUMAN, ep.RMA), timeout=60)
    assert (done.id, done.state) == (paused.id, ep.RESOLVED), done.message
    assert [s.action for s in ep.EpisodeStore(store).steps(done.id)] == ["gpu_reset"]
    poll("n1 back in service", lambda: in_service(lab, "n1"), timeout=10)

    # A later fault on the node is a new episode, repaired in its turn: nothing is stuck.
    lab.inject("n1", 2, ["xid=95"])
    poll(
        "a second episode",
        lambda: len(ep.EpisodeStore(store).find(node="n1")) == 2,
        timeout=15,
    )
    again = wait_episode(store, "n1", (ep.RESOLVED, ep.NEEDS_HUMAN, ep.RMA), timeout=60)
    assert again.id != paused.id and again.state == ep.RESOLVED, again.message
    poll("n1 back in service again", lambda: in_service(lab, "n1"), timeout=10)


# --- 2: while paused, faults are drained and requeues go on; only repairs wait ------------


def test_2_paused_a_gpu_off_the_bus_is_drained_and_its_job_requeued(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    conf = ("--config", str(lab.layout.medic_conf))
    assert run(remediation, "pause", "--reason", "maintenance window", *conf).exit_code == 0
    lab.start_healthd("n2")
    job_id, _ = running_job(lab, tmp_path, "--resilient=2", only_on(lab, "n2"))
    lab.inject("n2", 4, ["xid=79"])

    poll("n2 drained (not IDLE in service)", lambda: drained_by_medic(lab, "n2"), timeout=10)
    poll("the job requeued", lambda: "requeued" in job_actions(store, "n2", job_id), timeout=15)
    assert "requeued off n2 (gpu.xid.79)" in admin_comment(lab, job_id)
    episode = wait_episode(store, "n2", (ep.PAUSED,), timeout=5)
    assert "maintenance window" in episode.message
    assert ep.EpisodeStore(store).steps(episode.id) == []  # the reboot waits
    assert ep.EpisodeStore(store).control().paused


# --- 3: a node in RMA is never schedulable -------------------------------------------------


def rma_node_healthy_again(lab: Lab, store: Store, tmp_path: Path, name: str) -> None:
    """`name`'s episode ends in RMA (this site sends XID 79 straight to the vendor); then
    the node is power-cycled (the XID is gone, every check passes) while its ticket is
    still open: only the ticket keeps it out now."""
    conf = config(lab, tmp_path, first_rung='"gpu.xid.79" = "rma"')
    lab.start_healthd(name, config=conf)
    lab.inject(name, 2, ["xid=79"])
    episode = wait_episode(store, name, (ep.RMA,), timeout=20)
    assert episode.ticket_id is not None
    poll(f"{name} drained by Medic", lambda: drained_by_medic(lab, name), timeout=10)
    lab.stop_healthd(name)
    lab.reboot_node(name)
    lab.start_healthd(name, config=conf)
    poll(
        "every check clean after the reboot",
        lambda: not [c for c in store.conditions(name) if str(c.status) == "CRITICAL"],
        timeout=20,
    )
    assert drained_by_medic(lab, name) and tickets.open_tickets(store, name)


def test_3_a_human_resume_of_an_rma_node_is_drained_again(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    rma_node_healthy_again(lab, store, tmp_path, "n3")
    lab.slurm(["scontrol", "update", "nodename=n3", "state=resume"])  # not knowing of the RMA

    def drained_again() -> bool:
        return any("drained again" in e.message for e in store.events("n3", kind="remediation"))

    poll("Medic draining n3 again", drained_again, timeout=15)
    poll("n3 out of service", lambda: drained_by_medic(lab, "n3"), timeout=10)
    assert tickets.open_tickets(store, "n3")
    # and it stays out: a job for it waits
    job_id = submit(lab, "-w", "n3", "--wrap", "true")
    assert job(lab, job_id)["job_state"] == "PENDING"


def test_3_the_prolog_refuses_a_job_on_an_rma_node_a_human_resumed(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    rma_node_healthy_again(lab, store, tmp_path, "n3")
    lab.slurm(["scontrol", "update", "nodename=n3", "state=resume"])  # not knowing of the RMA
    # A job that was waiting lands on n3 at once: slurmd runs the prolog for it.
    refused = run_hook(lab, "medic-prolog", "n3")
    assert refused.returncode == 1, "the prolog let a job start on a node with an open RMA"


# --- 4: the drain cap on every path, the pause, and the owner told --------------------------


def test_4_cap_held_fault_waits_hooks_respect_the_cap_and_it_drains_when_the_cap_frees(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    """5 nodes, one partition: the cap is 1 node drained by Medic."""
    conf = ("--config", str(lab.layout.medic_conf))
    assert run(remediation, "pause", "--reason", "change freeze", *conf).exit_code == 0
    # Paused, the prolog's refusal still drains (n3 has no daemon: the inline path); that
    # drain is the one the cap allows.
    lab.inject("n3", 3, ["ecc.dbe=2"])
    refused = run_hook(lab, "medic-prolog", "n3")
    assert refused.returncode == 1, refused.stderr
    poll("n3 drained by the prolog", lambda: drained_by_medic(lab, "n3"), timeout=5)

    lab.start_healthd("n2")
    job_id, _ = running_job(lab, tmp_path, "--resilient=2", only_on(lab, "n2"))
    lab.inject("n2", 1, ["xid=95"])
    capped = wait_episode(store, "n2", (ep.WAITING_CAP,), timeout=15)
    assert "drain cap reached" in capped.message
    poll(
        "the job's owner told",
        lambda: "not requeued: drain cap reached" in admin_comment(lab, job_id),
        timeout=10,
    )
    assert in_service(lab, "n2")
    assert job(lab, job_id)["job_state"] == "RUNNING" and job(lab, job_id)["restart_cnt"] == 0

    # The HealthCheckProgram holds to the same cap; the prolog lets a job start on the
    # cap-held node (a refusal would have Slurm drain it, "Prolog error", past the cap).
    checked = run_hook(lab, "medic-healthcheck", "n2")
    assert "not drained: drain cap reached" in checked.stdout, checked.stdout + checked.stderr
    prolog = run_hook(lab, "medic-prolog", "n2")
    assert prolog.returncode == 0, prolog.stderr
    assert in_service(lab, "n2")

    # The cap frees (n3 back in service): n2 is drained, and its repair waits for the pause.
    lab.slurm(["scontrol", "update", "nodename=n3", "state=resume"])
    poll("n2 drained once the cap freed", lambda: drained_by_medic(lab, "n2"), timeout=15)
    # By the ladder's next look ("drain cap freed"), or by the HealthCheckProgram slurmd runs
    # every 60 s if its run came first (the finding's own reason): both for this fault.
    reason = node_info(lab, "n2")["reason"]
    assert reason.startswith("medic: gpu.xid.95 gpu1"), reason
    after = wait_episode(store, "n2", (ep.PAUSED,), timeout=5)
    assert after.id == capped.id and ep.EpisodeStore(store).steps(after.id) == []


def test_4_a_job_landing_on_a_cap_held_node_leaves_it_in_service(lab: Lab, store: Store) -> None:
    lab.slurm(["scontrol", "update", "nodename=n3", "state=drain", "reason=medic: gpu.xid.79 gpu0"])
    lab.start_healthd("n2")
    lab.inject("n2", 1, ["xid=95"])
    wait_episode(store, "n2", (ep.WAITING_CAP,), timeout=15)
    job_id = submit(lab, "-w", "n2", "--wrap", "true")

    def allowed() -> bool:
        gates = [e for e in store.events("n2", kind="gate") if e.target == f"job:{job_id}"]
        return bool(gates) and gates[0].evidence.get("allow") is True

    # A refusal would have Slurm drain n2 ("Prolog error") past the cap: the gate lets the
    # job start, as the cap keeps the fault in service.
    poll("the job allowed on n2", allowed, timeout=30)
    poll("the job done", lambda: job(lab, job_id)["job_state"] == "COMPLETED", timeout=30)
    info = node_info(lab, "n2")
    assert in_service(lab, "n2"), f"{info['state_flags']}: {info['reason']}"


# --- 5: the rails hold with a per-node SQLite store -----------------------------------------


def test_5_cap_and_fleet_signature_hold_with_a_store_per_node(lab: Lab, tmp_path: Path) -> None:
    """Each daemon its own store (the default, state_dir/medic.db): no daemon sees another's
    episodes, so the cap and the signature count Medic's drains as Slurm shows them. The
    cap is 2 here (40 % of 5), the signature 3 nodes."""
    conf = config(lab, tmp_path, f"{DRY_RUN}\nmax_drained_share = 0.4", shared_store=False)
    names = ("n1", "n2", "n3")
    for name in names:
        lab.start_healthd(name, config=conf)

    def own_store(name: str) -> str:
        return f"sqlite:///{lab.layout.node(name).state_dir / 'medic.db'}"

    for name in names[:2]:
        lab.inject(name, 0, ["xid=79"])
        poll(f"{name} drained by Medic", partial(drained_by_medic, lab, name), timeout=10)
    lab.inject("n3", 0, ["xid=79"])
    with open_store(own_store("n3")) as n3:
        episode = wait_episode(n3, "n3", (ep.WAITING_CAP,), timeout=15)
        assert "2 of 5 nodes drained by Medic (cap 2)" in episode.message
        control = ep.EpisodeStore(n3).control()
        assert control.paused and "gpu.xid.79 on 3 nodes" in control.reason, control
        assert any("AUTOMATION PAUSED" in e.message for e in n3.events("n3", kind="remediation"))
        assert {e.node for e in ep.EpisodeStore(n3).find()} == {"n3"}  # its own store only
    assert in_service(lab, "n3")
    with open_store(own_store("n1")) as n1:
        assert not ep.EpisodeStore(n1).control().paused  # the pause is n3's store's


# --- 6: the fleet-wide pause does not fire again right after a human resumes --------------


def test_6_a_human_resume_is_not_undone_by_the_faults_that_caused_the_pause(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    # A cap of 3 (60 % of 5): all three faults drain, whichever is judged first (with the
    # default cap of 1, n1's could be the one left waiting for it).
    conf = config(lab, tmp_path, f"{DRY_RUN}\nmax_drained_share = 0.6")
    c = ("--config", str(conf))
    names = ("n1", "n2", "n3")
    for name in names:
        lab.start_healthd(name, config=conf)
    for name in names:
        lab.inject(name, 0, ["xid=79"])
    episodes = ep.EpisodeStore(store)

    def pauses() -> int:
        return sum(
            "AUTOMATION PAUSED" in e.message for e in store.events(kind="remediation", limit=1000)
        )

    poll("the fleet-wide pause", lambda: pauses() == 1, timeout=20)
    control = episodes.control()
    assert control.paused and "gpu.xid.79 on 3 nodes" in control.reason, control
    assert run(remediation, "resume", "--reason", "driver bug ruled out", *c).exit_code == 0
    # n1's episode moves on (a dry run: to a human); the same fault once more, on another
    # GPU of n1, is a new episode, and pauses nothing.
    wait_episode(store, "n1", (ep.NEEDS_HUMAN,), timeout=15)
    lab.inject("n1", 5, ["xid=79"])
    poll(
        "the new fault's episode",
        lambda: any(e.target == "5" for e in episodes.find(node="n1")),
        timeout=15,
    )
    assert not episodes.control().paused, episodes.control()
    assert pauses() == 1


# --- 7: the restart budget: refusals are not charged, one fault is charged once ------------


def test_7_a_prolog_refusal_spends_no_restart_and_a_dbe_seen_twice_is_charged_once(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    # n1 has a fault no daemon has seen: the prolog (inline) refuses the job there and Slurm
    # requeues it (its restart count is 1); it then runs on n2 with all of its budget.
    lab.inject("n1", 3, ["ecc.dbe=2"])
    # (cap 2 of 5: the prolog's drain of n1 leaves room for n2's)
    lab.start_healthd("n2", config=config(lab, tmp_path, f"{LADDER_OFF}\nmax_drained_share = 0.4"))
    others = ",".join(n for n in lab.node_names() if n not in ("n1", "n2"))
    # n1 must be the first node the job meets, whatever the load: an admin's drain (not
    # Medic's, so outside the cap) holds n2 until the prolog on n1 has refused the job.
    lab.slurm(["scontrol", "update", "nodename=n2", "state=drain", "reason=test: n1 first"])
    started = tmp_path / "started-7"
    job_id = submit(
        lab, "--resilient=1", f"--exclude={others}", "--wrap", f"touch {started}; sleep 600"
    )
    poll("the prolog on n1 refused the job", lambda: drained_by_medic(lab, "n1"), timeout=60)
    poll("the job requeued", lambda: int(job(lab, job_id)["restart_cnt"]) == 1, timeout=30)
    lab.slurm(["scontrol", "update", "nodename=n2", "state=resume"])
    poll(f"job {job_id} running", started.exists, timeout=60)
    first = job(lab, job_id)
    assert (first["restart_cnt"], first["batch_host"]) == (1, "n2"), first

    # One fault, two findings: XID 48 and the double-bit ECC error it reports.
    lab.inject("n2", 1, ["xid=48", "ecc.dbe=1"])

    def both_seen() -> bool:
        critical = {c.reason for c in store.conditions("n2") if str(c.status) == "CRITICAL"}
        return {"gpu.xid.48", "gpu.ecc.dbe"} <= critical

    poll("both findings", both_seen, timeout=15)
    # Seen in one check round (one response) or two: wait for every response to be done.
    rounds = {c.since for c in store.conditions("n2", status="CRITICAL") if c.target == "1"}

    def responded() -> int:
        return len([e for e in store.events("n2", kind="job_action") if e.target == "1"])

    poll(f"{len(rounds)} response(s) to the fault", lambda: responded() == len(rounds), timeout=15)
    poll("the job off n2", lambda: job(lab, job_id)["job_state"] != "RUNNING", timeout=15)
    comment = admin_comment(lab, job_id)
    assert "restart 1/1" in comment and "budget spent" not in comment, comment
    ledger = Ledger.parse(comment)
    assert ledger.restarts == 1 and len(ledger.charged) == 1, comment
    actions = job_actions(store, "n2", job_id)
    assert actions.count("requeued") == 1 and "budget_spent" not in actions, actions


# --- 8: a service down never unloads the GPU driver ---------------------------------------


def test_8_munged_down_goes_to_a_human_never_to_a_driver_reload(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    conf = config(lab, tmp_path, checks={"services": "interval = 1\n"})
    lab.start_healthd("n5", config=conf)
    poll("munged seen", lambda: bool(store.conditions("n5", type="services")), timeout=20)
    munged = lab.node("n5").host_root / "proc/1001"
    assert (munged / "comm").read_text().strip() == "munged"
    for entry in munged.iterdir():
        entry.unlink()
    munged.rmdir()

    episode = wait_episode(store, "n5", ep.CLOSED_STATES + ep.OPEN_STATES, timeout=15)
    assert (episode.fault_class, episode.target) == ("service.down", "munged")
    assert (episode.state, episode.first_rung, episode.rung) == (ep.NEEDS_HUMAN, 0, 0)
    assert "no ladder rung for 'restart_service'" in episode.message, episode.message
    poll("n5 drained", lambda: drained_by_medic(lab, "n5"), timeout=10)
    [finding] = episode.evidence["findings"]
    assert finding["evidence"]["unit"] == "munge.service"
    assert ep.EpisodeStore(store).steps(episode.id) == []
    remediation_events = [e.message for e in store.events("n5", kind="remediation")]
    assert not [m for m in remediation_events if "driver" in m or "reset" in m]


# --- 9: a RESTART_APP XID requeues the resilient job it hit ------------------------------


def test_9_xid_13_requeues_the_resilient_job_and_the_node_stays_in_service(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    """RESTART_APP without a follow-up: the application restarts, the node is fine."""
    lab.start_healthd("n1")
    job_id, _ = running_job(lab, tmp_path, "--resilient=2", only_on(lab, "n1"))
    lab.inject("n1", 3, ["xid=13"])
    poll("the job requeued", lambda: "requeued" in job_actions(store, "n1", job_id), timeout=15)
    assert "requeued off n1 (gpu.xid.13)" in admin_comment(lab, job_id)
    assert in_service(lab, "n1")
    assert ep.EpisodeStore(store).find(node="n1") == []


def test_9_xid_94_requeues_the_resilient_job_now_and_its_pending_remap_resets_the_gpu(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    """XID 94 (a contained memory error, NVIDIA's RESTART_APP) requeues the job at once and
    drains nothing; the row remap it leaves pending is measured at once (the XID wakes
    gpu_remapped_rows), and that finding drains the node so no new job starts and resets
    the GPU once idle (docs/remediation.md, `restart_app`)."""
    lab.start_healthd("n1")
    job_id, _ = running_job(lab, tmp_path, "--resilient=2", only_on(lab, "n1"))
    lab.inject("n1", 3, ["xid=94", "remap.pending=1"])
    poll("the job requeued", lambda: "requeued" in job_actions(store, "n1", job_id), timeout=15)
    assert "requeued off n1 (gpu.xid.94)" in admin_comment(lab, job_id)
    episode = wait_episode(store, "n1", ep.OPEN_STATES + ep.CLOSED_STATES, timeout=15)
    assert (episode.fault_class, episode.target) == ("gpu.remap.pending", "3")
    assert (episode.recommendation, episode.first_rung) == ("gpu_reset_when_idle", 1)
    done = wait_episode(store, "n1", (ep.RESOLVED, ep.NEEDS_HUMAN, ep.RMA), timeout=60)
    assert done.state == ep.RESOLVED, done.message
    assert [s.action for s in ep.EpisodeStore(store).steps(done.id)] == ["gpu_reset"]
    poll("n1 back in service", lambda: in_service(lab, "n1"), timeout=10)


# --- 11: `medic episode retry|close` end an episode that waits for a human ----------------


def test_11_retry_hands_the_episode_to_the_ladder_and_close_lets_a_human_resume(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    conf = config(lab, tmp_path, LADDER_OFF)
    c = ("--config", str(conf))
    lab.start_healthd("n4", config=conf)
    lab.inject("n4", 1, ["xid=95"])
    first = wait_episode(store, "n4", (ep.NEEDS_HUMAN,), timeout=15)
    poll("n4 drained", lambda: drained_by_medic(lab, "n4"), timeout=10)

    retried = run(episode_cli, "retry", str(first.id), "--reason", "try the reset", *c)
    assert retried.exit_code == 0, retried.output
    assert "needs_human -> waiting_idle at rung gpu_reset" in retried.stdout
    done = wait_episode(store, "n4", (ep.RESOLVED, ep.RMA), timeout=60)
    assert done.id == first.id and done.state == ep.RESOLVED, done.message
    poll("n4 repaired and back", lambda: in_service(lab, "n4"), timeout=10)

    lab.inject("n4", 6, ["xid=95"])
    poll(
        "the second fault's episode",
        lambda: (e := episode_of(store, "n4")) is not None and e.id != first.id,
        timeout=15,
    )
    second = wait_episode(store, "n4", (ep.NEEDS_HUMAN,), timeout=5)
    poll("n4 drained again", lambda: drained_by_medic(lab, "n4"), timeout=10)
    closed = run(episode_cli, "close", str(second.id), "--reason", "reseated GPU 6", *c)
    assert closed.exit_code == 0, closed.output
    assert "n4: NOT resumed" in closed.stdout
    assert drained_by_medic(lab, "n4")
    held = store.open_drain("n4")  # issue 22: only a human gives it back now
    assert held is not None and "closed without --resume" in held.held
    resumed = run(node, "resume", "n4", "--reason", "reseated GPU 6", *c)
    assert resumed.exit_code == 0, resumed.output
    poll("n4 back in service", lambda: in_service(lab, "n4"), timeout=10)
    [by] = store.events("n4", kind="medic.resume", limit=1)
    assert by.evidence["actor"].startswith("cli:") and "(uid " in by.evidence["actor"]
    assert ep.EpisodeStore(store).get(second.id).state == ep.CLOSED  # type: ignore[union-attr]


# --- 12: a resilient job pinned with -w is told -------------------------------------------


def test_12_a_resilient_job_pinned_to_the_faulty_node_is_told_it_waits_for_it(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    lab.start_healthd("n4", config=config(lab, tmp_path, LADDER_OFF))
    job_id, _ = running_job(lab, tmp_path, "--resilient=2", "-w", "n4")
    lab.inject("n4", 0, ["xid=79"])
    poll("the job requeued", lambda: "requeued" in job_actions(store, "n4", job_id), timeout=15)
    comment = admin_comment(lab, job_id)
    assert "requeued off n4 (gpu.xid.79)" in comment
    assert "the job asks for n4 (-w) and waits for it: resubmit without" in comment, comment


# --- 13: the CLI's views agree -------------------------------------------------------------


def test_13_every_view_says_needs_human_and_jobs_shows_the_requeue(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    from tests.test_cli_episode import words

    conf = config(lab, tmp_path, LADDER_OFF)
    c = ["--config", str(conf)]
    lab.start_healthd("n3", config=conf)
    job_id, _ = running_job(lab, tmp_path, "--resilient=2", only_on(lab, "n3"))
    lab.inject("n3", 2, ["xid=79"])
    episode = wait_episode(store, "n3", (ep.NEEDS_HUMAN,), timeout=15)
    poll("the job requeued", lambda: "requeued" in job_actions(store, "n3", job_id), timeout=15)

    assert words(c, "n3") == {"needs_human"}
    status = as_json(remediation, "status", *c)
    assert [(e["id"], e["medic"]) for e in status["episodes"]] == [(episode.id, "needs_human")]
    shown = run(node, "show", "n3", *c).stdout
    assert f"medic: needs_human: episode #{episode.id}" in shown, shown

    [listed] = [j for j in as_json(jobs, *c) if j["job_id"] == job_id]
    assert listed["restarts_used"] == 1
    [row] = [r for r in run(jobs, *c).stdout.splitlines()[1:] if r.split()[0] == job_id]
    # The last of Medic's actions: the requeue, or the releaser's, which makes the requeued
    # job eligible 2 s later (slurm_hooks.release), when the table is read after it.
    assert row.endswith(("n3: requeued (gpu.xid.79)", "n3: made_eligible")), row
