"""The lemon rule per component and fault family (remediation.policy.LemonScore): pure unit
tests, a hypothesis test of its invariants over random histories, the ladder's use of it
(an InfiniBand flap is no step towards a GPU's RMA) and the RMA ticket and webhook payload
of a real lemon, which name the GPU's serial and the rule's reason."""

from __future__ import annotations

import datetime as dt
import json
import types
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session

from cli.rma import rma_command
from healthd.checks import discover
from healthd.checks.base import registered
from healthd.ladder_host import DaemonLadderHost
from healthd.xid import CATALOG
from medic_core.status import Status
from medic_core.store.models import RmaOutboxRow
from medic_core.vocabulary import Component, ComponentKind, Finding, Recommendation
from remediation import episodes as ep
from remediation import tickets
from remediation.ladder import rma_reason, rung_history
from remediation.policy import (
    FAULT_FAMILIES,
    GPU_BUS,
    GPU_MEMORY,
    LINK,
    LemonEpisode,
    LemonScore,
    Rung,
    fault_family,
    lemon_episode,
    same_part,
)
from remediation.webhook import deliver_round
from tests.test_ladder_unit import (
    FakeNode,
    World,
    template_db,  # noqa: F401  (the fixture the world copies)
    world,  # noqa: F401
)
from tests.test_webhook import serve, settings_for  # noqa: F401  (serve: a fixture)

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
SERIAL = "1650123456789"
UUID = "GPU-8e5c2a10-0000-4000-8000-000000000003"
SLOT = "00000000:47:00.0"
GPU3 = Component(ComponentKind.GPU, "3", UUID, SERIAL, slot=SLOT)
HCA = Component(ComponentKind.HCA, "mlx5_0/1", guid="b8ce:f603:00a1:2f3c")


def history(
    component: Component = GPU3,
    family: str = GPU_MEMORY,
    *,
    days_ago: float = 1.0,
    repaired: bool = True,
    failed: int = 0,
    closed_by_human: bool = False,
    ticketed: bool = False,
) -> LemonEpisode:
    return LemonEpisode(
        component, family, NOW - dt.timedelta(days=days_ago), repaired, failed,
        closed_by_human, ticketed,
    )  # fmt: skip


def score(
    earlier: list[LemonEpisode],
    component: Component = GPU3,
    family: str = GPU_MEMORY,
    *,
    limit: int = 3,
    failed_limit: int = 2,
    days: float = 7.0,
) -> LemonScore:
    return LemonScore.of(
        component, family, earlier, since=NOW - dt.timedelta(days=days),
        episodes_limit=limit, failed_limit=failed_limit, days=days,
    )  # fmt: skip


# --- fault families --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault_class", "family"),
    [
        ("gpu.ecc.dbe", GPU_MEMORY),
        ("gpu.remap.failure", GPU_MEMORY),
        ("gpu.retired_pages.pending", GPU_MEMORY),
        ("gpu.xid.48", GPU_MEMORY),
        ("gpu.xid.63", GPU_MEMORY),
        ("gpu.xid.64", GPU_MEMORY),
        ("gpu.xid.94", GPU_MEMORY),
        ("gpu.xid.95", GPU_MEMORY),
        ("gpu.xid.79", GPU_BUS),
        ("gpu.xid.13", "gpu-engine"),
        ("gpu.xid.74", "gpu-nvlink"),
        ("ib.port.down", LINK),
        ("ib.errors.link_downed", LINK),
        ("ib.trend.symbol_error", LINK),
        ("service.down", "service"),
        ("something.new", "something"),  # no entry: its own first word
    ],
)
def test_fault_families(fault_class: str, family: str) -> None:
    assert fault_family(fault_class) == family


def declared_fault_classes() -> set[str]:
    """Every fault class a check declares, each XID of the catalog in place of gpu.xid.*."""
    discover()
    declared = {k for spec in registered() for k in spec.faults if not k.endswith(".*")}
    return declared | {e.fault_class for e in CATALOG.entries.values()}


