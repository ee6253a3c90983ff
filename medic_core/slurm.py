"""Medic's one interface to Slurm: read nodes and jobs, drain, resume, reboot, requeue, hold,
release, comment. `CliSlurm` reads the node table with `sinfo --json`, one node with
`scontrol -o show node NAME` (22.05's `sinfo --json` ignores -n and it has no `scontrol
--json`), jobs with `squeue --json`, and writes through `scontrol`; every call is an argv list
through medic_core.proc with a timeout, and a failure raises SlurmError carrying Slurm's own
one-line message.

Slurm's JSON layout changes between releases (22.05's openapi/v0.0.38, then data_parser
v0.0.39 to v0.0.45, 23.02 to 26.05): `meta` says which one a document uses and a parser per
layout reads it; docs/slurm-client.md says what differs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from medic_core import proc
from medic_core.hostlist import expand_hostlist as expand_hostlist  # re-exported
from medic_core.slurm_clock import parse_sdiag_time

log = logging.getLogger("medic.slurm")
DEFAULT_BIN_DIRS = (Path("/usr/bin"), Path("/usr/local/bin"), Path("/opt/slurm/bin"))
# ':'-separated directories searched before DEFAULT_BIN_DIRS (cli/lab/debian_root.py's).
BIN_DIRS_ENV = "MEDIC_SLURM_BIN"
DEFAULT_TIMEOUT = 15.0

# Base node states; every other word in a node's state is a flag (DRAIN, REBOOT_ISSUED, ...).
NODE_BASE_STATES = frozenset(
    {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "END"})  # fmt: skip
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
JOB_BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})  # fmt: skip
FINAL_JOB_STATES = JOB_BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"}
# 22.05 prints one job state word and lets these flags win over the base state (Slurm's
# job_state_string()); newer layouts list base and flags, so we pick the same word.
_JOB_FLAG_PRECEDENCE = (
    "COMPLETING", "CONFIGURING", "RESIZING", "RESV_DEL_HOLD", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED",
)  # fmt: skip
NEXT_STATES = ("RESUME", "DOWN")


class SlurmError(RuntimeError):
    """A Slurm command failed or printed what Medic cannot read; the message is one line."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # base state, upper case: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, REBOOT_REQUESTED, NOT_RESPONDING, ...
    reason: str = ""
    reason_user: str = ""
    partitions: tuple[str, ...] = ()
    reason_time: int = 0  # epoch seconds the reason was set; 0 without a reason
    gres: str = ""  # "gpu:8", as Slurm prints it
    gres_used: str = ""
    boot_time: int = 0

    @property
    def states(self) -> frozenset[str]:
        """Base state and flags together, e.g. {"IDLE", "DRAIN"}."""
        return self.flags | {self.state}

    @property
    def drained(self) -> bool:
        """DRAIN is set: DRAINING while jobs run, DRAINED once idle."""
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return "DOWN" in self.states

    @property
    def reboot_pending(self) -> bool:
        return bool(REBOOT_FLAGS & self.flags)


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    user: str
    state: str  # RUNNING, PENDING, COMPLETING, ... (22.05's single word)
    reason: str  # state_reason: None, JobHeldUser, launch_failed_requeued_held, ...
    nodes: str  # Slurm's host list, e.g. "n[1-3]"; "" while pending
    requeue: bool
    restart_count: int
    comment: str = ""
    admin_comment: str = ""
    required_nodes: str = ""  # what `-w` asked for, as a host list; "" for none
    partition: str = ""
    description: str = ""  # state_description: "launch failed requeued held", ...
    flags: frozenset[str] = frozenset()  # the job state's flags in newer layouts
    # The GPU indices the job holds on each of its nodes (`gres_detail`, "gpu:4(IDX:0-3)"
    # per node in host-list order); a node missing here: not known (no GRES, an odd entry).
    gpus_by_node: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @property
    def node_names(self) -> list[str]:
        return expand_hostlist(self.nodes)

    @property
    def held(self) -> bool:
        return self.reason in ("JobHeldUser", "JobHeldAdmin") or "held" in self.description


