"""A check's evidence reaches the decision core's Finding, the episode and an RMA ticket: an
InfiniBand port's HCA, port and GUID, not a list of GPU serials."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.ladder_host import ticket_gpus
from medic_core.status import Status
from medic_core.vocabulary import EVIDENCE_LIMIT, Finding, Recommendation, storable_evidence
from remediation.episodes import Episode

IB_RESULT = {
    "check": "ib",
    "status": "CRITICAL",
    "fault_class": "ib.port.down",
    "target": "mlx5_0/1",
    "message": "port 1 of mlx5_0 is DOWN (phys_state 3: Disabled)",
    "evidence": {
        "hca": "mlx5_0",
        "port": 1,
        "state": "1: DOWN",
        "phys_state": "3: Disabled",
        "node_guid": "0c42:a103:0016:5e3a",
        "recommendation": "recheck",
    },
}
GPUS = [{"index": i, "serial": f"165392000{i}", "uuid": f"GPU-{i}"} for i in range(8)]


def episode(fault_class: str, target: str) -> Episode:
    now = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)
    return Episode(
        id=1, node="n1", state="rma", fault_class=fault_class, target=target, check="c",
        recommendation="reboot", first_rung=3, rung=4, attempts={}, message="", evidence={},
        failed_requalifications=0, ticket_id=None, opened_at=now, updated_at=now,
        closed_at=None,
    )  # fmt: skip


def test_an_ib_finding_keeps_the_hca_port_and_guid() -> None:
    finding = Finding.from_json(IB_RESULT)
    assert finding.recommendation is Recommendation.RECHECK
    assert finding.evidence["hca"] == "mlx5_0" and finding.evidence["port"] == 1
    assert finding.evidence["node_guid"] == "0c42:a103:0016:5e3a"
    again = Finding.from_json(json.loads(json.dumps(finding.as_json())))
    assert again == finding and again.evidence == finding.evidence


def test_evidence_is_not_part_of_a_decisions_equality() -> None:
    bare = Finding("ib", Status.CRITICAL, "ib.port.down", "mlx5_0/1", "down")
    assert Finding.from_json(IB_RESULT).evidence and bare.evidence == {}
    assert hash(bare) == hash(Finding("ib", Status.CRITICAL, "ib.port.down", "mlx5_0/1", "down"))
    assert "as_json" not in repr(bare) and "evidence" not in repr(bare)
    assert "evidence" not in bare.as_json()


def test_an_rma_ticket_for_a_link_names_no_gpu() -> None:
    assert ticket_gpus(episode("ib.port.down", "mlx5_0/1"), lambda: GPUS) == []
    assert ticket_gpus(episode("service.down", "munge"), lambda: GPUS) == []
    assert ticket_gpus(episode("gpu.xid.79", "2"), lambda: GPUS) == [GPUS[2]]
    assert ticket_gpus(episode("gpu.count", ""), lambda: GPUS) == GPUS


def test_evidence_that_no_store_accepts_is_replaced_by_why() -> None:
    assert storable_evidence({"x": float("nan")})["dropped"].startswith("evidence is not JSON")
    assert storable_evidence({"x": "a\x00b"}) == {"dropped": "evidence contains a NUL character"}
    big = storable_evidence({"log": "x" * EVIDENCE_LIMIT})
    assert big["dropped"].endswith(f"the limit is {EVIDENCE_LIMIT}")
    assert storable_evidence(["not", "a", "mapping"]) == {}
    assert storable_evidence({"when": dt.date(2026, 11, 23)}) == {"when": "2026-11-23"}


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, derandomize=True, database=None)
@given(evidence=st.dictionaries(st.text(), json_values, max_size=5) | json_values)
def test_any_evidence_gives_a_storable_object(evidence: Any) -> None:
    kept = storable_evidence(evidence)
    text = json.dumps(kept, allow_nan=False)
    assert "\\u0000" not in text and len(text) <= EVIDENCE_LIMIT + 100
    finding = Finding.from_json({"check": "c", "status": "WARN", "evidence": evidence})
    assert finding.evidence == kept


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(list(Recommendation)),
    st.sampled_from(list(Status)),
    st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=4),
)
def test_a_finding_survives_its_own_json_whole(
    recommendation: Recommendation, status: Status, evidence: dict[str, Any]
) -> None:
    """Found in stop 31: from_json ignored as_json's `recommendation`, so a finding sent
    through JSON without evidence came back as `drain`."""
    finding = Finding("gpu_xid", status, "gpu.xid.79", "3", "XID 79", recommendation, evidence)
    back = Finding.from_json(json.loads(json.dumps(finding.as_json())))
    assert back == finding and back.recommendation is recommendation
    assert back.evidence == storable_evidence(evidence)