def test_every_declared_fault_class_has_a_family_of_its_own() -> None:
    """No fault class a check emits falls through to the first-word default: each is named
    by a FAULT_FAMILIES prefix (its family is data, not an accident of its name)."""
    missing = []
    for fault_class in sorted(declared_fault_classes()):
        parts = fault_class.split(".")
        if not any(".".join(parts[:end]) in FAULT_FAMILIES for end in range(1, len(parts) + 1)):
            missing.append(fault_class)
    assert not missing
    assert fault_family("gpu.xid.48") != fault_family("ib.port.down")


# --- the score, pure ---------------------------------------------------------------------------


def test_the_nth_episode_goes_to_rma_and_the_reason_names_the_part() -> None:
    two = [history(days_ago=3), history(days_ago=2)]
    assert not score(two[:1]).is_lemon  # the 2nd episode: a repair
    lemon = score(two)  # the 3rd, with lemon_episodes = 3
    assert lemon.is_lemon and lemon.episodes_recent == 3
    assert lemon.describe() == f"lemon: 3 gpu-memory episodes on GPU 3 (serial {SERIAL}) in 7 days"


def test_a_link_flap_never_counts_toward_a_gpu() -> None:
    flaps = [history(HCA, LINK, repaired=False), history(HCA, LINK, repaired=True)]
    assert score(flaps, limit=2).episodes_recent == 1
    assert not score(flaps, limit=2).is_lemon


def test_an_episode_that_needed_no_repair_never_counts() -> None:
    assert score([history(repaired=False)] * 5).episodes_recent == 1


def test_other_families_other_gpus_humans_and_old_episodes_do_not_count() -> None:
    other = [
        history(family=GPU_BUS),  # the same GPU off the bus: another family
        history(Component(ComponentKind.GPU, "2", serial="1650999")),  # another GPU
        history(Component(ComponentKind.HOST)),  # the host
        history(closed_by_human=True),  # a human closed it: no fault
        history(days_ago=8),  # before lemon_days
    ]
    assert score(other, limit=2).episodes_recent == 1


def test_a_swapped_gpu_is_another_part() -> None:
    """The same index with another serial: the GPU was replaced (with or without a ticket)."""
    old = Component(ComponentKind.GPU, "3", serial="1650000000000")
    assert not same_part(old, GPU3)
    assert same_part(Component(ComponentKind.GPU, "3"), GPU3)  # identity unknown: the index
    assert score([history(old), history(old)]).episodes_recent == 1


def test_an_rma_ticket_starts_the_count_afresh() -> None:
    earlier = [history(days_ago=4), history(days_ago=3, ticketed=True), history(days_ago=1)]
    assert score(earlier).episodes_recent == 2  # only the one after the ticket, and this one


def test_failed_requalifications_of_the_part_and_family() -> None:
    lemon = score([history(failed=1), history(failed=1)], limit=10)
    assert lemon.is_lemon and lemon.failed_requalifications == 2
    assert lemon.why().startswith("2 failed re-qualifications after gpu-memory repairs of GPU 3")
    assert not score([history(HCA, LINK, failed=5)], limit=10).is_lemon


def test_the_identity_comes_from_earlier_findings_of_the_part() -> None:
    bare = Component(ComponentKind.GPU, "3")  # an XID names the index only
    lemon = score([history(), history()], bare)
    assert lemon.is_lemon and f"serial {SERIAL}" in lemon.describe()


def test_positional_score_still_reads_as_before() -> None:
    assert LemonScore(3, 0, 3, 2).is_lemon
    assert not LemonScore(2, 1, 3, 2).is_lemon


# --- the score, over random histories ----------------------------------------------------------

COMPONENTS = [
    GPU3,
    Component(ComponentKind.GPU, "3"),  # GPU 3, identity not read (an XID)
    Component(ComponentKind.GPU, "3", serial="1650000000000"),  # GPU 3 swapped
    Component(ComponentKind.GPU, "1", serial="1650000000001"),
    HCA,
    Component(ComponentKind.HOST),
]
FAMILIES = [GPU_MEMORY, GPU_BUS, LINK, "gpu-engine"]