class SlurmClient(Protocol):
    """What Medic needs from Slurm. `CliSlurm` implements it with Slurm's commands."""

    def nodes(self) -> list[NodeInfo]: ...

    def node(self, name: str) -> NodeInfo | None:
        """One node's record (None: no such node); the same fields `nodes()` gives it."""
        ...

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]: ...

    def jobs_on(self, node: str) -> list[JobInfo]:
        """Jobs not yet finished that hold `node` (running, completing, suspended)."""
        ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        """`scontrol reboot ASAP nextstate=... reason=... node`: drains, reboots when idle."""
        ...

    def requeue(self, job_id: str) -> None: ...

    def release(self, job_id: str) -> None: ...

    def hold(self, job_id: str) -> None: ...

    def start_now(self, job_id: str) -> None:
        """Clear the BeginTime Slurm puts on a requeued job (cred_expire + 1 s)."""
        ...

    def controller_time(self) -> int:
        """slurmctld's clock in whole seconds: what it stamps credentials with."""
        ...

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """The job's AdminComment (not Comment, which belongs to the user and carries
        the `medic:resilient=N` tag)."""
        ...


# --- parsing ---------------------------------------------------------------------------------

LEGACY = "v0.0.38"  # Slurm 22.05
SUPPORTED_LAYOUTS = (
    LEGACY, "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45",
)  # fmt: skip


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"{what}: not JSON ({exc})") from exc
    except RecursionError:
        raise SlurmError(f"{what}: JSON nested too deeply to read") from None
    if not isinstance(doc, dict):
        raise SlurmError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    return doc


def layout_of(doc: Mapping[str, Any], what: str) -> str:
    """The JSON layout `meta` reports: "v0.0.38" for 22.05 (meta.plugin.type
    "openapi/v0.0.38"), meta.plugin.data_parser's version from 23.02 on. Unknown -> SlurmError."""
    meta = _mapping(doc.get("meta"))
    plugin = _mapping(meta.get("plugin") or meta.get("plugins"))
    slurm = _mapping(meta.get("Slurm") or meta.get("slurm"))
    release = _text(slurm.get("release") or "unknown release")
    found = ""
    for key in ("data_parser", "type"):
        match = re.search(r"v0\.0\.\d+", str(plugin.get(key) or ""))
        if match:
            found = match.group(0)
            break
    if not found:
        raise SlurmError(f"{what}: no layout version in meta.plugin (Slurm {release})")
    if found not in SUPPORTED_LAYOUTS:
        raise SlurmError(
            f"{what}: unsupported JSON layout {found} (Slurm {release}); Medic reads "
            f"{SUPPORTED_LAYOUTS[0]} to {SUPPORTED_LAYOUTS[-1]}"
        )
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _number(value: Any) -> int:
    """22.05 prints plain numbers; newer layouts may print {"set": true, "number": n}.
    Anything else (text, a list, a float that is not finite) raises ValueError/TypeError."""
    if isinstance(value, Mapping):
        return _number(value.get("number")) if value.get("set", True) else 0
    if isinstance(value, float):
        return int(value)  # OverflowError/ValueError for inf/nan: a record Medic skips
    if isinstance(value, str):
        value = value.strip()
        if not value.isascii():  # int() also reads "٣" and other digits; Slurm never prints them
            raise ValueError(f"not a number: {value!r}")
    return int(value or 0)


