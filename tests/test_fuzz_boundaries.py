"""Every boundary that reads data from outside, fuzzed (hardening issue, "make the search
systematic"): the configuration loader, checkpoint manifests, kernel log records and the
sysfs/procfs files the host checks read. The property everywhere: a correct result or one
clear line (naming the file or key), never another exception, never a hang.

The Slurm JSON and text, job comments and the restart ledger are fuzzed in
test_slurm_fuzz.py and test_decide.py; webhook answers in test_webhook.py; the journal in
test_journal.py; drain reasons in test_reason_hardening.py."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.lab.cluster import slack
from healthd.checks import load_check_configs, registry
from healthd.checks.base import Check, CheckConfig, CheckContext, Result
from healthd.fixtures import write_host_tree
from healthd.kmsg import format_record, parse_records, select_after
from medic_core.config import KNOWN_TABLES, ConfigError, load_config
from medic_core.hostlist import MAX_HOSTLIST, expand_hostlist
from medic_core.hygiene_settings import HygieneSettings
from medic_core.inventory import FleetSettings
from medic_core.settings import (
    DaemonSettings,
    HookSettings,
    RemediationSettings,
    SweepSettings,
    WebhookTable,
    load_settings,
)
from slurm_hooks.checkpoint import MANIFEST, CheckpointDir, step_name

FUZZ = settings(max_examples=200, derandomize=True, database=None, deadline=None)
T = TypeVar("T")


def _within(seconds: float, fn: Callable[[], T]) -> T:
    """fn(), which must return (or raise) within `seconds` (stretched by MEDIC_LAB_SLACK on a
    loaded machine): a hang fails the example."""
    seconds *= slack()
    box: list[Any] = []

    def body() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller below
            box.append((False, exc))

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no answer within {seconds}s: a hang"
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _one_clear_line(text: str, limit: int = 400) -> None:
    assert "\n" not in text and text.strip() and len(text) <= limit, text[:600]


# --- the configuration loader ----------------------------------------------------------------

TABLE_TYPES: dict[str, type[Any]] = {
    "healthd": DaemonSettings,
    "hooks": HookSettings,
    "remediation": RemediationSettings,
    "sweep": SweepSettings,
    "remediation.webhook": WebhookTable,
    "fleet": FleetSettings,
    "hygiene": HygieneSettings,
}
CHECK_TYPES = {spec.name: spec.config_type for spec in registry()}
OTHER_KEYS = {
    "node": ["host_root", "state_dir", "socket"],
    "store": ["url", "event_retention_days"],
    "slurm": ["conf"],
}


def _keys(config_type: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(config_type)]


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string (\uXXXX escapes included)


toml_scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["nan", "-nan", "+nan", "inf", "-inf", "1e400", "-0.0", "0.5", "1e-400"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(max_size=30).map(_toml_string),
    st.sampled_from(
        [
            '"{gpu}"',
            '"{bogus}"',
            '"{node}"',
            '"{"',
            '"}"',
            '"/var/lib/{node}"',
            '"a?b"',
            '"\\u0000"',
            '"../.."',
            '"https://x"',
            '"http://x"',
            "1979-05-27T07:32:00Z",
            "1979-05-27",
            "07:32:00",
            '""',
        ]
    ),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda v: "[" + ", ".join(v) + "]")
        | st.dictionaries(
            st.sampled_from(["gpu_reset", "reboot", "x", "url"]), inner, max_size=3
        ).map(lambda d: "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}")
    ),
    max_leaves=6,
)


@st.composite
def toml_documents(draw: st.DrawFn) -> str:
    """A medic.toml of a few tables, mostly with the keys Medic knows, any values."""
    lines = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        table = draw(
            st.sampled_from([*TABLE_TYPES, "node", "store", "slurm", "bogus"])
            | st.sampled_from(sorted(CHECK_TYPES)).map(lambda n: f"checks.{n}")
        )
        if table in TABLE_TYPES:
            known = _keys(TABLE_TYPES[table])
        elif table.startswith("checks."):
            known = _keys(CHECK_TYPES[table.removeprefix("checks.")])
        else:
            known = OTHER_KEYS.get(table, [])
        lines.append(f"[{table}]")
        keys = draw(st.lists(st.sampled_from([*known, "bogus"]), max_size=4, unique=True))
        lines += [f"{key} = {draw(toml_values)}" for key in keys]
    return "\n".join(lines) + "\n"


def _validate_all(path: Path) -> None:
    config = load_config(path, environ={"MEDIC_NODE_NAME": "n1"})
    settings_ = load_settings(config)
    checks = load_check_configs(config)
    for table in (
        settings_.healthd,
        settings_.hooks,
        settings_.remediation,
        settings_.sweep,
        FleetSettings.from_config(config),
        *checks.values(),
    ):
        assert dataclasses.is_dataclass(table)
        for f in dataclasses.fields(table):
            value = getattr(table, f.name)
            if isinstance(value, float):
                assert math.isfinite(value), f"{f.name} = {value} passed validation"


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="medic-fuzz-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@settings(FUZZ, max_examples=100)  # each example validates every table and 23 checks
@given(document=toml_documents())
def test_any_medic_toml_is_valid_or_one_config_error(document: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "medic.toml"
        path.write_text(document)
        try:
            _validate_all(path)
        except ConfigError as exc:
            _one_clear_line(str(exc), limit=2000)  # "use one of: <every key>" is long
            assert str(exc).startswith(f"{path}: ")


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_as_medic_toml_are_valid_or_one_config_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "medic.toml"
        path.write_bytes(raw)
        try:
            _validate_all(path)
        except ConfigError as exc:
            _one_clear_line(str(exc), limit=2000)


def test_every_table_medic_knows_is_fuzzed() -> None:
    assert {"node", "store", "slurm", *TABLE_TYPES} >= KNOWN_TABLES - {"checks", "lab"}


# --- checkpoint manifests ----------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["../outside", "/etc/passwd", "w", "", "a/../../b", "9" * 5000]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
MANIFEST_FIELDS = ["format", "step", "time", "job_id", "restart_count", "files"]


def _manifest_with(field: str, value: Any, name: str) -> dict[str, Any]:
    good: dict[str, Any] = {
        "format": 1,
        "step": 1,
        "time": 1.0,
        "job_id": "7",
        "restart_count": 0,
        "files": {"w": {"size": 3, "sha256": None}},
    }
    if field == "files.name":
        good["files"] = {name: {"size": 3}}
    elif field == "files.size":
        good["files"] = {"w": {"size": value}}
    elif field == "files.entry":
        good["files"] = {"w": value}
    else:
        good[field] = value
    return good


@settings(FUZZ, max_examples=150)  # each example makes a checkpoint directory
@given(
    field=st.sampled_from([*MANIFEST_FIELDS, "files.name", "files.size", "files.entry"]),
    value=json_values,
    name=st.text(max_size=20) | st.sampled_from(["../x", "/etc/hostname", "a/../../x", "w/"]),
)
def test_any_manifest_is_a_checkpoint_or_skipped(
    scratch: Path, field: str, value: Any, name: str
) -> None:
    """A manifest (hand-edited, torn, written by something else) is a checkpoint that
    matches its files or is skipped; never an exception, never a file outside the step."""
    root = Path(tempfile.mkdtemp(dir=scratch))
    step = root / step_name(1)
    step.mkdir()
    (step / "w").write_bytes(b"abc")
    (root / "x").write_bytes(b"abc")  # what a manifest naming "../x" would point at
    (step / MANIFEST).write_text(json.dumps(_manifest_with(field, value, name)))
    ckpt = CheckpointDir(root)
    found = _within(5, lambda: ckpt.load(step, verify_hashes=True))
    assert _within(5, ckpt.latest) == found
    if found is not None:
        for file in found.files:
            resolved = (step / file).resolve()
            assert resolved.is_relative_to(step.resolve()), f"{file!r} escapes the checkpoint"
    ckpt.prune(keep=1)  # a bad one is removed, a good one kept; neither raises


@FUZZ
@given(raw=st.binary(max_size=300))
def test_any_bytes_as_a_manifest_are_skipped(scratch: Path, raw: bytes) -> None:
    root = Path(tempfile.mkdtemp(dir=scratch))
    step = root / step_name(2)
    step.mkdir()
    (step / MANIFEST).write_bytes(raw)
    assert CheckpointDir(root).latest() is None


def test_a_deeply_nested_manifest_is_skipped(tmp_path: Path) -> None:
    """json.loads raises RecursionError on deep nesting, which escaped `latest()`."""
    step = tmp_path / step_name(3)
    step.mkdir()
    (step / MANIFEST).write_text("[" * 200_000 + "]" * 200_000)
    assert CheckpointDir(tmp_path).latest() is None


def test_a_manifest_naming_a_file_outside_its_step_is_skipped(tmp_path: Path) -> None:
    """Before, "../x" (or an absolute name) made a checkpoint of files that are not in it."""
    step = tmp_path / step_name(4)
    step.mkdir()
    (tmp_path / "x").write_bytes(b"abc")
    for name in ("../x", str(tmp_path / "x")):
        manifest = _manifest_with("files.name", None, name) | {"step": 4}
        (step / MANIFEST).write_text(json.dumps(manifest))
        assert CheckpointDir(tmp_path).latest() is None


def test_an_infinite_size_in_a_manifest_is_skipped(tmp_path: Path) -> None:
    """JSON `Infinity` (which json.loads accepts) made int() raise OverflowError."""
    step = tmp_path / step_name(5)
    step.mkdir()
    (step / "w").write_bytes(b"abc")
    (step / MANIFEST).write_text(
        json.dumps(_manifest_with("files.size", float("inf"), "")).replace('"step": 1', '"step": 5')
    )
    assert CheckpointDir(tmp_path).latest() is None


# --- kernel log records ------------------------------------------------------------------------

kmsg_lines = st.one_of(
    st.text(max_size=120),
    st.builds(
        lambda p, s, t, flags, msg: f"{p},{s},{t},{flags};{msg}",
        st.integers(min_value=-(2**40), max_value=2**40).map(str) | st.just("9" * 5000),
        st.integers(min_value=-5, max_value=2**64).map(str) | st.just("9" * 5000),
        st.integers(min_value=-(2**64), max_value=2**64),
        st.sampled_from(["-", "c", "+", "", "-,caller=T1"]),
        st.text(max_size=80)
        | st.sampled_from(
            [
                "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.",
                "NVRM: Xid (PCI:0000:18:00): " + "9" * 5000 + ", x",
                "EDAC MC0: 1 CE memory read error",
                "a" * 20000,
            ]
        ),
    ),
    st.builds(lambda k, v: f" {k}={v}", st.text(max_size=10), st.text(max_size=20)),
)


@FUZZ
@given(lines=st.lists(kmsg_lines, max_size=8), after=st.none() | st.integers(-3, 2**64))
def test_any_kernel_log_text_is_records_and_a_count_of_malformed_lines(
    lines: list[str], after: int | None
) -> None:
    text = "\n".join(lines)
    records, malformed = parse_records(text)
    assert malformed <= len(text.split("\n"))
    for record in records:
        assert record.seq >= 0 and 0 <= record.level <= 7
    batch = select_after(records, after, malformed=malformed)
    assert batch.lost >= 0
    assert all(after is None or batch.restarted or r.seq > after for r in batch.records)


def _host_tree() -> Path:
    root = Path(tempfile.mkdtemp(prefix="medic-fuzz-host-"))
    write_host_tree(root)
    return root


HOST = _host_tree()
HOST_CHECKS = ("cpus", "memory", "ib", "kernel_log", "services", "filesystems")
SPECS = {spec.name: spec for spec in registry()}


def _run_host_checks(names: tuple[str, ...]) -> list[Result]:
    """Each check's gather and evaluate on the fuzzed tree, each with a fresh instance (no
    state from an earlier example). A check may refuse a file it cannot read with ValueError
    or OSError, one line naming the file; the runner makes that UNKNOWN."""
    ctx = CheckContext.for_root(HOST)
    results: list[Result] = []
    for name in names:
        spec = SPECS[name]
        check, cfg = spec.create(), spec.default_config()
        try:

            def judge(c: Check[Any, Any] = check, f: CheckConfig = cfg) -> list[Result]:
                return list(c.evaluate(c.gather(ctx, f), f))

            results += _within(2, judge)
        except (ValueError, OSError) as exc:
            _one_clear_line(str(exc))
            assert "/" in str(exc), f"{name}: {exc} does not name the file"
    for result in results:
        _one_clear_line(result.message, limit=2000)
    return results


@FUZZ
@given(
    lines=st.lists(kmsg_lines, max_size=6),
    raw=st.binary(max_size=64),
)
def test_any_dev_kmsg_content_is_judged_within_a_second(lines: list[str], raw: bytes) -> None:
    """The kernel log check over a /dev/kmsg of any content: its rules (regular expressions)
    never take long on a hostile line, and nothing escapes."""
    kmsg = HOST / "dev" / "kmsg"
    before = kmsg.read_bytes()
    try:
        kmsg.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass") + raw)
        _run_host_checks(("kernel_log",))
    finally:
        kmsg.write_bytes(before)


def _sysfs_files() -> list[str]:
    """One file of each kind the host checks read (per port, controller, process: the first)."""
    seen: dict[str, str] = {}
    for path in sorted(HOST.rglob("*")):
        if not path.is_file() or path.name == "kmsg":
            continue
        rel = path.relative_to(HOST).as_posix()
        kind = "".join("N" if c.isdigit() else c for c in rel)
        seen.setdefault(kind, rel)
    return sorted(seen.values())


SYSFS_FILES = _sysfs_files()
hostile_contents = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.sampled_from(
        [
            b"",
            b"-1\n",
            b"0x10\n",
            b"1e400\n",
            b"nan\n",
            b"9" * 5000 + b"\n",
            b"0-99999999999\n",
            b"0-3,5-\n",
            b"\x00\x00",
            b"\xff\xfe",
            b"MemTotal: 99999999999999999999999 kB\n",
            b"MemTotal: -5 kB\n",
            b"4: ACTIVE\n",
            b"400 Gb/sec (4X NDR)\n",
            b"400000 Gb/sec\n",
            b"/dev/x / ext4 rw 0 0\n",
            b"/dev/x /a\\040b ext4 ro 0 0\n",
            b"x " * 3000,
        ]
    ),
)


@settings(FUZZ, max_examples=150)  # each example runs six checks on the tree
@given(rel=st.sampled_from(SYSFS_FILES), content=hostile_contents)
def test_any_sysfs_or_procfs_content_is_a_result_or_one_line(rel: str, content: bytes) -> None:
    """One file of the host tree (a CPU list, meminfo, an EDAC counter, an IB port's state,
    rate or counter, /proc/mounts, a process's stat/comm/cmdline, the boot id) holds anything:
    the host checks answer within 2 s each, results or one line naming the file. Found:
    "0-99999999999" in a CPU list hung the cpus check (it built the whole set)."""
    path = HOST / rel
    before = path.read_bytes()
    try:
        path.write_bytes(content)
        _run_host_checks(HOST_CHECKS)
    finally:
        path.write_bytes(before)


def test_the_sysfs_fuzz_covers_each_kind_of_file() -> None:
    kinds = {rel.split("/")[0] + "/" + rel.split("/")[1] for rel in SYSFS_FILES}
    assert {"sys/class", "sys/devices", "proc/meminfo", "proc/mounts"} <= kinds
    assert any(rel.endswith("/stat") for rel in SYSFS_FILES)
    assert any("infiniband" in rel and rel.endswith("/rate") for rel in SYSFS_FILES)
    assert any("cpu/online" in rel for rel in SYSFS_FILES)


def test_a_kmsg_record_as_the_kernel_prints_it_round_trips() -> None:
    text = format_record(7, "NVRM: Xid (PCI:0000:18:00): 79", fields={"DEVICE": "+pci:x"})
    records, malformed = parse_records(text)
    assert malformed == 0 and records[0].seq == 7 and records[0].fields == {"DEVICE": "+pci:x"}


def test_a_cpu_list_reaching_past_any_kernel_is_unknown_at_once() -> None:
    """ "0-99999999999" in /sys/devices/system/cpu/online built a set of 10^11 ids: the cpus
    check hung (its thread left running past the runner's timeout, eating memory)."""
    online = HOST / "sys/devices/system/cpu/online"
    before = online.read_bytes()
    try:
        online.write_bytes(b"0-99999999999\n")
        (result,) = _run_host_checks(("cpus",))
    finally:
        online.write_bytes(before)
    assert (result.status.value, result.fault_class) == ("UNKNOWN", "check.read_error")
    assert result.message == (
        "sys/devices/system/cpu/online or possible: range '0-99999999999' reaches past id 65536"
    )


def test_an_edac_counter_that_is_not_a_number_names_its_file() -> None:
    counter = HOST / "sys/devices/system/edac/mc/mc0/ce_count"
    before = counter.read_bytes()
    try:
        counter.write_bytes(b"x" * 5000)
        spec = SPECS["memory"]
        with pytest.raises(ValueError) as caught:
            spec.create().gather(CheckContext.for_root(HOST), spec.default_config())
    finally:
        counter.write_bytes(before)
    assert str(caught.value) == (
        "sys/devices/system/edac/mc/mc0/ce_count: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"
        " is not an integer"
    )


# --- Slurm host lists (a job's nodes, a user's -w) -------------------------------------------

hostlist_parts = st.one_of(
    st.text(alphabet="n[]-,0123456789x", max_size=24),
    st.builds(
        lambda p, a, b, rest: f"{p}[{a}-{b}]{rest}",
        st.sampled_from(["n", "gpu-", ""]),
        st.integers(0, 10**12).map(str) | st.sampled_from(["001", "x", ""]),
        st.integers(0, 10**12).map(str) | st.sampled_from(["099", "x", ""]),
        st.sampled_from(["", "-ib", "[1-3]", "[1-100][1-100][1-100]"]),
    ),
)


@FUZZ
@given(parts=st.lists(hostlist_parts, min_size=1, max_size=3))
def test_any_host_list_expands_or_is_one_value_error_at_once(parts: list[str]) -> None:
    """Found: "n[0-99999999999]" (a user's `-w`, read by job_facts) hung the daemon's fault
    response building 10^11 names; nested groups multiply the same way."""
    text = ",".join(parts)
    try:
        names = _within(2, lambda: expand_hostlist(text))
    except ValueError as exc:
        _one_clear_line(str(exc))
    else:
        assert len(names) <= MAX_HOSTLIST


def test_a_host_list_of_every_id_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match=r"host list .n\[0-99999999999\]. has more than"):
        _within(2, lambda: expand_hostlist("n[0-99999999999]"))
    with pytest.raises(
        ValueError, match=r"host list .n\[1-100\]\[1-100\]\[1-100\]. has more than 100000 names"
    ):
        _within(2, lambda: expand_hostlist("n" + "[1-100]" * 3))
    assert expand_hostlist("n[1-3,7],gpu-a[01-02]-ib") == ["n1", "n2", "n3", "n7", "gpu-a01-ib",
                                                          "gpu-a02-ib"]  # fmt: skip
