"""`medic rma list|show|open|update|close` on SQLite and on a real PostgreSQL server, shell
completion of ticket ids and node names, and a ticket the lab's ladder opens followed to
closure with the commands an operator types."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.shell_completion import BashComplete
from click.testing import CliRunner, Result

from cli.admin import actor
from cli.lab import scenario
from cli.lab.cluster import Lab
from cli.main import medic
from cli.node_commands import node
from cli.nodes import nodes
from cli.rma import rma_command
from medic_core import proc
from medic_core.store import ConditionUpdate, Store, open_store
from remediation import tickets as rma
from remediation.episodes import ACTING, EpisodeStore
from remediation.tickets import Gpu
from tests.conftest import poll
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)

T0 = dt.datetime(2025, 3, 1, 3, 12, 7, tzinfo=dt.UTC)
MEDIC = str(Path(sys.executable).parent / "medic")
GPU2 = Gpu(2, "GPU-8c5a6f1e-0000-4000-8000-000000000002", "1654321000002", "00000000:47:00.0")


def run(*args: str) -> Result:
    return CliRunner().invoke(rma_command, list(args), catch_exceptions=False)


def as_json(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'medic.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        opened.set_condition(
            "gpu07", ConditionUpdate("gpu_xid", "CRITICAL", "2", "gpu.xid.79", "XID 79"), T0
        )
        opened.set_condition("gpu08", ConditionUpdate("cpus", "OK"), T0)
        yield opened


def ladder_ticket(store: Store, node: str = "gpu07", fault: str = "gpu.xid.79") -> rma.Ticket:
    return rma.open_ticket(
        store, node, fault, f"{fault} on {node}: every rung tried", [GPU2],
        rma.evidence_bundle(xids=[{"gpu": 2, "xid": 79}], actions=[{"action": "reboot"}]),
        "medic-ladder", at=T0,
    )  # fmt: skip


def test_a_ticket_followed_to_closure(store: Store, store_url: str) -> None:
    ticket = ladder_ticket(store)
    url = ("--store", store_url)

    listed = run("list", *url)
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0] == "1 ticket: 1 open"
    assert lines[1].split() == ["TICKET", "NODE", "STATE", "FAULT", "GPUS", "VENDOR", "REF",
                                "OPENED", "UPDATED", "BY", "SUMMARY"]  # fmt: skip
    cells = lines[2].split()
    assert cells[:6] == [str(ticket.id), "gpu07", "open", "gpu.xid.79", "2", "-"]
    assert "medic-ladder" in cells and lines[2].endswith("gpu.xid.79 on gpu07: every rung tried")

    refused = run("update", str(ticket.id), "--state", "replaced", *url)
    assert refused.exit_code == 1
    assert refused.stderr.splitlines() == [
        f"medic: RMA ticket {ticket.id} (gpu07) cannot go from open to replaced",
        "  why: tickets move open -> submitted -> acknowledged -> replaced -> closed",
        f"  fix: medic rma update {ticket.id} --state submitted or medic rma close "
        f"{ticket.id} --note TEXT",
    ]
    assert rma.get(store, ticket.id).state.value == "open"  # type: ignore[union-attr]

    moved = run("update", str(ticket.id), "--state", "submitted", "--vendor-ref", "INC-4711",
                "--note", "sent to Dell, case 88123", *url)  # fmt: skip
    assert moved.exit_code == 0, moved.output
    assert moved.stdout == f"RMA ticket {ticket.id} (gpu07): now submitted (vendor ref INC-4711)\n"
    for state in ("acknowledged", "replaced"):
        assert run("update", str(ticket.id), "--state", state, *url).exit_code == 0

    row = as_json("list", *url)[0]
    assert (row["state"], row["vendor_ref"], row["last_actor"]) == ("replaced", "INC-4711", actor())

    closed = run("close", str(ticket.id), "--note", "GPU 2 swapped, serial 1654321000099", *url)
    assert closed.exit_code == 0, closed.output
    assert closed.stdout.splitlines() == [
        f"RMA ticket {ticket.id} (gpu07) closed: replaced",
        f"gpu07 must pass re-qualification before it takes jobs again (medic rma show "
        f"{ticket.id} says when it has)",
    ]
    assert rma.needs_requalification(store, "gpu07")

    assert run("list", *url).stdout == "no RMA tickets open; --all lists closed ones too\n"
    [everything] = as_json("list", "--all", *url)
    assert everything["resolution"] == "replaced" and everything["requalify"] is True
    assert as_json("list", "--state", "closed", *url) == [everything]

    shown = run("show", str(ticket.id), *url)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert text.startswith(
        f"RMA ticket {ticket.id}  gpu07  closed (replaced), requalify  gpu.xid.79"
    )
    assert "vendor ref: INC-4711" in text
    assert "re-qualification: pending (gpu07 must pass it before it takes jobs)" in text
    assert "notifications: 0 delivered, 5 pending, 0 failed" in text
    assert f"  2      {GPU2.uuid}  {GPU2.serial}  {GPU2.pci_bus_id}" in text
    trail = [line.split()[3:5] for line in text.split("audit trail (5):\n")[1].splitlines()[1:]]
    assert trail == [["-", "open"], ["open", "submitted"], ["submitted", "acknowledged"],
                     ["acknowledged", "replaced"], ["replaced", "closed"]]  # fmt: skip

    detail = as_json("show", str(ticket.id), *url)
    assert [(a["from"], a["to"], a["actor"]) for a in detail["audit"]][-1] == (
        "replaced", "closed", actor(),
    )  # fmt: skip
    assert detail["audit"][1]["note"] == "sent to Dell, case 88123"
    assert detail["evidence"]["xids"] == [{"gpu": 2, "xid": 79}]
    assert detail["next_states"] == [] and detail["notifications"]["pending"] == 5

    again = run("close", str(ticket.id), "--note", "twice", *url)
    assert again.exit_code == 1
    assert "cannot go from closed to closed" in again.stderr
    assert "fix: open a new one: medic rma open gpu07 --fault gpu.xid.79" in again.stderr

    rma.requalified(store, "gpu07", "medic-ladder")
    assert "re-qualification: passed " in run("show", str(ticket.id), *url).stdout

    # The node's own page lists its tickets.
    page = CliRunner().invoke(node, ["show", "gpu07", *url], catch_exceptions=False)
    assert page.exit_code == 0, page.output
    section = page.stdout.split("RMA tickets (1):\n")[1].splitlines()
    assert section[0].split()[:3] == ["TICKET", "STATE", "FAULT"]
    assert section[1].split()[:5] == [str(ticket.id), "closed", "(replaced)", "gpu.xid.79", "2"]
    detail_json = CliRunner().invoke(node, ["show", "gpu07", "--json", *url]).stdout
    [listed_ticket] = json.loads(detail_json)["tickets"]
    assert (listed_ticket["id"], listed_ticket["requalify"]) == (ticket.id, False)


def test_a_ticket_opened_by_hand_carries_the_stores_evidence(store: Store, store_url: str) -> None:
    url = ("--store", store_url)
    store.add_event("gpu07", at=T0, kind="gpu_xid", severity="CRITICAL", source="check:gpu_xid",
                    message="Xid 79 on GPU 2", fault_class="gpu.xid.79", target="2")  # fmt: skip
    episodes = EpisodeStore(store)
    episode = episodes.open_episode(
        "gpu07", state=ACTING, fault_class="gpu.xid.79", target="2", check="gpu_xid",
        recommendation="reboot", rung=3, message="XID 79", evidence={},
    )  # fmt: skip
    step = episodes.record_intent(episode, 3, "reboot", ["scontrol", "reboot", "gpu07"], "boot-a")
    episodes.finish_step(step.id, "failed", 1, "no new boot")

    opened = run("open", "gpu07", "--fault", "gpu.xid.79", "--note", "reseat did not help",
                 "--gpu", "2", "--gpu", "2", *url)  # fmt: skip
    assert opened.exit_code == 0, opened.output
    [ticket] = rma.list_tickets(store)
    assert opened.stdout.splitlines() == [
        f"RMA ticket {ticket.id} opened for gpu07 gpu.xid.79 GPUs 2",
        f"next: medic rma update {ticket.id} --state submitted --vendor-ref REF",
    ]
    assert [g.index for g in ticket.gpus] == [2] and ticket.summary == "reseat did not help"
    evidence = ticket.evidence
    assert [c["reason"] for c in evidence["conditions"]] == ["gpu.xid.79"]  # not gpu08's OK
    assert [h["message"] for h in evidence["history"]] == ["Xid 79 on GPU 2"]
    assert [(a["action"], a["state"], a["returncode"]) for a in evidence["actions"]] == [
        ("reboot", "failed", 1)
    ]
    assert evidence["opened_by"] == actor()
    assert [(e.actor, e.to_state.value) for e in rma.audit(store, ticket.id)] == [(actor(), "open")]

    duplicate = run("open", "gpu07", "--fault", "gpu.xid.79", "--note", "again", *url)
    assert duplicate.exit_code == 1
    assert duplicate.stderr.startswith(
        f"medic: RMA ticket {ticket.id} is already open for gpu07 gpu.xid.79 (open)\n"
    )
    assert len(rma.list_tickets(store)) == 1

    typo = run("open", "gpu7", "--fault", "gpu.xid.79", "--note", "x", *url)
    assert typo.exit_code == 1 and "no node 'gpu7' in the store" in typo.stderr
    forced = as_json("open", "gpu7", "--fault", "mem.edac.ue", "--note", "DIMM B2", "--force", *url)
    assert forced["node"] == "gpu7" and forced["gpus"] == []

    assert run("open", "gpu07", "--fault", "GPU XID", "--note", "x", *url).exit_code == 2
    assert run("open", "gpu07", "--fault", "gpu.ecc.dbe", "--note", "  ", *url).exit_code == 2
    assert len(rma.list_tickets(store)) == 2

    # Filters: by node, by state, several states.
    assert [t["node"] for t in as_json("list", "--node", "gpu7", *url)] == ["gpu7"]
    run("update", str(ticket.id), "--state", "submitted", *url)
    assert [t["id"] for t in as_json("list", "--state", "submitted", *url)] == [ticket.id]
    both = as_json("list", "--state", "open", "--state", "submitted", *url)
    assert [t["state"] for t in both] == ["submitted", "open"]
    assert run("list", "--state", "lost", *url).exit_code == 2
    assert run("list", "--node", "gpu99", *url).stdout == (
        "no RMA tickets open for gpu99; --all lists closed ones too\n"
    )


def test_closing_early_cancels_and_needs_a_note(store: Store, store_url: str) -> None:
    url = ("--store", store_url)
    ticket = ladder_ticket(store)
    bare = run("close", str(ticket.id), *url)
    assert bare.exit_code == 2
    assert bare.stderr.splitlines() == [
        f"medic: closing RMA ticket {ticket.id} (gpu07) from open cancels it",
        "  why: a cancelled RMA must say why in the audit trail",
        "  fix: give --note TEXT, e.g. --note 'vendor found no fault'",
    ]
    assert rma.get(store, ticket.id).state.value == "open"  # type: ignore[union-attr]
    closed = run("close", str(ticket.id), "--note", "vendor found no fault", *url)
    assert closed.exit_code == 0, closed.output
    assert closed.stdout.startswith(f"RMA ticket {ticket.id} (gpu07) closed: cancelled\n")
    [row] = as_json("list", "--all", *url)
    assert (row["resolution"], row["last_note"]) == ("cancelled", "vendor found no fault")
    assert run("list", "--all", *url).stdout.splitlines()[2].split()[2:5] == [
        "closed", "(cancelled),", "requalify",
    ]  # fmt: skip

    missing = run("show", "99", *url)
    assert missing.exit_code == 1
    assert missing.stderr.splitlines()[0] == "medic: no RMA ticket 99"
    assert run("update", "99", "--state", "submitted", *url).exit_code == 1
    assert run("update", str(ticket.id), "--state", "closed", *url).exit_code == 2  # not a choice


def test_completion_offers_ticket_ids_and_node_names(store: Store, store_url: str) -> None:
    first = ladder_ticket(store)
    second = ladder_ticket(store, "gpu08", "gpu.ecc.dbe")
    rma.transition(store, first.id, "closed", "tech", "false alarm")

    def offered(args: list[str], incomplete: str) -> list[tuple[str, str | None]]:
        complete = BashComplete(medic, {}, "medic", "_MEDIC_COMPLETE")
        return [(c.value, c.help) for c in complete.get_completions(args, incomplete)]

    url = ["--store", store_url]
    assert offered(["rma", "show", *url], "") == [
        (str(second.id), "gpu08 open gpu.ecc.dbe"), (str(first.id), "gpu07 closed gpu.xid.79"),
    ]  # fmt: skip
    assert offered(["rma", "close", *url], "") == [(str(second.id), "gpu08 open gpu.ecc.dbe")]
    assert offered(["rma", "open", *url], "gpu0") == [("gpu07", None), ("gpu08", None)]
    assert offered(["node", "show", *url], "gpu08") == [("gpu08", None)]
    assert offered(["rma", "list", *url, "--node"], "gpu07") == [("gpu07", None)]
    # No store: nothing offered, nothing raised, nothing created.
    absent = ["--store", f"sqlite:///{Path('/nonexistent') / 'medic.db'}"]
    assert offered(["rma", "show", *absent], "") == []


# --- the lab: the ladder opens the ticket ---------------------------------------------------


def rma_first(lab: Lab, tmp_path: Path) -> Path:
    """The lab's config with XID 79 sent straight to RMA (a site that never reboots for it)."""
    path = tmp_path / "medic.toml"
    text = lab.layout.medic_conf.read_text()
    if "\nfirst_rung = { " in text:  # the lab sets some of its own
        text = text.replace("\nfirst_rung = { ", '\nfirst_rung = { "gpu.xid.79" = "rma", ', 1)
    else:
        text = text.replace(
            "[remediation]\n", '[remediation]\nfirst_rung = { "gpu.xid.79" = "rma" }\n', 1
        )
    path.write_text(text)
    return path