def _text(value: Any) -> str:
    """A string from Slurm as data: never None, and no lone surrogates (a JSON "\\udcff"
    escape) that would fail later when written to the store, a log or a terminal."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def _words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [_text(v).upper() for v in value]
    return [_text(value).upper()] if value else []


def _records(
    doc: Mapping[str, Any],
    key: str,
    parse: Callable[[Mapping[str, Any]], Any],
    what: str,
) -> list[Any]:
    """Every record of doc[key] that parses; one that does not (a user's text in a shape
    Medic cannot read) is skipped and logged in one line, never stopping the others."""
    raw_list = doc.get(key)
    if raw_list is None:  # absent: nothing of that kind (an empty queue is [])
        raw_list = []
    if not isinstance(raw_list, list):
        raise SlurmError(f"{what}: '{key}' is a {type(raw_list).__name__}, expected a list")
    out: list[Any] = []
    skipped: list[str] = []
    for index, raw in enumerate(raw_list):
        try:
            if not isinstance(raw, Mapping):
                raise TypeError(f"a {type(raw).__name__}, not an object")
            out.append(parse(raw))
        except (
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            OverflowError,
            RecursionError,
        ) as exc:
            ident = raw.get("job_id", raw.get("name")) if isinstance(raw, Mapping) else None
            label = f"#{index}" if ident is None else _text(ident)[:64]
            skipped.append(f"{label} ({type(exc).__name__}: {_text(exc)[:120]})")
    if skipped:
        log.warning(
            "%s: skipped %d of %d %s Medic cannot read: %s",
            what,
            len(skipped),
            len(raw_list),
            key,
            "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else ""),
        )
    return out


def _node_legacy(raw: Mapping[str, Any]) -> NodeInfo:
    state = _text(raw.get("state") or "unknown").upper()
    return _node(raw, state, frozenset(_words(raw.get("state_flags"))))


def _node(raw: Mapping[str, Any], state: str, flags: frozenset[str]) -> NodeInfo:
    """The fields every layout spells the same; `state` and `flags` as the layout has them."""
    return NodeInfo(
        name=_name(raw["name"]),
        state=state,
        flags=flags,
        reason=_text(raw.get("reason")),
        reason_user=_text(raw.get("reason_set_by_user")),
        partitions=_texts(raw.get("partitions")),
        reason_time=_number(raw.get("reason_changed_at")),
        gres=_text(raw.get("gres")),
        gres_used=_text(raw.get("gres_used")),
        boot_time=_number(raw.get("boot_time")),
    )


def _name(value: Any) -> str:
    """A node name or job id: a non-empty string or number, nothing else."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise ValueError(f"not a name: {value!r}")
    return _text(value)


def _texts(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (_text(value),)
    if not isinstance(value, list):
        return ()
    return tuple(_text(p) for p in value)


def _node_flag_list(raw: Mapping[str, Any]) -> NodeInfo:
    words = _words(raw.get("state"))
    base = next((w for w in words if w in NODE_BASE_STATES), "UNKNOWN")
    return _node(raw, base, frozenset(w for w in words if w != base))


def _job_state(words: list[str]) -> tuple[str, frozenset[str]]:
    base = next((w for w in words if w in JOB_BASE_STATES), words[0] if words else "UNKNOWN")
    flags = frozenset(w for w in words if w != base)
    shown = next((f for f in _JOB_FLAG_PRECEDENCE if f in flags), base)
    return shown, flags


def _job(raw: Mapping[str, Any]) -> JobInfo:
    # The job fields Medic reads kept their names from v0.0.38 to v0.0.45; only job_state
    # (a word, then a list) and restart_cnt (a number, maybe an object) changed shape.
    state, flags = _job_state(_words(raw.get("job_state")))
    return JobInfo(
        job_id=_name(raw["job_id"]),
        name=_text(raw.get("name")),
        user=_text(raw.get("user_name")),
        state=state,
        reason=_text(raw.get("state_reason")),
        nodes=_text(raw.get("nodes")),
        requeue=bool(raw.get("requeue", False)),
        restart_count=_number(raw.get("restart_cnt")),
        comment=_text(raw.get("comment")),
        admin_comment=_text(raw.get("admin_comment")),
        required_nodes=_text(raw.get("required_nodes")),
        partition=_text(raw.get("partition")),
        description=_text(raw.get("state_description")),
        flags=flags,
        gpus_by_node=_gpus_by_node(_text(raw.get("nodes")), raw.get("gres_detail")),
    )


_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]*)?(?::\d+)?\(IDX:([^)]*)\)")
MAX_GPUS_PER_NODE = 1024  # more is not a node's GPUs but an odd answer: not read


def gpu_indices(detail: str) -> frozenset[int] | None:
    """The GPU indices in one node's `gres_detail` entry: "gpu:4(IDX:0-3)",
    "gpu:a100:2(IDX:1,3)", "gpu:2(IDX:0-1),shard:..." -> {0, 1, 2, 3}...; "gpu:0(IDX:N/A)"
    or no gpu word -> frozenset(); None for what cannot be read (the caller assumes the
    job may hold every GPU)."""
    found: set[int] = set()
    for match in _GPU_IDX.finditer(detail):
        for item in match.group(1).split(","):
            low, _, high = item.strip().partition("-")
            if low == "N/A" and not high:
                continue
            if not (
                low.isascii()
                and low.isdigit()
                and (not high or (high.isascii() and high.isdigit()))
            ):
                return None
            first, last = int(low), int(high or low)
            if last < first or last >= MAX_GPUS_PER_NODE:
                return None
            found.update(range(first, last + 1))
    if not found and "gpu" in detail and "IDX:" not in detail:
        return None  # a gpu entry without indices: not readable
    return frozenset(found)