episodes_strategy = st.builds(
    LemonEpisode,
    component=st.sampled_from(COMPONENTS),
    family=st.sampled_from(FAMILIES),
    opened_at=st.integers(0, 20 * 24).map(lambda h: NOW - dt.timedelta(hours=h)),
    repaired=st.booleans(),
    failed_requalifications=st.integers(0, 2),
    closed_by_human=st.booleans(),
    ticketed=st.booleans(),
)


def model(
    earlier: list[LemonEpisode], component: Component, family: str, days: float
) -> tuple[int, int]:
    """The documented rule, written out: after the part's last RMA ticket, its episodes of
    the family in the window that needed a repair and no human closed, plus this one; and
    their failed re-qualifications."""
    mine = sorted((e for e in earlier if same_part(e.component, component)),
                  key=lambda e: e.opened_at)  # fmt: skip
    tickets_at = [i for i, e in enumerate(mine) if e.ticketed]
    after = mine[tickets_at[-1] + 1 :] if tickets_at else mine
    since = NOW - dt.timedelta(days=days)
    counted = [
        e
        for e in after
        if e.family == family and e.opened_at >= since and e.repaired and not e.closed_by_human
    ]
    return 1 + len(counted), sum(e.failed_requalifications for e in counted)


@hypothesis_settings(max_examples=300, deadline=None)
@given(
    earlier=st.lists(episodes_strategy, max_size=12),
    extra=episodes_strategy,
    component=st.sampled_from(COMPONENTS),
    family=st.sampled_from(FAMILIES),
    limit=st.integers(2, 5),
    failed_limit=st.integers(1, 6),
)
def test_lemon_invariants(
    earlier: list[LemonEpisode],
    extra: LemonEpisode,
    component: Component,
    family: str,
    limit: int,
    failed_limit: int,
) -> None:
    base = score(earlier, component, family, limit=limit, failed_limit=failed_limit)
    # The Nth counts exactly: N-1 earlier qualifying episodes and this one make a lemon.
    count, failed = model(earlier, component, family, 7.0)
    assert (base.episodes_recent, base.failed_requalifications) == (count, failed)
    assert base.is_lemon == (count >= limit or failed >= failed_limit)
    with_extra = score([*earlier, extra], component, family, limit=limit, failed_limit=failed_limit)
    same = (base.episodes_recent, base.failed_requalifications, base.is_lemon)
    after = (with_extra.episodes_recent, with_extra.failed_requalifications, with_extra.is_lemon)
    if not same_part(extra.component, component):
        assert after == same  # another component never changes the answer
    elif not extra.ticketed and extra.family != family:
        assert after == same  # nor another family of the same part
    elif not extra.ticketed and not extra.repaired:
        assert after == same  # nor an episode that needed no repair
    elif not extra.ticketed:
        assert with_extra.episodes_recent >= base.episodes_recent  # one more can only add


# --- the ladder ---------------------------------------------------------------------------------

IB_DOWN = Finding(
    "ib", Status.CRITICAL, "ib.port.down", "mlx5_0/1", "HCA mlx5_0 port 1 is DOWN",
    Recommendation.RECHECK, evidence={"hca": "mlx5_0", "port": 1, "node_guid": HCA.guid},
)  # fmt: skip
DBE_3 = Finding(
    "gpu_ecc", Status.CRITICAL, "gpu.ecc.dbe", "3", "GPU 3: 1 volatile DBE",
    Recommendation.GPU_RESET, evidence={"index": 3, "uuid": UUID, "serial": SERIAL,
                                        "pci_bus_id": SLOT},
)  # fmt: skip
XID_48_3 = Finding(
    "gpu_xid", Status.CRITICAL, "gpu.xid.48", "3", "GPU 3: XID 48 Double Bit ECC Error",
    Recommendation.GPU_RESET, evidence={"xid": 48, "gpu": 3},
)  # fmt: skip


