"""One node through `scontrol -o -d show node NAME` (CliSlurm.node): the one-line parser on
22.05's real output (tests/fixtures/slurm/22.05/scontrol_show_node*.txt, recorded from the lab
with the `sinfo --json` of the same moment), hand-written edge cases marked as such, the
command's errors, and the parser fuzzed: a NodeInfo, None or SlurmError, never another
exception, never a hang."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medic_core.slurm import (
    CliSlurm,
    NodeInfo,
    SlurmError,
    parse_node_line,
    parse_nodes,
    parse_scontrol_node,
)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "22.05"
FUZZ = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def recorded(name: str) -> str:
    """A recorded output decoded as medic_core.proc decodes a command's (bytes that are not
    UTF-8, like the 0xff 0xfe in n1's reason, become U+FFFD)."""
    return (FIXTURES / name).read_bytes().decode("utf-8", errors="replace")


def lines_of(name: str) -> dict[str, str]:
    lines = [line for line in recorded(name).split("\n") if line]  # records end at "\n" only
    return {line.split(" ", 1)[0].removeprefix("NodeName="): line for line in lines}


def by_name(nodes: list[NodeInfo]) -> dict[str, NodeInfo]:
    return {n.name: n for n in nodes}


SNAPSHOTS = [
    ("scontrol_show_node.txt", "sinfo_for_scontrol.json"),
    ("scontrol_show_node_later.txt", "sinfo_for_scontrol_later.json"),
]
ODD = "medic: gpu.xid.79 gpu2 evidence a=b State=IDLE Reason=x [root@1] \ufffd\ufffd tab\there é"
SET_AT = 1795463714  # when the lab's reasons were set (epoch seconds)


# --- real output ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "json"), SNAPSHOTS)
def test_every_recorded_node_reads_as_sinfo_json_reads_it(text: str, json: str) -> None:
    """The same moment through both commands: every field of NodeInfo agrees, the reason's
    odd bytes, '=', brackets and second line included."""
    expected = by_name(parse_nodes(recorded(json)))
    got = {name: parse_node_line(line) for name, line in lines_of(text).items()}
    assert sorted(got) == ["n1", "n2", "n3", "n4", "n5"]
    for name, node in got.items():
        assert node == expected[name], name


def test_the_recorded_states_and_reasons() -> None:
    nodes = {name: parse_node_line(line) for name, line in lines_of(SNAPSHOTS[0][0]).items()}
    n1, n2, n3, n4, n5 = (nodes[f"n{i}"] for i in range(1, 6))
    # Medic's drain of a node running a job, with a reason holding '=', a fake stamp, a fake
    # State= and Reason=, two bytes that are not UTF-8, a tab and an accent.
    assert (n1.state, n1.flags, n1.reason) == ("MIXED", frozenset({"DRAIN"}), ODD)
    assert (n1.reason_user, n1.reason_time, n1.gres, n1.gres_used) == (
        "root", SET_AT, "gpu:8", "gpu:4",
    )  # fmt: skip
    assert (n1.partitions, n1.boot_time) == (("gpu",), 1795454844)
    # An admin's drain, then state=down: DOWN+DRAIN, the admin's reason.
    assert (n2.states, n2.down, n2.drained) == (frozenset({"DOWN", "DRAIN"}), True, True)
    assert n2.reason == "admin: fan replaced, ticket OPS-1234"
    # Typed with quotes (Slurm strips them); a Comment holding "Reason=" and a stamp follows.
    assert n3.reason == "waiting for vendor (ticket=7781)"
    assert (n3.states, n3.reason_time) == (frozenset({"IDLE", "DRAIN"}), SET_AT)
    # A reason of two lines: Slurm prints the second after eight spaces.
    assert n4.reason == "first line\nsecond line"
    assert n5.states == {"IDLE", "DRAIN", "REBOOT_REQUESTED"} and n5.reboot_pending
    assert n5.reason == "medic: test.reboot node contract"


def test_the_later_recording() -> None:
    nodes = {name: parse_node_line(line) for name, line in lines_of(SNAPSHOTS[1][0]).items()}
    # n2 registered again (ReturnToService=2): the admin's DRAIN stays.
    assert nodes["n2"].states == {"IDLE", "DRAIN"}
    # A maintenance reservation's flags; a stopped slurmd (SIGSTOP) stops answering pings.
    assert nodes["n3"].states == {"IDLE", "DRAIN", "MAINTENANCE", "RESERVED"}
    assert nodes["n4"].states == {"IDLE", "DRAIN", "NOT_RESPONDING"}
    # The reboot done with nextstate=DOWN: Slurm appended to the reason, and a new boot time.
    n5 = nodes["n5"]
    assert (n5.states, n5.reason) == (
        frozenset({"DOWN"}), "medic: test.reboot node contract : reboot issued : reboot complete",
    )  # fmt: skip
    assert n5.boot_time == n5.reason_time == SET_AT + 2