def _gpus_by_node(hostlist: str, detail: object) -> dict[str, frozenset[int]]:
    if not isinstance(detail, list) or not hostlist:
        return {}
    try:
        names = expand_hostlist(hostlist)
    except ValueError:
        return {}
    if len(detail) != len(names):  # not one entry per node: cannot pair them
        return {}
    out = {}
    for name, entry in zip(names, detail, strict=True):
        gpus = gpu_indices(entry) if isinstance(entry, str) else None
        if gpus is not None:
            out[name] = gpus
    return out


NODE_PARSERS: dict[str, Callable[[Mapping[str, Any]], NodeInfo]] = {
    layout: (_node_legacy if layout == LEGACY else _node_flag_list) for layout in SUPPORTED_LAYOUTS
}


def parse_nodes(text: str, what: str = "sinfo --json") -> list[NodeInfo]:
    """Nodes from `sinfo --json` (22.05, 23.02) or `scontrol show nodes --json` (23.02+)."""
    doc = _load(text, what)
    parser = NODE_PARSERS[layout_of(doc, what)]
    if "nodes" not in doc:
        keys = ", ".join(sorted(_text(k)[:40] for k in doc if k != "meta"))
        raise SlurmError(f"{what}: no 'nodes' list (keys: {keys})")
    return list(_records(doc, "nodes", parser, what))


def parse_jobs(text: str, what: str = "squeue --json") -> list[JobInfo]:
    """Jobs from `squeue --json`; a job whose record cannot be read is skipped (and logged),
    the others come through: one user's job name never stops Medic acting on the rest."""
    doc = _load(text, what)
    layout_of(doc, what)
    return list(_records(doc, "jobs", _job, what))


# Names the rest of Medic already imports.
parse_sinfo = parse_nodes
parse_squeue = parse_jobs


# --- one node: `scontrol -o show node NAME` --------------------------------------------------
#
# One line of `Key=Value` pairs in a fixed order (Slurm's slurm_sprint_node_table). Up to the
# reason every value is Slurm's own and holds no " Key=" (OS= holds spaces); from `Reason=` on
# the text is what people typed, spaces, "=" and brackets included:
#
#   NodeName=n1 ... State=MIXED+DRAIN ... Partitions=gpu  BootTime=1795454843 ...
#   CfgTRES=... AllocTRES=... ExtSensorsTemp=n/s Reason=<line 1> [<user>@<time>]
#   [<8 spaces><line 2>...] [Comment=<text>] [Extra=<text>] [ReservationName=<name>] ...
#
# The reason runs to the first " [user@time]" stamp that ends the line or is followed by a
# next reason line or one of the keys Slurm prints after it. Times are read as epoch seconds
# (CliSlurm sets SLURM_TIME_FORMAT=%s) or in Slurm's default local "%Y-%m-%dT%H:%M:%S".

SCONTROL_ENV = {"SLURM_TIME_FORMAT": "%s"}  # times as epoch seconds, whatever the time zone
_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_]*)=")
_AFTER_REASON = "Comment|Extra|InstanceId|InstanceType|ReservationName"
_REASON_OR_AFTER = re.compile(rf"\s(Reason|{_AFTER_REASON})=")
_NEXT_KEY = re.compile(rf" (?:{_AFTER_REASON})=")
_STAMP = re.compile(r" \[([^\[\]]*)@([^\[\]@]*)\]")
_NEXT_LINE = " " * 8  # a reason's next line: the one-line separator plus Slurm's 7-space indent
_NULL = "(null)"  # what Slurm's printf makes of an unset string (Gres=(null))