def test_the_ladders_ticket_in_the_lab(lab: Lab, tmp_path: Path) -> None:
    conf = rma_first(lab, tmp_path)
    c = ("--config", str(conf))
    lab.start_healthd("n3", config=conf)
    lab.inject("n3", 2, ["xid=79"])
    poll("the ladder's RMA ticket", lambda: bool(as_json("list", *c)), timeout=45)  # loaded CI

    [ticket] = as_json("list", *c)
    assert (ticket["node"], ticket["state"], ticket["fault_class"]) == ("n3", "open", "gpu.xid.79")
    assert ticket["gpus"] == [2] and ticket["last_actor"] == "medic-ladder"
    detail = as_json("show", str(ticket["id"]), *c)
    [gpu] = detail["gpus"]
    assert gpu["index"] == 2 and gpu["uuid"].startswith("GPU-") and gpu["pci_bus_id"]
    assert any(cond["reason"] == "gpu.xid.79" for cond in detail["evidence"]["conditions"])
    assert detail["episodes"]  # the episode that ended in the ticket
    view = CliRunner().invoke(nodes, ["--json", *c], catch_exceptions=False)
    [n3] = json.loads(view.stdout)["nodes"]
    assert n3["episode"]["state"] == "rma" and n3["drained_by"] == "medic"

    tid = str(ticket["id"])
    for state, extra in (("submitted", ["--vendor-ref", "INC-5512"]), ("acknowledged", []),
                         ("replaced", ["--note", "GPU 2 swapped"])):  # fmt: skip
        moved = run("update", tid, "--state", state, *extra, *c)
        assert moved.exit_code == 0, moved.output
    closed = run("close", tid, "--note", "new GPU 2 burnt in", *c)
    assert closed.exit_code == 0, closed.output
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        assert rma.needs_requalification(store, "n3")
    assert "re-qualification: pending" in run("show", tid, *c).stdout

    # The node was powered off for the swap: no daemon until it is back.
    lab.stop_healthd("n3")
    code, doc = requalify(lab, conf, "n3")
    assert code == 1 and doc["requalified"] is False, doc  # the old XID is still there
    assert doc["tickets_cleared"] == [] and "DRAIN" in slurm_state(lab, "n3")
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        assert rma.needs_requalification(store, "n3")

    swap_gpu(lab, "n3")
    code, doc = requalify(lab, conf, "n3")
    assert code == 0 and doc["requalified"] is True, doc
    assert doc["tickets_cleared"] == [ticket["id"]] and doc["slurm"] == "resumed"
    poll("n3 back in service", lambda: "DRAIN" not in slurm_state(lab, "n3"))
    assert "re-qualification: passed " in run("show", tid, *c).stdout
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        assert not rma.needs_requalification(store, "n3")
        assert [a.note for a in rma.audit(store, ticket["id"])][-1].startswith(
            "medic check --requalify: "
        )
        assert not [x for x in store.conditions(node="n3") if x.status.value == "CRITICAL"]
    listed = json.loads(CliRunner().invoke(nodes, ["--json", "--all", *c]).stdout)["nodes"]
    [after] = [n for n in listed if n["node"] == "n3"]
    assert after["episode"] is None and after["health"] == "OK", after  # episode resolved
    assert "DRAIN" not in after["slurm_flags"] and after["drain_reason"] == ""
    again, _ = requalify(lab, conf, "n3")
    assert again == 1  # nothing waits any more