@pytest.fixture
def utc() -> Iterator[None]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"  # the lab's time zone when it was recorded
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.usefixtures("utc")
def test_slurms_default_local_times_read_as_the_epoch_ones() -> None:
    """Without SLURM_TIME_FORMAT=%s (what CliSlurm sets) times are local "%FT%T"; recorded
    without -d, so there is no GresUsed."""
    local = lines_of("scontrol_show_node_local_time.txt")
    epoch = lines_of(SNAPSHOTS[0][0])
    assert "BootTime=2026-11-23T17:27:" in local["n1"]
    for name, line in local.items():
        want = parse_node_line(epoch[name])
        got = parse_node_line(line)
        assert got == NodeInfo(**{**want.__dict__, "gres_used": ""}), name


def test_one_node_is_picked_out_of_several_lines() -> None:
    text = recorded(SNAPSHOTS[0][0])
    found = parse_scontrol_node(text, "n4")
    assert found is not None and found.name == "n4"
    assert parse_scontrol_node(text, "n") is None  # a prefix of a name is not the name
    with pytest.raises(SlurmError, match=r"^scontrol show node nope: no node record in its output"):
        parse_scontrol_node("Node nope not found\n", "nope")


# --- hand-written edge cases (not Slurm's recorded output) ------------------------------------

IDLE = lines_of(SNAPSHOTS[0][0])["n2"].split(" Reason=")[0].replace("DOWN+DRAIN", "IDLE")


@pytest.mark.parametrize(
    ("tail", "reason", "user", "when"),
    [
        # Slurm prints no stamp for a reason it keeps no time for: up to the next key.
        (" Reason=no stamp here Comment=c", "no stamp here", "", 0),
        # A directory's fully qualified user name holds '@': the last '@' starts the time.
        (" Reason=r [alice@example.com@1700000000]", "r", "alice@example.com", 1700000000),
        # A stamp-like text inside the reason that nothing valid follows is the reason's.
        (" Reason=see [ops@x] here [root@5] Extra=e", "see [ops@x] here", "root", 5),
        (" Reason=  [root@Unknown]", " ", "root", 0),
        (" Comment=only a comment Reason=fake [bob@2]", "", "", 0),
    ],
)  # fmt: skip
def test_reason_edges(tail: str, reason: str, user: str, when: int) -> None:
    node = parse_node_line(IDLE + tail)
    assert (node.reason, node.reason_user, node.reason_time) == (reason, user, when)
    assert node.states == {"IDLE"}


def test_unset_strings_and_missing_fields() -> None:
    line = IDLE.replace("Gres=gpu:8", "Gres=(null)").replace("Partitions=gpu  ", "")
    node = parse_node_line(re.sub(r"BootTime=\d+", "BootTime=None", line))
    assert (node.gres, node.partitions, node.boot_time) == ("", (), 0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "not a node record: ''"),
        ("Node n1 not found", "not a node record"),
        ("NodeName= Arch=x86_64 State=IDLE", "no node name"),
        ("NodeName=n1 Arch=x86_64 CPUAlloc=0", "n1: no State= in its record"),
    ],
)
def test_lines_that_are_not_a_node_record(line: str, message: str) -> None:
    with pytest.raises(SlurmError, match=re.escape(message)):
        parse_node_line(line)


# --- the command ------------------------------------------------------------------------------


def fake_scontrol(tmp: Path, script: str) -> CliSlurm:
    path = tmp / "scontrol"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return CliSlurm(env={"SLURM_CONF": "/x/slurm.conf"}, bin_dirs=[tmp])


def test_node_runs_scontrol_for_one_node_with_epoch_times(tmp_path: Path) -> None:
    out = FIXTURES / SNAPSHOTS[0][0]
    client = fake_scontrol(
        tmp_path,
        f'echo "$*|$SLURM_TIME_FORMAT|$SLURM_CONF" > {tmp_path / "argv"}\n'
        f'grep "^NodeName=$5 " {out}',
    )
    node = client.node("n3")
    assert node is not None and node.reason == "waiting for vendor (ticket=7781)"
    assert (tmp_path / "argv").read_text() == "-o -d show node n3|%s|/x/slurm.conf\n"


