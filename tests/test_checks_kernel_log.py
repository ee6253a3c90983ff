"""The kernel log: the kmsg reader, the shipped rules, and the check."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from healthd import kmsg
from healthd.checks.base import CheckContext, Kind, Result, Status
from healthd.checks.kernel_log import (
    RULES_FILE,
    KernelLogCheck,
    KernelLogConfig,
    KernelLogObservation,
    RuleError,
    match_records,
    parse_rules,
    shipped_rules,
)
from healthd.fixtures import write_host_tree

SAMPLES = Path(__file__).parent / "fixtures" / "kmsg"
GOOD_RULE = {
    "name": "r",
    "pattern": "boom",
    "fault_class": "kernel.boom",
    "status": "WARN",
    "description": "d",
    "source": "s",
    "match": ["a boom"],
    "no_match": ["quiet"],
}


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def all_sample_records() -> list[kmsg.KmsgRecord]:
    records: list[kmsg.KmsgRecord] = []
    for path in sorted(SAMPLES.glob("*.txt")):
        records += kmsg.parse_records(path.read_text())[0]
    return records


# --- the reader ---


def test_parse_records_with_continuation_lines() -> None:
    records, malformed = kmsg.parse_records(sample("boot_clean.txt"))
    assert malformed == 0
    first = records[0]
    assert (first.seq, first.level, first.facility, first.timestamp_us) == (0, 5, 0, 0)
    pci = next(r for r in records if r.seq == 1502)
    assert pci.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:18:00.0"}
    assert pci.message.startswith("pci 0000:18:00.0: [15b3:1021]")


def test_parse_tolerates_garbage_and_extra_header_fields() -> None:
    text = "not a record\n 6,1,2,-;orphan continuation\n6,7,100,-,caller=T42;hello;world\n"
    records, malformed = kmsg.parse_records(text)
    assert malformed == 2
    assert [(r.seq, r.message) for r in records] == [(7, "hello;world")]


def test_read_since_follows_sequence_numbers(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    shutil.copy(SAMPLES / "hung_task.txt", log)
    batch = kmsg.read_since(log)
    assert [r.seq for r in batch.records] == list(range(5210, 5216)) and batch.last_seq == 5215
    assert kmsg.read_since(log, batch.last_seq).records == ()
    with log.open("a") as fh:
        fh.write(kmsg.format_record(5218, "late line"))
    later = kmsg.read_since(log, 5215)
    assert [r.seq for r in later.records] == [5218] and later.lost == 2


def test_read_since_notices_a_restarted_log(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(kmsg.format_record(3, "fresh boot"))
    batch = kmsg.read_since(log, 9000)
    assert batch.restarted and [r.seq for r in batch.records] == [3]


def test_follower_reads_only_new_records(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(kmsg.format_record(1, "old"))
    follower = kmsg.KmsgFollower(log, start_at_end=True)
    assert follower.poll().records == ()
    with log.open("a") as fh:
        fh.write(kmsg.format_record(2, "new", fields={"SUBSYSTEM": "pci"}))
    (record,) = follower.poll().records
    assert (record.seq, record.message, record.fields) == (2, "new", {"SUBSYSTEM": "pci"})


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="needs a readable /dev/kmsg")
def test_reads_the_real_device_without_blocking() -> None:
    batch = kmsg.read_since(Path("/dev/kmsg"))
    assert batch.malformed == 0
    seqs = [r.seq for r in batch.records]
    assert seqs == sorted(seqs)


# --- the rules ---


def test_every_shipped_rule_has_a_matching_and_a_non_matching_sample() -> None:
    rules = shipped_rules()
    assert len(rules) >= 10
    for rule in rules:
        assert rule.match and rule.no_match, rule.name
        for line in rule.match:
            assert rule.matches(line), (rule.name, line)
        for line in rule.no_match:
            assert not rule.matches(line), (rule.name, line)
        assert rule.fault_class.split(".")[0] == "kernel", rule.name


def test_no_rule_matches_nvidia_xid_lines() -> None:
    records, _ = kmsg.parse_records(sample("xid.txt"))
    assert records and match_records(records, shipped_rules()) == {}


def test_shipped_rules_file_is_the_one_loaded() -> None:
    path = Path(__file__).parents[1] / "healthd" / "checks" / RULES_FILE
    assert [r.name for r in parse_rules(path.read_text())] == [r.name for r in shipped_rules()]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"pattern": "(unclosed"}, "rule 0 ('r'): pattern does not compile"),
        ({"status": "FATAL"}, "status 'FATAL' is not one of WARN, CRITICAL"),
        ({"status": "OK"}, "is not one of"),
        ({"fault_class": "Boom"}, "not dotted lower case"),
        ({"match": ["quiet"]}, "does not match its sample 'quiet'"),
        ({"no_match": ["boom"]}, "matches its counter-sample"),
        ({"severity": "high"}, "unknown keys severity"),
        ({"match": []}, "non-empty list"),
    ],
)
def test_bad_rules_are_rejected_naming_the_rule(change: dict[str, object], words: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_rules(json.dumps([{**GOOD_RULE, **change}]), "custom.json")
    assert str(info.value).startswith("custom.json: rule 0")
    assert words in str(info.value)


def test_missing_keys_and_duplicates_are_rejected() -> None:
    missing = {k: v for k, v in GOOD_RULE.items() if k != "source"}
    with pytest.raises(RuleError, match=r"rule 1 \('r'\): missing source"):
        parse_rules(json.dumps([{**GOOD_RULE, "name": "q"}, missing]))
    with pytest.raises(RuleError, match="duplicate name"):
        parse_rules(json.dumps([GOOD_RULE, GOOD_RULE]))
    with pytest.raises(RuleError, match="not valid JSON"):
        parse_rules("[")


# --- evaluate (pure) and gather ---


def observe(text: str, cfg: KernelLogConfig | None = None) -> KernelLogObservation:
    records, _ = kmsg.parse_records(text)
    rules = tuple(
        r for r in shipped_rules() if r.name not in (cfg or KernelLogConfig()).disabled_rules
    )
    return KernelLogObservation(kmsg.select_after(records, None), rules, True)


def summary(results: list[Result]) -> list[tuple[Status, str | None]]:
    return [(r.status, r.fault_class) for r in results]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("boot_clean.txt", [(Status.OK, None)]),
        ("xid.txt", [(Status.OK, None)]),
        (
            "mce.txt",
            [(Status.WARN, "kernel.mce.corrected"), (Status.CRITICAL, "kernel.mce")],
        ),
        (
            "hung_task.txt",
            [(Status.WARN, "kernel.hung_task"), (Status.WARN, "kernel.nfs_timeout")],
        ),
        ("lustre_evict.txt", [(Status.WARN, "kernel.lustre_evict")]),
        (
            "aer_fatal.txt",
            [(Status.CRITICAL, "kernel.pcie.aer_fatal"), (Status.WARN, "kernel.mlx5.link_down")],
        ),
    ],
)
def test_evaluate_samples(name: str, expected: list[tuple[Status, str | None]]) -> None:
    results = KernelLogCheck.evaluate(observe(sample(name)), KernelLogConfig())
    assert summary(results) == expected
    assert all(r.kind is Kind.EVENT for r in results)


def test_repeated_matches_are_counted_once() -> None:
    (result,) = KernelLogCheck.evaluate(
        observe(sample("mce.txt").replace("Machine check events logged", "CPU 0: nothing")),
        KernelLogConfig(),
    )
    assert result.evidence["count"] == 4 and result.evidence["first_seq"] == 4101
    assert len(result.evidence["samples"]) == 3 and result.message.startswith("4x ")
    assert result.remediation == "drain"


def test_disabled_rules() -> None:
    cfg = KernelLogConfig(disabled_rules=("nfs_not_responding",))
    results = KernelLogCheck.evaluate(observe(sample("hung_task.txt"), cfg), cfg)
    assert summary(results) == [(Status.WARN, "kernel.hung_task")]


def test_gather_follows_the_tree_kmsg(tmp_path: Path) -> None:
    write_host_tree(tmp_path)
    log = tmp_path / "dev/kmsg"
    log.write_text(sample("boot_clean.txt"))
    ctx, cfg = CheckContext.for_root(tmp_path), KernelLogConfig()
    check = KernelLogCheck()
    first = KernelLogCheck.evaluate(check.gather(ctx, cfg), cfg)
    assert summary(first) == [(Status.OK, None)] and first[0].evidence["records"] == 14

    with log.open("a") as fh:
        fh.write(sample("lustre_evict.txt"))
    second = KernelLogCheck.evaluate(check.gather(ctx, cfg), cfg)
    assert summary(second) == [(Status.WARN, "kernel.lustre_evict")]
    assert second[0].evidence["last_seq"] == 6122

    third = KernelLogCheck.evaluate(check.gather(ctx, cfg), cfg)
    assert summary(third) == [(Status.OK, None)] and third[0].evidence["records"] == 0


def test_start_at_end_skips_the_backlog(tmp_path: Path) -> None:
    write_host_tree(tmp_path)
    (tmp_path / "dev/kmsg").write_text(sample("mce.txt"))
    cfg = KernelLogConfig(start_at="end")
    results = KernelLogCheck.evaluate(
        KernelLogCheck().gather(CheckContext.for_root(tmp_path), cfg), cfg
    )
    assert summary(results) == [(Status.OK, None)]


def test_every_sample_file_is_well_formed() -> None:
    for path in SAMPLES.glob("*.txt"):
        _, malformed = kmsg.parse_records(path.read_text())
        assert malformed == 0, path.name
    assert len(all_sample_records()) > 30


# --- news or history: what the daemon acts on ---

OOPS = "2,{seq},{us},-;BUG: unable to handle page fault for address: ffff8881"


def oops_at(seconds_since_boot: float, now: float, first_run: bool) -> Result:
    line = OOPS.format(seq=7, us=int(seconds_since_boot * 1e6))
    records, _ = kmsg.parse_records(line + "\n")
    batch = kmsg.select_after(records, None)
    observation = KernelLogObservation(batch, shipped_rules(), first_run, now, None)
    results = KernelLogCheck.evaluate(observation, KernelLogConfig(history_seconds=600.0))
    [oops] = [r for r in results if r.fault_class]
    return oops


def test_the_first_run_marks_what_is_older_than_history_seconds_as_history() -> None:
    old = oops_at(100.0, now=100.0 + 601, first_run=True)
    assert old.status is Status.CRITICAL and old.evidence["history"] is True
    fresh = oops_at(100.0, now=100.0 + 599, first_run=True)
    assert "history" not in fresh.evidence
    # After the first run every match is new, however old its kernel time reads.
    later = oops_at(100.0, now=100.0 + 86400, first_run=False)
    assert "history" not in later.evidence
