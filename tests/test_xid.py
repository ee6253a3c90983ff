"""The XID catalog, the kernel log's NVRM Xid lines and the recent-XID buffer."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import healthd.xid as xid_module
from healthd.checks.base import Status
from healthd.kmsg import read_since
from healthd.nvml_client import normalize_pci_bus_id, pci_key
from healthd.xid import (
    CATALOG,
    CatalogError,
    XidBuffer,
    load_catalog,
    parse_catalog,
    parse_xid_message,
    xids_from_records,
)
from medic_core.vocabulary import Recommendation

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
REQUIRED_XIDS = [13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95]
REQUIRED_XIDS += [109, 119, 120, 121, 136, 140, 143, *range(144, 151)]


def _raw() -> dict[str, Any]:
    text = (Path(__file__).parents[1] / "healthd" / "xid_catalog.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def test_catalog_records_its_source_and_version() -> None:
    assert CATALOG.source == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    assert "R575" in CATALOG.version


@pytest.mark.parametrize("raw", _raw()["entries"], ids=lambda e: f"xid{e['xid']}")
def test_every_shipped_entry_loads(raw: dict[str, Any]) -> None:
    entry = CATALOG.lookup(raw["xid"])
    assert entry.bucket == raw["bucket"]
    assert entry.severity in (Status.OK, Status.WARN, Status.CRITICAL)
    assert entry.fault_class == f"gpu.xid.{raw['xid']}"


@pytest.mark.parametrize("xid", REQUIRED_XIDS)
def test_required_xids_are_covered(xid: int) -> None:
    assert xid in CATALOG.entries


@pytest.mark.parametrize(
    ("xid", "bucket", "recommendation", "status"),
    [
        (8, "RESTART_APP", "restart_app", Status.WARN),
        (13, "RESTART_APP", "restart_app", Status.WARN),
        (31, "RESTART_APP", "restart_app", Status.WARN),
        (43, "IGNORE", "none", Status.OK),
        (48, "WORKFLOW_XID_48", "gpu_reset", Status.CRITICAL),
        (54, "CHECK_MECHANICALS", "rma", Status.CRITICAL),
        (61, "CONTACT_SUPPORT", "rma", Status.CRITICAL),
        (63, "IGNORE", "none", Status.OK),
        (64, "RESET_GPU", "gpu_reset", Status.CRITICAL),
        (79, "RESTART_BM", "reboot", Status.CRITICAL),
        (94, "RESTART_APP", "restart_app", Status.WARN),
        (95, "RESET_GPU", "gpu_reset", Status.CRITICAL),
        (119, "RESET_GPU", "gpu_reset", Status.CRITICAL),
    ],
)
def test_bucket_decides_recommendation_and_status(
    xid: int, bucket: str, recommendation: str, status: Status
) -> None:
    entry = CATALOG.lookup(xid)
    assert (entry.bucket, entry.recommendation, entry.severity) == (bucket, recommendation, status)


# NVIDIA's Resolution Bucket (Immediate Action) for every XID Medic lists, as the catalog page
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Ampere and newer) gives it:
# a wrong bucket in xid_catalog.json fails here, not in a node's drain.
NVIDIA_BUCKETS = {
    **dict.fromkeys((8, 13, 31, 32, 68, 69, 94), "RESTART_APP"),
    **dict.fromkeys((14, 43, 63, 92, 121, 137), "IGNORE"),
    **dict.fromkeys(
        (46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158), "RESET_GPU"
    ),
    **dict.fromkeys(range(144, 151), "WORKFLOW_NVLINK5_ERR"),
    45: "WORKFLOW_XID_45",
    48: "WORKFLOW_XID_48",
    54: "CHECK_MECHANICALS",
    61: "CONTACT_SUPPORT",
    74: "WORKFLOW_NVLINK_ERR",
    78: "UPDATE_SWFW",
    79: "RESTART_BM",
    151: "RESTART_VM",
    154: "XID_154",
}


def test_every_listed_xid_has_nvidias_bucket() -> None:
    assert set(CATALOG.entries) == set(NVIDIA_BUCKETS)
    assert {x: e.bucket for x, e in CATALOG.entries.items()} == NVIDIA_BUCKETS


def test_restart_app_bucket_restarts_the_app_and_never_drains() -> None:
    for entry in CATALOG.entries.values():
        if entry.bucket == "RESTART_APP":
            assert (entry.recommendation, entry.severity) == ("restart_app", Status.WARN)


def test_xid_94_restarts_the_app_and_names_no_follow_up() -> None:
    """NVIDIA's immediate action for a contained error is RESTART_APP; the pending row remap
    it leaves is measured (gpu_remapped_rows), not assumed by a follow-up."""
    entry = CATALOG.lookup(94)
    assert (entry.recommendation, entry.follow_up) == ("restart_app", "")
    assert "when convenient" not in entry.note
    assert all(not e.follow_up for e in CATALOG.entries.values())


def test_recommendations_are_the_one_vocabulary() -> None:
    assert tuple(r.value for r in Recommendation) == xid_module.RECOMMENDATIONS


def test_no_restart_app_or_ignore_entry_drains() -> None:
    for entry in CATALOG.entries.values():
        if entry.bucket in ("RESTART_APP", "IGNORE"):
            assert not entry.drains, entry.xid


def test_unknown_xid_is_warn_with_bucket_unknown() -> None:
    entry = CATALOG.lookup(9999)
    assert (entry.bucket, entry.severity, entry.recommendation) == ("UNKNOWN", Status.WARN, "none")


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d["entries"][0].update(bucket="REBOOT_PLEASE"), "entry 0 (XID 8): bucket"),
        (lambda d: d["entries"][1].update(severity="FATAL"), "entry 1 (XID 13): status"),
        (lambda d: d["entries"][2].pop("mnemonic"), "entry 2 (XID 14): missing mnemonic"),
        (lambda d: d["entries"][3].update(xid=-1), "xid -1 is not a positive integer"),
        (lambda d: d["entries"][4].update(colour="red"), "unknown keys ['colour']"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), "XID 8 listed twice"),
        (lambda d: d["buckets"]["RESET_GPU"].update(recommendation="pray"), "bucket RESET_GPU"),
        (lambda d: d["entries"][0].update(follow_up="later"), "recommendation 'later'"),
    ],
)
def test_invalid_catalog_names_the_entry(mutate: Any, fragment: str) -> None:
    data = copy.deepcopy(_raw())
    mutate(data)
    with pytest.raises(CatalogError, match=r"xid_catalog\.json") as info:
        parse_catalog(data)
    assert fragment in str(info.value)


def test_invalid_json_is_a_catalog_error() -> None:
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_catalog("{")


# --- kernel log -------------------------------------------------------------------------------


def test_fallen_off_the_bus_line() -> None:
    x = parse_xid_message(
        "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    )
    assert x is not None
    assert (x.xid, x.pci, x.pid, x.process) == (79, "0000:18:00", 1234, "python")
    assert x.text == "GPU has fallen off the bus."


def test_older_form_without_pid() -> None:
    x = parse_xid_message(
        "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0):"
        " Out Of Range Address"
    )
    assert x is not None
    assert (x.xid, x.pci, x.pid, x.process) == (13, "0000:3b:00", None, None)
    assert x.text.startswith("Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)")


def test_unknown_pid_and_no_pci_prefix() -> None:
    x = parse_xid_message("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Ch 1")
    assert x is not None and (x.pid, x.process, x.text) == (None, None, "Ch 1")
    y = parse_xid_message("NVRM: Xid (0000:03:00): 14, Channel 00000001")
    assert y is not None and (y.xid, y.pci) == (14, "0000:03:00")


def test_not_an_xid_line() -> None:
    assert parse_xid_message("NVRM: GPU at 0000:18:00.0 has fallen off the bus.") is None
    assert parse_xid_message("mlx5_core 0000:18:00.1: firmware version: 28.39.1002") is None


def test_fixture_records() -> None:
    batch = read_since(FIXTURES / "nvrm_xid.txt")
    assert batch.malformed == 0
    xids = xids_from_records(batch.records)
    assert [(x.seq, x.xid, x.pci) for x in xids] == [
        (1002, 79, "0000:18:00"),
        (1004, 13, "0000:3b:00"),
        (1005, 13, "0000:2a:00"),
        (1006, 63, "0000:9a:00"),
        (1007, 14, "0000:03:00"),
        (1009, 48, "0000:5d:00"),
    ]
    assert xids[0].timestamp_us == 5_100_000
    assert (xids[3].pid, xids[3].process) == (1896, None)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("00000000:18:00.0", "0000:18:00"),
        ("0000:18:00.0", "0000:18:00"),
        ("PCI:0000:2A:00", "0000:2a:00"),
        ("0001:db:00", "0001:db:00"),
        ("18:00.0", "0000:18:00"),
    ],
)
def test_pci_key(text: str, key: str) -> None:
    assert pci_key(text) == key


def test_normalize_pci_bus_id() -> None:
    assert normalize_pci_bus_id("00000000:2A:00.0") == "0000:2a:00.0"
    assert normalize_pci_bus_id("0000:2a:00") == "0000:2a:00.0"
    with pytest.raises(ValueError, match="not a PCI bus id"):
        pci_key("banana")


# --- the buffer -----------------------------------------------------------------------------


def test_buffer_merges_the_same_xid_from_both_sources() -> None:
    buffer = XidBuffer(merge_seconds=5)
    first = buffer.add(79, 0, source="nvml", monotonic=100.0)
    merged = buffer.add(79, 0, source="kmsg", monotonic=101.0, pci="0000:18:00", pid=7)
    assert merged.seq == first.seq and merged.sources == ("nvml", "kmsg")
    assert merged.pci == "0000:18:00" and merged.pid == 7
    assert len(buffer.records()) == 1
    buffer.add(79, 0, source="nvml", monotonic=102.0)  # a second report from one source
    buffer.add(79, 0, source="kmsg", monotonic=200.0)  # too late to be the same
    buffer.add(79, 1, source="kmsg", monotonic=100.0)  # another GPU
    assert len(buffer.records()) == 4


def test_buffer_clear_by_gpu_and_time() -> None:
    buffer = XidBuffer()
    for gpu, t in ((0, 1.0), (0, 5.0), (1, 1.0)):
        buffer.add(48, gpu, source="nvml", monotonic=t)
    assert buffer.clear(0, before=3.0) == 1
    assert [(r.gpu, r.monotonic) for r in buffer.records()] == [(0, 5.0), (1, 1.0)]
    assert buffer.clear() == 2 and buffer.records() == ()
    assert buffer.last_seq == 3


def test_buffer_keeps_maxlen() -> None:
    buffer = XidBuffer(maxlen=3)
    for i in range(5):
        buffer.add(13, 0, source="nvml", monotonic=float(i * 100))
    assert [r.seq for r in buffer.records()] == [3, 4, 5]
