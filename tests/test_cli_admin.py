"""The operator's CLI (`medic nodes`, `node`, `events`, `jobs`, `remediation`, `config`) on
the real lab (slurmctld, slurmd, medic-healthd, injected GPU faults) and on a PostgreSQL
store filled through the store API."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.admin import config, events, jobs, remediation
from cli.lab.cluster import Lab
from cli.node_commands import node
from cli.nodes import nodes
from medic_core.drain_book import DrainBook
from medic_core.store import ConditionUpdate, Store, open_store
from remediation import tickets
from remediation.episodes import ACTING, NEEDS_HUMAN, EpisodeStore
from tests.conftest import poll
from tests.pg import pg_server, pg_url  # noqa: F401  (pytest fixtures)

Command = Any


def run(command: Command, *args: str) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


def as_json(command: Command, *args: str) -> Any:
    result = run(command, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def slurm_node(lab: Lab, name: str) -> dict[str, Any]:
    return next(n for n in lab.sinfo_nodes() if n["name"] == name)


def ladder_off(lab: Lab, tmp_path: Path) -> Path:
    """The lab's config with the ladder off: a fault leaves the node drained by Medic, its
    episode waiting for a human, and nothing moving."""
    path = tmp_path / "medic.toml"
    text = lab.layout.medic_conf.read_text()
    path.write_text(text.replace("[remediation]\n", "[remediation]\nenabled = false\n", 1))
    return path


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


# --- the lab --------------------------------------------------------------------------------


def test_a_fault_at_night_is_what_medic_nodes_shows_in_the_morning(
    lab: Lab, tmp_path: Path
) -> None:
    conf = str(lab.layout.medic_conf)
    lab.start_healthd("n3", config=ladder_off(lab, tmp_path))
    lab.inject("n3", 2, ["xid=79"])
    poll(
        "n3 drained by Medic",
        lambda: slurm_node(lab, "n3").get("reason", "").startswith("medic: gpu.xid.79"),
        timeout=10,
    )

    result = run(nodes, "--config", conf)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("5 nodes: 1 out of service (1 drained by Medic), 1 not healthy")
    header = lines[1]
    assert header.split() == ["NODE", "STATE", "HEALTH", "FAULTS", "EPISODE", "RUNG", "MEDIC",
                              "SINCE", "DRAIN", "REASON"]  # fmt: skip
    [row] = [line for line in lines[2:] if line.startswith("n3 ")]
    cells = row.split()
    assert cells[2:5] == ["CRITICAL", "gpu.xid.79@gpu2", "needs_human"], row
    assert cells[6] == "needs_human", row  # the word every view gives n3
    assert "DRAIN" in cells[1]
    assert row[header.index("DRAIN REASON") :].startswith("medic: gpu.xid.79 gpu2")
    assert lines[-1] == "(4 more nodes healthy and in service; --all lists them)"

    doc = as_json(nodes, "--config", conf)
    assert doc["total"] == 5 and doc["slurm"] == "ok"
    [n3] = doc["nodes"]
    assert n3["node"] == "n3" and n3["health"] == "CRITICAL" and n3["drained_by"] == "medic"
    assert n3["faults"][0]["reason"] == "gpu.xid.79" and n3["faults"][0]["target"] == "2"
    assert n3["episode"]["state"] == NEEDS_HUMAN and n3["episode"]["fault_class"] == "gpu.xid.79"
    assert n3["partitions"] == ["gpu"] and "DRAIN" in n3["slurm_flags"]

    everyone = as_json(nodes, "--config", conf, "--all")["nodes"]
    assert [n["node"] for n in everyone] == ["n1", "n2", "n3", "n4", "n5"]
    assert {n["health"] for n in everyone if n["node"] != "n3"} == {"NO_DATA"}  # no daemon
    assert [n["node"] for n in as_json(nodes, "--config", conf, "--fault", "gpu.xid")["nodes"]] == [
        "n3"
    ]
    assert as_json(nodes, "--config", conf, "--fault", "ib")["nodes"] == []
    assert len(as_json(nodes, "--config", conf, "--all", "--state", "idle")["nodes"]) == 5
    assert [n["node"] for n in as_json(nodes, "--config", conf, "--state", "drain")["nodes"]] == [
        "n3"
    ]
    assert as_json(nodes, "--config", conf, "--partition", "cpu")["nodes"] == []

    shown = run(node, "show", "n3", "--config", conf)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert text.startswith("n3  state IDLE+DRAIN  partitions gpu  health CRITICAL")
    assert "drain reason: medic: gpu.xid.79 gpu2" in text and "[Medic's]" in text
    assert [r.split()[:4] for r in text.splitlines() if r.startswith("  gpu_xid ")] == [
        ["gpu_xid", "2", "CRITICAL", "gpu.xid.79"]
    ], text
    assert f"#1 {NEEDS_HUMAN}  gpu.xid.79 2" in text
    assert "OK or not applicable; --all to list them" in text
    detail = as_json(node, "show", "n3", "--config", conf)
    assert detail["episodes"][0]["state"] == NEEDS_HUMAN
    assert any(c["status"] == "OK" for c in detail["conditions"])
    assert any(e["fault_class"] == "gpu.xid.79" for e in detail["events"])

    # The operator has looked; the episode waits for a human, the drain is Medic's: resume.
    resumed = run(node, "resume", "n3", "--reason", "reseated GPU 2", "--config", conf)
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout.startswith("n3 resumed (was IDLE+DRAIN: medic: gpu.xid.79")
    poll("n3 back in service", lambda: "DRAIN" not in slurm_node(lab, "n3")["state_flags"])
    [audit] = as_json(events, "--config", conf, "--node", "n3", "--kind", "admin")
    assert audit["evidence"]["action"] == "resume" and audit["evidence"]["forced"] is False
    assert audit["message"].endswith(": reseated GPU 2")


def test_resume_leaves_a_drain_that_is_not_medics_unless_forced(lab: Lab, store: Store) -> None:
    conf = str(lab.layout.medic_conf)
    drained = run(node, "drain", "n2", "--reason", "admin: fan noise", "--config", conf)
    assert drained.exit_code == 0, drained.output
    assert slurm_node(lab, "n2")["reason"] == "admin: fan noise"

    again = run(node, "drain", "n2", "--reason", "admin: mine now", "--config", conf)
    assert again.exit_code == 1
    assert "already drained by someone else: 'admin: fan noise'" in again.stderr

    refused = run(node, "resume", "n2", "--reason", "looks fine", "--config", conf)
    assert refused.exit_code == 1
    lines = refused.stderr.splitlines()
    assert lines[0] == "medic: n2 was not drained by Medic: 'admin: fan noise' (set by root)"
    assert lines[1].startswith("  why: Medic resumes only its own drains")
    assert lines[2] == "  fix: ask them, or --force to resume anyway"
    assert "DRAIN" in slurm_node(lab, "n2")["state_flags"]

    forced = run(node, "resume", "n2", "--reason", "fan replaced", "--force", "--config", conf)
    assert forced.exit_code == 0, forced.output
    poll("n2 resumed", lambda: "DRAIN" not in slurm_node(lab, "n2")["state_flags"])
    actions = [e.evidence["action"] for e in store.events("n2", kind="admin")]
    assert actions == ["resume", "drain"]  # newest first

    assert run(node, "resume", "n1", "--reason", "x", "--config", conf).exit_code == 1
    reserved = run(node, "drain", "n1", "--reason", "medic: fake", "--config", conf)
    assert reserved.exit_code == 2 and "reserved" in reserved.stderr
    unknown = run(node, "drain", "n99", "--reason", "admin: x", "--config", conf)
    assert unknown.exit_code == 1 and "no node 'n99' in Slurm" in unknown.stderr


def test_resume_waits_for_an_open_episode(lab: Lab, store: Store) -> None:
    conf = str(lab.layout.medic_conf)
    # Medic's drain: recorded, then asked of Slurm (medic_core.drain_book)
    DrainBook.of(store).record_drain("n4", "medic: gpu.xid.48 gpu1", actor="daemon")
    lab.slurm(["scontrol", "update", "nodename=n4", "state=drain", "reason=medic: gpu.xid.48 gpu1"])
    EpisodeStore(store).open_episode(
        "n4", state=ACTING, fault_class="gpu.xid.48", target="1", check="gpu_xid",
        recommendation="gpu_reset", rung=1, message="DBE", evidence={},
    )  # fmt: skip
    refused = run(node, "resume", "n4", "--reason", "impatient", "--config", conf)
    assert refused.exit_code == 1
    assert "remediation episode #1 (acting, rung gpu_reset) is repairing n4" in refused.stderr
    row = as_json(nodes, "--config", conf)["nodes"][0]
    assert (row["node"], row["episode"]["state"], row["episode"]["rung"]) == (
        "n4", "acting", "gpu_reset",
    )  # fmt: skip
    forced = run(node, "resume", "n4", "--reason", "impatient", "--force", "--config", conf)
    assert forced.exit_code == 0, forced.output


def test_resume_refuses_a_node_with_an_open_rma_ticket(lab: Lab, store: Store) -> None:
    conf = str(lab.layout.medic_conf)
    DrainBook.of(store).record_drain("n3", "medic: gpu.xid.79 2", actor="daemon")  # Medic's
    lab.slurm(["scontrol", "update", "nodename=n3", "state=drain", "reason=medic: gpu.xid.79 2"])
    ticket = tickets.open_ticket(store, "n3", "gpu.xid.79", "GPU 2 gone", [], {}, "medic")
    refused = run(node, "resume", "n3", "--reason", "looks fine", "--config", conf)
    assert refused.exit_code == 1
    assert f"RMA ticket {ticket.id} is open for n3" in refused.stderr
    assert f"medic rma close {ticket.id}" in refused.stderr
    assert "DRAIN" in slurm_node(lab, "n3")["state_flags"]
    forced = run(node, "resume", "n3", "--reason", "looks fine", "--force", "--config", conf)
    assert forced.exit_code == 0, forced.output


def test_reboot_goes_through_slurm(lab: Lab, store: Store) -> None:
    conf = str(lab.layout.medic_conf)
    before = lab.layout.node("n5").slurmd_pid.read_text()
    result = run(node, "reboot", "n5", "--reason", "admin: firmware", "--config", conf)
    assert result.exit_code == 0, result.output
    assert result.stdout == "n5: reboot requested (ASAP, then RESUME): admin: firmware\n"
    pid_file = lab.layout.node("n5").slurmd_pid

    def restarted() -> bool:
        return pid_file.exists() and pid_file.read_text() not in ("", before)

    poll("n5's slurmd restarted (the lab's RebootProgram)", restarted, timeout=30)
    [audit] = store.events("n5", kind="admin")
    assert audit.evidence == {
        "action": "reboot", "actor": audit.evidence["actor"], "reason": "admin: firmware",
        "nextstate": "RESUME",
    }  # fmt: skip


def test_jobs_shows_a_resilient_job_requeued_off_a_faulty_node(lab: Lab, tmp_path: Path) -> None:
    conf = str(lab.layout.medic_conf)
    lab.start_healthd("n2", config=ladder_off(lab, tmp_path))

    def submit(*args: str) -> str:
        out = lab.slurm(["sbatch", "--parsable", *args]).stdout.strip()
        return out.split(";")[0]

    resilient = submit("--resilient=2", "-w", "n2", "--wrap", "sleep 120")

    def mine(listed: list[dict[str, Any]]) -> dict[str, Any]:
        """This test's job: squeue (and so `medic jobs`) still lists an earlier test's
        cancelled jobs until MinJobAge."""
        [job] = [j for j in listed if j["job_id"] == resilient]
        return job

    plain = submit("-w", "n1", "--wrap", "sleep 120")
    assert run(jobs, "--config", conf).exit_code == 0
    try:
        poll(
            "the resilient job running",
            lambda: mine(as_json(jobs, "--config", conf))["state"] == "RUNNING",
            timeout=60,  # a loaded 2-core machine (CI) took over 15 s to start it
        )
    except AssertionError as exc:  # say why: the job's state and reason, n2's state
        shown = lab.slurm(["scontrol", "-o", "show", "job", resilient], check=False).stdout
        n2 = lab.slurm(["scontrol", "-o", "show", "node", "n2"], check=False).stdout
        raise AssertionError(f"{exc}\njob: {shown[:600]}\nn2: {n2[:600]}") from None
    listed = mine(as_json(jobs, "--config", conf))
    assert listed["job_id"] == resilient and listed["restarts_allowed"] == 2
    assert (listed["restarts_used"], listed["slurm_restarts"]) == (0, 0)
    assert {j["job_id"] for j in as_json(jobs, "--config", conf, "--all")} >= {resilient, plain}

    lab.inject("n2", 0, ["xid=79"])

    def requeued() -> bool:
        job = mine(as_json(jobs, "--config", conf))
        return job["restarts_used"] == 1 and any(
            e["kind"] == "job_action" and e["evidence"].get("action") == "requeued"
            for e in job["events"]
        )

    poll("the job requeued by Medic", requeued, timeout=15)
    table = run(jobs, "--config", conf).stdout.splitlines()
    assert table[0].split()[:7] == [
        "JOB", "NAME", "USER", "STATE", "MEDIC_RESTARTS", "SLURM_RESTARTS", "NODES"
    ]  # fmt: skip
    [row] = [r for r in table[1:] if r.split()[0] == resilient]
    assert "1/2" in row.split()  # charged by Medic, of 2
    # The last of Medic's actions for the job: the requeue, or a later gate refusal on n2.
    assert re.search(r"n2: (requeued|gate refused) \(gpu\.xid\.79\)$", row), row


def test_config_check_validates_every_table(lab: Lab, tmp_path: Path) -> None:
    ok = run(config, "check", "--config", str(lab.layout.medic_conf))
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith(f"OK {lab.layout.medic_conf}: ") and "webhook off" in ok.stdout

    base = lab.layout.medic_conf.read_text()
    cases = {
        "healthd.jitter": base.replace("[healthd]\n", "[healthd]\njitter = 5\n"),
        "checks.nope": base + "\n[checks.nope]\nenabled = false\n",
        "hooks.on_unknown": base + '\n[hooks]\non_unknown = "maybe"\n',
        "sweep.share": base.replace("[sweep]\n", "[sweep]\nshare = 3\n"),
        "remediation.max_drained_share": base.replace(
            "[remediation]\n", "[remediation]\nmax_drained_share = 2\n"
        ),
        "store.url": base.replace('url = "sqlite', 'url = "mysql', 1),
        "bogus": base + "\n[bogus]\nx = 1\n",
    }
    for key, text in cases.items():
        path = tmp_path / f"{key}.toml"
        path.write_text(text)
        bad = run(config, "check", "--config", str(path))
        assert bad.exit_code == 1, (key, bad.output)
        [line] = bad.stderr.splitlines()
        assert line.startswith(f"medic: {path}: {key}: "), line
    missing = run(config, "check", "--config", str(tmp_path / "absent.toml"))
    assert missing.exit_code == 1 and "file not found" in missing.stderr


# --- a PostgreSQL store ---------------------------------------------------------------------


def test_listings_on_a_postgresql_store(pg_url: str) -> None:  # noqa: F811
    now = dt.datetime.now(dt.UTC)
    with open_store(pg_url) as store:
        for i in range(1, 4):
            store.set_conditions(
                f"pg{i}",
                [ConditionUpdate("gpu.ecc", "OK", str(g)) for g in range(8)]
                + [ConditionUpdate("ib.port", "OK", "mlx5_0:1")],
                now - dt.timedelta(hours=5),
            )
        store.set_condition(
            "pg2", ConditionUpdate("ib.port", "CRITICAL", "mlx5_0:1", "ib.port.down", "link down"),
            now - dt.timedelta(hours=3),
        )  # fmt: skip
        store.set_condition(
            "pg3", ConditionUpdate("gpu.ecc", "WARN", "4", "gpu.ecc.sbe", "SBE storm"), now
        )
        store.add_event("pg2", at=now - dt.timedelta(hours=3), kind="kernel_log",
                        severity="CRITICAL", source="kmsg", message="mlx5 link down",
                        fault_class="ib.port.down", target="mlx5_0:1")  # fmt: skip
        store.add_event("pg1", at=now - dt.timedelta(days=3), kind="gate", severity="INFO",
                        source="prolog", message="job 7 allowed", target="job:7")  # fmt: skip
        episodes = EpisodeStore(store)
        old = episodes.open_episode(
            "pg2", state=ACTING, fault_class="ib.port.down", target="mlx5_0:1", check="ib",
            recommendation="reboot", rung=3, message="link down", evidence={},
        )  # fmt: skip
        step = episodes.record_intent(old, 3, "reboot", ["scontrol", "reboot"], "boot-a")
        episodes.finish_step(step.id, "done", 0, "")
    url = ["--store", pg_url, "--no-slurm"]

    doc = as_json(nodes, *url)
    assert doc["slurm"] == "skipped"
    got = {n["node"]: n for n in doc["nodes"]}
    assert got["pg2"]["health"] == "CRITICAL" and got["pg2"]["episode"]["rung"] == "reboot"
    assert got["pg3"]["health"] == "WARN" and got["pg3"]["episode"] is None
    # pg1 is healthy, but its daemon has written nothing for 5 hours: nobody watches it.
    assert (got["pg1"]["health"], got["pg1"]["daemon_silent"]) == ("OK", True)
    assert got["pg3"]["daemon_silent"] is False and got["pg3"]["last_report"]
    assert {n["node"] for n in as_json(nodes, *url, "--all")["nodes"]} >= {"pg1", "pg2", "pg3"}
    assert [n["node"] for n in as_json(nodes, *url, "--fault", "ib.port")["nodes"]] == ["pg2"]
    human = run(nodes, *url).stdout
    [row] = [line.split() for line in human.splitlines() if line.startswith("pg2 ")]
    assert row[:7] == ["pg2", "?", "CRITICAL", "(silent)", "ib.port.down@mlx5_0:1", "acting",
                       "reboot"]  # fmt: skip
    assert "with a silent medic-healthd" in human.splitlines()[0]

    detail = as_json(node, "show", "pg2", "--store", pg_url)
    [episode] = detail["episodes"]
    assert [(s["action"], s["state"], s["returncode"]) for s in episode["steps"]] == [
        ("reboot", "done", 0)
    ]
    assert detail["health"] == "CRITICAL" and len(detail["conditions"]) == 9

    recent = as_json(events, "--store", pg_url, "--since", "1d")
    assert [e["node"] for e in recent if e["node"].startswith("pg")] == ["pg2"]
    week = as_json(events, "--store", pg_url, "--since", "1w", "--kind", "gate", "--node", "pg1")
    assert [e["message"] for e in week] == ["job 7 allowed"]
    assert run(events, "--store", pg_url, "--since", "yesterday").exit_code == 2

    paused = run(remediation, "pause", "--reason", "firmware rollout", "--store", pg_url)
    assert paused.exit_code == 0, paused.output
    assert "PAUSED" in paused.stdout and "firmware rollout" in paused.stdout
    status = as_json(remediation, "status", "--store", pg_url)
    assert status["paused"] is True and status["reason"] == "firmware rollout"
    assert [e["node"] for e in status["episodes"]] == ["pg2"]
    assert "remediation PAUSED" in run(nodes, *url).stdout
    assert run(remediation, "resume", "--store", pg_url).exit_code == 0
    assert as_json(remediation, "status", "--store", pg_url)["paused"] is False


def test_errors_say_what_why_and_what_to_do(tmp_path: Path) -> None:
    absent = run(nodes, "--no-slurm", "--store", f"sqlite:///{tmp_path / 'none.db'}")
    assert absent.exit_code == 1
    assert [line.split(":")[0] for line in absent.stderr.splitlines()] == [
        "medic", "  why", "  fix",
    ]  # fmt: skip
    assert not (tmp_path / "none.db").exists()
    bad = run(events, "--store", "mysql://db/medic")
    assert bad.exit_code == 2 and "unsupported database 'mysql'" in bad.stderr

    db = tmp_path / "medic.db"
    with open_store(f"sqlite:///{db}") as store:
        store.set_condition("x1", ConditionUpdate("gpu.ecc", "CRITICAL", "0", "gpu.ecc.dbe"),
                            dt.datetime.now(dt.UTC))  # fmt: skip
    conf = tmp_path / "medic.toml"
    conf.write_text(
        f'[slurm]\nconf = "{tmp_path}/no-slurm.conf"\n[store]\nurl = "sqlite:///{db}"\n'
    )
    degraded = run(nodes, "--config", str(conf))
    assert degraded.exit_code == 1  # Slurm did not answer: the store's view, and a warning
    assert "x1    ?      CRITICAL  gpu.ecc.dbe@gpu0" in degraded.stdout
    assert degraded.stderr.startswith("medic: warning: Slurm did not answer")
    broken = tmp_path / "broken.toml"
    broken.write_text("[store\n")
    assert run(nodes, "--config", str(broken)).exit_code == 2
    unknown = run(node, "show", "x9", "--store", f"sqlite:///{db}", "--config", str(conf))
    assert unknown.exit_code == 1 and "no node 'x9'" in unknown.stderr