def slurm_state(lab: Lab, name: str) -> list[str]:
    return list(next(n for n in lab.sinfo_nodes() if n["name"] == name)["state_flags"])


def requalify(lab: Lab, conf: Path, node: str) -> tuple[int | None, Any]:
    """`medic check --requalify --json` on the node (a child process: it loads the lab's
    simulated libnvidia-ml)."""
    env = {**lab.process_env(node), "MEDIC_CONFIG": str(conf)}
    done = proc.run([MEDIC, "check", "--requalify", "--json"], timeout=60, env=env)
    assert done.returncode is not None, done.describe_failure()
    return done.returncode, json.loads(done.stdout) if done.stdout else None


def swap_gpu(lab: Lab, node: str) -> None:
    """What the technician's visit leaves: the GPU replaced and the node booted afresh (no
    XID in the driver, a new kernel log)."""
    layout = lab.layout.node(node)
    current = scenario.read_scenario(layout.scenario)
    scenario.write_scenario(layout.scenario, scenario.reboot(current))
    (layout.host_root / "dev/kmsg").write_text("")


def test_the_daemon_requalifies_a_node_back_from_rma(lab: Lab, tmp_path: Path) -> None:
    """Closing a ticket is not enough to return the node: the node's own daemon, once the
    node is back, runs the re-qualification checks and only then lifts Medic's drain."""
    conf = rma_first(lab, tmp_path)
    c = ("--config", str(conf))
    lab.start_healthd("n3", config=conf)
    lab.inject("n3", 2, ["xid=79"])
    poll("the ladder's RMA ticket", lambda: bool(as_json("list", *c)), timeout=45)  # loaded CI
    [ticket] = as_json("list", *c)
    tid = str(ticket["id"])
    lab.stop_healthd("n3")  # powered off for the technician
    for state in ("submitted", "acknowledged", "replaced"):
        assert run("update", tid, "--state", state, *c).exit_code == 0
    assert run("close", tid, "--note", "GPU 2 swapped", *c).exit_code == 0
    swap_gpu(lab, "n3")
    lab.start_healthd("n3", config=conf)

    poll("n3 back in service", lambda: "DRAIN" not in slurm_state(lab, "n3"), timeout=30)
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        # The drain is lifted first, the ticket's flag cleared right after (a Slurm failure
        # keeps the flag, to try again): the flag may still be there for a moment.
        poll("the flag cleared", lambda: not rma.needs_requalification(store, "n3"), timeout=10)
        assert rma.audit(store, ticket["id"])[-1].actor == "medic-healthd"
        [episode] = EpisodeStore(store).find(node="n3")
        assert (episode.state, episode.ticket_id) == ("resolved", ticket["id"])