def test_an_unknown_node_is_none_and_other_failures_raise(tmp_path: Path) -> None:
    client = fake_scontrol(tmp_path, 'echo "Node $5 not found"; exit 1')
    assert client.node("nope") is None
    broken = fake_scontrol(tmp_path, 'echo "slurm_load_node error: Unable to contact" >&2; exit 1')
    with pytest.raises(SlurmError) as caught:
        broken.node("n1")
    assert str(caught.value) == (
        "scontrol show node n1: exit 1: slurm_load_node error: Unable to contact"
    )
    empty = fake_scontrol(tmp_path, "exit 0")
    with pytest.raises(SlurmError, match="no node record in its output: 'nothing'"):
        empty.node("n1")


@pytest.mark.parametrize("name", ["", "n[1-2]", "n1,n2", "-d", "n 1"])
def test_what_is_not_one_node_name_is_never_asked(tmp_path: Path, name: str) -> None:
    client = fake_scontrol(tmp_path, f"touch {tmp_path / 'ran'}; exit 1")
    assert client.node(name) is None
    assert not (tmp_path / "ran").exists()


# --- fuzz -------------------------------------------------------------------------------------

REAL_LINES = [line for text, _ in SNAPSHOTS for line in lines_of(text).values()]


def _parse(line: str) -> NodeInfo | None:
    try:
        return parse_node_line(line)
    except SlurmError:
        return None


@FUZZ
@given(text=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_text_is_a_node_or_a_slurm_error(text: str) -> None:
    _parse(text)
    _parse("NodeName=" + text)
    with contextlib.suppress(SlurmError):
        parse_scontrol_node(text, "n1")


@FUZZ
@given(
    which=st.sampled_from(range(len(REAL_LINES))),
    at=st.integers(min_value=0, max_value=4000),
    junk=st.text(max_size=40)
    | st.sampled_from([" Reason=", " [root@1]", " " * 8, " Comment=", " State=DOWN", "(null)"]),
)
def test_junk_anywhere_in_a_real_line(which: int, at: int, junk: str) -> None:
    line = REAL_LINES[which]
    at %= len(line) + 1
    _parse(line[:at] + junk + line[at:])


STAMP_LIKE = re.compile(
    r" \[[^\[\]]*@[^\[\]@]*\]|\s(Comment|Extra|InstanceId|InstanceType|ReservationName)="
)


@FUZZ
@given(
    which=st.sampled_from(range(len(REAL_LINES))),
    reason=st.text(
        st.characters(blacklist_categories=["Cs"], blacklist_characters="\n"), max_size=80
    )
    | st.sampled_from(["a\x85b", "a\u2028b", "a\rb", "x\x1cy", "é\ufffd\t"]),
)
def test_any_reason_leaves_the_rest_alone_and_reads_back(which: int, reason: str) -> None:
    """Whatever text is in the reason, name, state, partitions, gres and boot time are what
    they were; a reason without a stamp-like "[a@b]", eight spaces or a key Slurm prints after
    it comes back exactly."""
    line = REAL_LINES[which]
    before = parse_node_line(line)
    head = line.split(" Reason=", 1)[0] if " Reason=" in line else line
    if " Comment=" in head:
        head = head.split(" Comment=", 1)[0]
    node = parse_scontrol_node(f"{head} Reason={reason} [root@1700000000]\n", before.name)
    assert node is not None
    assert (node.name, node.states, node.partitions, node.gres, node.boot_time) == (
        before.name, before.states, before.partitions, before.gres, before.boot_time,
    )  # fmt: skip
    if not STAMP_LIKE.search(reason + " ") and " " * 8 not in reason:
        assert (node.reason, node.reason_user, node.reason_time) == (reason, "root", 1700000000)


@pytest.mark.parametrize(
    "junk",
    [
        " [" * 200_000,
        " [a@" * 200_000,
        " [a@b]" * 100_000 + "x",
        " Reason=" * 100_000,
        "=" * 500_000,
        " A=" * 200_000,
        "BootTime=" + "9" * 100_000,
    ],
)
def test_huge_adversarial_lines_are_read_in_linear_time(junk: str) -> None:
    line = REAL_LINES[0]
    start = time.monotonic()
    for text in (line + junk, line.replace(" Reason=", " Reason=" + junk, 1), "NodeName=" + junk):
        _parse(text)
    # Linear: well under a second on a quiet machine. Quadratic on these 600 KB lines would
    # take hours, so a bound loose enough for a loaded CI machine still tells them apart.
    assert time.monotonic() - start < 60.0