def _when(text: str) -> int:
    """Epoch seconds from a time scontrol printed; 0 for None/Unknown or what does not read."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return int(text) if len(text) <= 12 else 0
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        return 0


def _reason(text: str) -> tuple[str, str, int]:
    """(reason, user, time) from what follows `Reason=`."""
    for stamp in _STAMP.finditer(text):
        end = stamp.end()
        if end == len(text) or text.startswith(_NEXT_LINE, end) or _NEXT_KEY.match(text, end):
            after = _NEXT_KEY.search(text, end)
            more = text[end : after.start() if after else len(text)]
            lines = [text[: stamp.start()], *(line for line in more.split(_NEXT_LINE) if line)]
            return "\n".join(lines), stamp.group(1), _when(stamp.group(2))
    after = _NEXT_KEY.search(text)  # no stamp: a reason Slurm keeps no time for
    return text[: after.start() if after else len(text)], "", 0


def _value(fields: Mapping[str, str], key: str) -> str:
    value = fields.get(key, "")
    return "" if value == _NULL else value


def parse_node_line(line: str, what: str = "scontrol show node") -> NodeInfo:
    """One node from one line of `scontrol -o [-d] show node`; SlurmError if it has no
    NodeName= or State=. Fields Medic does not need are not checked."""
    line = _text(line).rstrip("\n")
    if not line.startswith("NodeName="):
        raise SlurmError(f"{what}: not a node record: {line[:80]!r}")
    anchor = line.find(" CfgTRES=")  # Slurm's own TRES text: nothing typed before the reason
    tail = _REASON_OR_AFTER.search(line, max(anchor, 0))
    head = line[: tail.start()] if tail else line
    keys = list(_KEY.finditer(head))
    fields: dict[str, str] = {}
    for key, following in zip(keys, [*keys[1:], None], strict=True):
        value = head[key.end() : following.start() if following else len(head)]
        fields.setdefault(key.group(1), value.strip(" "))
    name = fields.get("NodeName", "")
    if not name or " " in name:
        raise SlurmError(f"{what}: no node name in {line[:80]!r}")
    words = [w for w in fields.get("State", "").upper().split("+") if w]
    if not words:
        raise SlurmError(f"{what}: {name[:64]}: no State= in its record")
    flags = {w.rstrip("*") for w in words}
    if words[0].endswith("*"):  # sinfo's shorthand for NOT_RESPONDING, if Slurm ever prints it
        flags.add("NOT_RESPONDING")
    base = next((w for w in flags if w in NODE_BASE_STATES), "UNKNOWN")
    reason, user, when = ("", "", 0)
    if tail and tail.group(1) == "Reason":
        reason, user, when = _reason(line[tail.end() :])
    return NodeInfo(
        name=name,
        state=base,
        flags=frozenset(flags - {base}),
        reason=reason,
        reason_user=user,
        partitions=tuple(p for p in _value(fields, "Partitions").split(",") if p),
        reason_time=when,
        gres=_value(fields, "Gres"),
        gres_used=_value(fields, "GresUsed"),
        boot_time=_when(fields.get("BootTime", "")),
    )


def parse_scontrol_node(text: str, name: str, what: str = "scontrol show node") -> NodeInfo | None:
    """The record of node `name` in `scontrol -o show node` output (None: not in it)."""
    # Records end at "\n" only: str.splitlines() would also cut at \x85 or U+2028 in a reason.
    lines = [line for line in text.split("\n") if line.startswith("NodeName=")]
    if not lines:
        first = text.strip().split("\n")[0] if text.strip() else "nothing"
        raise SlurmError(f"{what} {name}: no node record in its output: {_text(first)[:80]!r}")
    for line in lines:
        if line.startswith(f"NodeName={name} ") or line == f"NodeName={name}":
            return parse_node_line(line, what)
    return None


def _holds(job: JobInfo, node: str) -> bool:
    """`node` is in the job's host list; a list Medic cannot read is logged, not raised."""
    if job.nodes == node:
        return True
    try:
        return node in job.node_names
    except ValueError as exc:
        log.warning("job %s: host list %r unreadable (%s); not counted", job.job_id, job.nodes, exc)
        return False


# --- the CLI backend -------------------------------------------------------------------------