def flap(fake: World, node: str) -> ep.Episode:
    """An InfiniBand port down for a few seconds: re-checked, back by itself, resolved."""
    fake.fault(node, IB_DOWN)
    assert fake.last(node).state == ep.VERIFYING and fake.last(node).rung == 0
    fake.nodes[node].findings.clear()  # the port came back
    fake.clock.advance(8)
    episode = fake.tick(node)
    assert episode is not None and episode.state == ep.RESOLVED
    assert fake.steps(node) == []
    return episode


@pytest.mark.parametrize("lemon_episodes", [2, 3])
def test_an_ib_flap_then_one_dbe_on_a_fresh_node_gets_a_gpu_reset(
    world: World,  # noqa: F811
    lemon_episodes: int,
) -> None:
    """Before: the flap counted toward the node's lemon score and the DBE went straight to
    RMA with no reset tried. Now the DBE's episode starts at the GPU's reset."""
    world.configure(lemon_episodes=lemon_episodes)
    for _ in range(lemon_episodes - 1):
        flap(world, "n2")
        world.clock.advance(60)
    assert not world.daemon("n2").lemon_score(DBE_3).is_lemon
    admission = world.fault("n2", DBE_3)
    assert admission.episode is not None
    assert admission.episode.rung == int(Rung.GPU_RESET), admission.why
    assert "lemon" not in admission.why
    episode = world.run("n2")
    assert episode.state == ep.RESOLVED
    assert [s.action for s in world.steps("n2")] == ["gpu_reset"]
    assert world.nodes["n2"].rma == [] and tickets.list_tickets(world.store, node="n2") == []


def test_stored_episodes_read_for_the_rule(world: World) -> None:  # noqa: F811
    flapped = flap(world, "n2")
    seen = lemon_episode(flapped)
    assert (str(seen.component), seen.family, seen.repaired) == ("hca:mlx5_0/1", LINK, False)
    world.clock.advance(60)
    world.fault("n2", DBE_3)
    repaired = world.run("n2")
    seen = lemon_episode(repaired)
    assert (str(seen.component), seen.family, seen.repaired) == ("gpu:3", GPU_MEMORY, True)
    assert seen.component.serial == SERIAL


class TicketingNode(FakeNode):
    """The fake node, with the daemon's own open_rma (healthd.ladder_host) over the real
    store: the ticket's summary, evidence and outbox row as production writes them."""

    def open_rma(self, episode: ep.Episode, why: str) -> int | None:
        daemon = types.SimpleNamespace(
            node=self.name,
            store=self.world.store,
            gpu_identities=lambda: [
                {"index": 3, "uuid": UUID, "serial": SERIAL, "pci_bus_id": SLOT}
                if i == 3
                else {"index": i, "uuid": f"GPU-{i}", "serial": f"16500000000{i}",
                      "pci_bus_id": f"00000000:{i:02x}:00.0"}
                for i in range(8)
            ],
        )  # fmt: skip
        host = DaemonLadderHost(daemon, self.world.episodes)  # type: ignore[arg-type]
        ticket = host.open_rma(episode, why)
        assert ticket is not None
        self.rma.append((ticket, why))
        return ticket


def repaired_before(fake: World, node: str, finding: Finding) -> None:
    fake.fault(node, finding)
    assert fake.run(node).state == ep.RESOLVED
    fake.clock.advance(3600)


