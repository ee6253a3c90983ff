"""One node's record from `scontrol -o show node NAME`, read into a NodeInfo (22.05's
`sinfo --json` ignores -n and it has no `scontrol --json`).

One line of `Key=Value` pairs in a fixed order (Slurm's slurm_sprint_node_table). Up to the
reason every value is Slurm's own and holds no " Key=" (OS= holds spaces); from `Reason=` on
the text is what people typed, spaces, "=" and brackets included:

  NodeName=n1 ... State=MIXED+DRAIN ... Partitions=gpu  BootTime=1795454843 ...
  CfgTRES=... AllocTRES=... ExtSensorsTemp=n/s Reason=<line 1> [<user>@<time>]
  [<8 spaces><line 2>...] [Comment=<text>] [Extra=<text>] [ReservationName=<name>] ...

The reason runs to the first " [user@time]" stamp that ends the line or is followed by a
next reason line or one of the keys Slurm prints after it. Times are read as epoch seconds
(CliSlurm sets SLURM_TIME_FORMAT=%s) or in Slurm's default local "%Y-%m-%dT%H:%M:%S".
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from medic_core.slurm_json import as_text
from medic_core.slurm_types import NODE_BASE_STATES, NodeInfo, SlurmError

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
    line = as_text(line).rstrip("\n")
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
        raise SlurmError(f"{what} {name}: no node record in its output: {as_text(first)[:80]!r}")
    for line in lines:
        if line.startswith(f"NodeName={name} ") or line == f"NodeName={name}":
            return parse_node_line(line, what)
    return None
