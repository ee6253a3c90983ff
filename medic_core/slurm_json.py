"""Slurm's JSON, read into NodeInfo and JobInfo: `sinfo --json`, `scontrol show nodes --json`
and `squeue --json`. The layout changes between releases (22.05's openapi/v0.0.38, then
data_parser v0.0.39 to v0.0.45, 23.02 to 26.05): `meta` says which one a document uses and a
parser per layout reads it; docs/slurm-client.md says what differs. A record that does not
read is skipped and logged, never stopping the others.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from medic_core.hostlist import expand_hostlist
from medic_core.slurm_types import (
    JOB_BASE_STATES,
    JOB_FLAG_PRECEDENCE,
    NODE_BASE_STATES,
    JobInfo,
    NodeInfo,
    SlurmError,
)

log = logging.getLogger("medic.slurm")

LEGACY = "v0.0.38"  # Slurm 22.05
SUPPORTED_LAYOUTS = (
    LEGACY, "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45",
)  # fmt: skip


def load_document(text: str, what: str) -> dict[str, Any]:
    """The JSON object `what` printed; SlurmError for anything else."""
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
    release = as_text(slurm.get("release") or "unknown release")
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


def as_text(value: Any) -> str:
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
        return [as_text(v).upper() for v in value]
    return [as_text(value).upper()] if value else []


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
            label = f"#{index}" if ident is None else as_text(ident)[:64]
            skipped.append(f"{label} ({type(exc).__name__}: {as_text(exc)[:120]})")
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
    state = as_text(raw.get("state") or "unknown").upper()
    return _node(raw, state, frozenset(_words(raw.get("state_flags"))))


def _node(raw: Mapping[str, Any], state: str, flags: frozenset[str]) -> NodeInfo:
    """The fields every layout spells the same; `state` and `flags` as the layout has them."""
    return NodeInfo(
        name=_name(raw["name"]),
        state=state,
        flags=flags,
        reason=as_text(raw.get("reason")),
        reason_user=as_text(raw.get("reason_set_by_user")),
        partitions=_texts(raw.get("partitions")),
        reason_time=_number(raw.get("reason_changed_at")),
        gres=as_text(raw.get("gres")),
        gres_used=as_text(raw.get("gres_used")),
        boot_time=_number(raw.get("boot_time")),
    )


def _name(value: Any) -> str:
    """A node name or job id: a non-empty string or number, nothing else."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise ValueError(f"not a name: {value!r}")
    return as_text(value)


def _texts(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (as_text(value),)
    if not isinstance(value, list):
        return ()
    return tuple(as_text(p) for p in value)


def _node_flag_list(raw: Mapping[str, Any]) -> NodeInfo:
    words = _words(raw.get("state"))
    base = next((w for w in words if w in NODE_BASE_STATES), "UNKNOWN")
    return _node(raw, base, frozenset(w for w in words if w != base))


def _job_state(words: list[str]) -> tuple[str, frozenset[str]]:
    base = next((w for w in words if w in JOB_BASE_STATES), words[0] if words else "UNKNOWN")
    flags = frozenset(w for w in words if w != base)
    shown = next((f for f in JOB_FLAG_PRECEDENCE if f in flags), base)
    return shown, flags


def _job(raw: Mapping[str, Any]) -> JobInfo:
    # The job fields Medic reads kept their names from v0.0.38 to v0.0.45; only job_state
    # (a word, then a list) and restart_cnt (a number, maybe an object) changed shape.
    state, flags = _job_state(_words(raw.get("job_state")))
    return JobInfo(
        job_id=_name(raw["job_id"]),
        name=as_text(raw.get("name")),
        user=as_text(raw.get("user_name")),
        state=state,
        reason=as_text(raw.get("state_reason")),
        nodes=as_text(raw.get("nodes")),
        requeue=bool(raw.get("requeue", False)),
        restart_count=_number(raw.get("restart_cnt")),
        comment=as_text(raw.get("comment")),
        admin_comment=as_text(raw.get("admin_comment")),
        required_nodes=as_text(raw.get("required_nodes")),
        partition=as_text(raw.get("partition")),
        description=as_text(raw.get("state_description")),
        flags=flags,
        gpus_by_node=_gpus_by_node(as_text(raw.get("nodes")), raw.get("gres_detail")),
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
    doc = load_document(text, what)
    parser = NODE_PARSERS[layout_of(doc, what)]
    if "nodes" not in doc:
        keys = ", ".join(sorted(as_text(k)[:40] for k in doc if k != "meta"))
        raise SlurmError(f"{what}: no 'nodes' list (keys: {keys})")
    return list(_records(doc, "nodes", parser, what))


def parse_jobs(text: str, what: str = "squeue --json") -> list[JobInfo]:
    """Jobs from `squeue --json`; a job whose record cannot be read is skipped (and logged),
    the others come through: one user's job name never stops Medic acting on the rest."""
    doc = load_document(text, what)
    layout_of(doc, what)
    return list(_records(doc, "jobs", _job, what))


# Names the rest of Medic already imports.
parse_sinfo = parse_nodes
parse_squeue = parse_jobs