def test_a_lemon_s_ticket_and_webhook_payload_name_the_gpu_serial_and_the_reason(
    world: World,  # noqa: F811
    serve: Any,  # noqa: F811
) -> None:
    node = "n3"
    world.nodes[node] = TicketingNode(node, world)
    repaired_before(world, node, DBE_3)  # two DBEs on GPU 3 this week, each reset
    repaired_before(world, node, DBE_3)
    flap(world, node)  # a flap on the way: no part of GPU 3's count
    world.clock.advance(60)
    admission = world.fault(node, XID_48_3)  # the third: an XID, which knows the index only
    assert admission.episode is not None and admission.episode.rung == int(Rung.RMA)
    episode = world.tick(node)
    assert episode is not None and episode.state == ep.RMA
    assert [s.action for s in world.episodes.steps(episode.id)] == []  # no reset tried
    [ticket] = tickets.list_tickets(world.store, node=node)
    reason = f"lemon: 3 gpu-memory episodes on GPU 3 (serial {SERIAL}) in 7 days"
    assert ticket.reason == reason
    assert ticket.summary == f"GPU 3 (serial {SERIAL}) on {node}: gpu.xid.48; {reason}"
    assert "no repair to try" not in ticket.summary
    assert ticket.component == {
        "id": "gpu:3", "kind": "gpu", "name": "3", "uuid": UUID, "serial": SERIAL,
        "slot": SLOT, "describe": f"GPU 3 (serial {SERIAL}, {UUID}, slot {SLOT})",
    }  # fmt: skip
    assert [g.serial for g in ticket.gpus] == [SERIAL]
    # What the webhook sends: the stored payload, and the body a receiver gets.
    with Session(world.store.engine) as session:
        [row] = session.scalars(select(RmaOutboxRow).where(RmaOutboxRow.ticket_id == ticket.id))
        stored = dict(row.payload)
    receiver = serve((200, {}))
    [done] = deliver_round(world.store, settings_for(receiver.url))
    assert done.state == "delivered"
    payload = json.loads(receiver.received[0].body)
    assert payload == stored
    assert payload["ticket"]["component"]["serial"] == SERIAL
    assert payload["ticket"]["reason"] == reason
    assert SERIAL in payload["ticket"]["summary"]
    assert payload["evidence"]["component"]["serial"] == SERIAL
    # What the operator reads: `medic rma show`, its --json, and the list's summary column.
    url = ("--store", str(world.store.engine.url))
    shown = CliRunner().invoke(rma_command, ["show", str(ticket.id), *url])
    assert shown.exit_code == 0, shown.output
    assert f"part: GPU 3 (serial {SERIAL}, {UUID}, slot {SLOT})" in shown.stdout
    assert f"reason: {reason}" in shown.stdout
    detail = CliRunner().invoke(rma_command, ["show", str(ticket.id), "--json", *url])
    doc = json.loads(detail.stdout)
    assert (doc["component"]["serial"], doc["reason"]) == (SERIAL, reason)


def test_a_ticket_after_the_rungs_names_them_and_the_failure(world: World) -> None:  # noqa: F811
    node = "n4"
    world.nodes[node] = TicketingNode(node, world)
    world.nodes[node].hardware_fault = True  # nothing cures it
    world.fault(node, DBE_3)
    episode = world.run(node, ticks=200)
    assert episode.state == ep.RMA
    [ticket] = tickets.list_tickets(world.store, node=node)
    assert ticket.reason.startswith("gpu_reset x2, driver_reload x1, reboot x1 did not repair it")
    assert ticket.summary.startswith(f"GPU 3 (serial {SERIAL}) on {node}: gpu.ecc.dbe; ")


def test_rma_reasons_without_a_lemon() -> None:
    e = ep.Episode(
        1, "n1", ep.WAITING_IDLE, "gpu.remap.failure", "1", "gpu_remapped_rows", "rma", 4, 4,
        {}, "", {}, 0, None, NOW, NOW, None,
    )  # fmt: skip
    assert rma_reason(e, [], "") == "recommended 'rma': no repair tried"
    assert rma_reason(e, [], "", {"gpu.remap": "rma"}) == (
        "[remediation] first_rung sends gpu.remap straight to RMA: no repair tried"
    )
    lemon = dict(e.evidence, lemon="lemon: 3 gpu-memory episodes on GPU 1 in 7 days")
    assert rma_reason(type(e)(**{**e.__dict__, "evidence": lemon}), [], "x").startswith("lemon:")
    step = ep.Step(1, 1, 3, "reboot", 1, "failed", (), None, "slurm refused: busy", "b", NOW, NOW)
    assert rung_history([step]) == ""  # a refused reboot is no repair