class CliSlurm:
    """`SlurmClient` over Slurm's commands. Hooks get no PATH: binaries are looked up in
    `bin_dirs`. `env` is the whole environment of every command (HealthCheckProgram gets no
    SLURM_CONF: the caller puts it there); None inherits this process's environment."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        bin_dirs: Iterable[Path] | None = None,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.timeout = timeout
        first = [Path(d) for d in os.environ.get(BIN_DIRS_ENV, "").split(":") if d]
        self.bin_dirs = tuple(Path(d) for d in (bin_dirs or (*first, *DEFAULT_BIN_DIRS)))
        self._binaries: dict[str, str] = {}
        # From 23.11 `sinfo --json` groups nodes by state; we then ask scontrol instead.
        self._nodes_from_scontrol = False

    def _binary(self, name: str) -> str:
        if name not in self._binaries:
            for directory in self.bin_dirs:
                candidate = directory / name
                if candidate.is_file() and os.access(candidate, os.X_OK):
                    self._binaries[name] = str(candidate)
                    break
            else:
                where = ", ".join(str(d) for d in self.bin_dirs)
                raise SlurmError(
                    f"{name} not found in {where}: install slurm-client or set bin_dirs"
                )
        return self._binaries[name]

    def _run(self, name: str, *args: str) -> str:
        result = proc.run([self._binary(name), *args], timeout=self.timeout, env=self.env)
        if not result.ok:
            raise self._failure(f"{name} {' '.join(args[:4])}", result)
        return result.stdout

    @staticmethod
    def _failure(what: str, result: proc.CommandResult) -> SlurmError:
        detail = result.describe_failure()
        last = result.stderr.strip().splitlines()
        if result.timed_out and last:  # e.g. a missing SLURM_CONF is retried for 60 s
            detail += f"; last said: {last[-1]}"
        return SlurmError(f"{what}: {detail}")

    def nodes(self) -> list[NodeInfo]:
        if self._nodes_from_scontrol:
            return parse_nodes(self._run("scontrol", "show", "nodes", "--json"), "scontrol --json")
        text = self._run("sinfo", "--json")
        doc = _load(text, "sinfo --json")
        if "nodes" not in doc and "sinfo" in doc:
            layout_of(doc, "sinfo --json")
            self._nodes_from_scontrol = True
            return self.nodes()
        return parse_nodes(text, "sinfo --json")

    def node(self, name: str) -> NodeInfo | None:
        # `scontrol -o -d show node NAME`: 22.05's `sinfo --json` ignores -n and there is no
        # `scontrol --json` before 23.02. -d adds GresUsed; SLURM_TIME_FORMAT=%s makes times
        # epoch seconds. NOTE: scontrol still asks slurmctld for the whole node table
        # (REQUEST_NODE_INFO) and picks the node itself: the saving is the JSON of every
        # node that sinfo would render and we would parse, not slurmctld's RPC
        # (docs/slurm-client.md has the numbers).
        if not name or name.startswith("-") or any(c in name for c in " \t\n,[]"):
            return None  # not one node's name: a host list or an option, never one record
        argv = ["-o", "-d", "show", "node", name]
        result = proc.run(
            [self._binary("scontrol"), *argv],
            timeout=self.timeout,
            env={**self.env, **SCONTROL_ENV},
        )
        if result.returncode == 1 and result.stdout.strip() == f"Node {name} not found":
            return None
        if not result.ok:
            raise self._failure(f"scontrol show node {name}", result)
        return parse_scontrol_node(result.stdout, name)

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]:
        # 22.05's `squeue --json` ignores --jobs and --nodelist (it prints every job), and
        # newer releases fail on an unknown id: filter here instead.
        found = parse_jobs(self._run("squeue", "--json"))
        if ids is None:
            return found
        wanted = {str(i) for i in ids}
        return [j for j in found if j.job_id in wanted]

    def jobs_on(self, node: str) -> list[JobInfo]:
        return [
            j
            for j in self.jobs()
            if j.state not in FINAL_JOB_STATES and j.state != "PENDING" and _holds(j, node)
        ]

    def drain(self, node: str, reason: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=resume")

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        if nextstate.upper() not in NEXT_STATES:
            raise ValueError(f"nextstate must be one of {', '.join(NEXT_STATES)}: {nextstate!r}")
        self._run(
            "scontrol", "reboot", "ASAP", f"nextstate={nextstate.upper()}", f"reason={reason}", node
        )

    def requeue(self, job_id: str) -> None:
        self._run("scontrol", "requeue", job_id)

    def release(self, job_id: str) -> None:
        self._run("scontrol", "release", job_id)

    def hold(self, job_id: str) -> None:
        self._run("scontrol", "hold", job_id)

    def start_now(self, job_id: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", "starttime=now")

    def controller_time(self) -> int:
        second = parse_sdiag_time(self._run("sdiag"))
        if second is None:
            raise SlurmError("sdiag printed no 'sdiag output at ... (SECONDS)' line")
        return second

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", f"admincomment={text}")
