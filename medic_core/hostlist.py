"""Slurm's host list syntax ("n[1-3,7],gpu-a[01-02]-ib"), expanded with a bound: a list
that would expand past MAX_HOSTLIST names is refused before it is expanded."""

from __future__ import annotations

import re
from collections.abc import Iterable


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets: "a[1,3],b" -> ["a[1,3]", "b"]."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


# More names than any cluster has: a host list past this is not Slurm's (a user's `-w`, a
# corrupt answer), and expanding "n[0-99999999999]" would hang whoever asked.
MAX_HOSTLIST = 100_000


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's host list syntax: "n[1-3,7],gpu-a[01-02]-ib" -> n1 n2 n3 n7 gpu-a01-ib ...
    Zero padding is kept; several bracket groups in one name multiply. ValueError for a list
    Medic cannot read, or one of more than MAX_HOSTLIST names."""
    names: list[str] = []
    _expand(hostlist, names)
    return names


def _size(part: str) -> int:
    """How many names `part` ("n[1-4]x[01-02]") expands to, without expanding it."""
    size = 1
    for ranges in re.findall(r"\[([^\]]+)\]", part):
        count = 0
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            count += max(0, int(high) - int(low) + 1) if high else 1
        size *= count
        if size > MAX_HOSTLIST:
            break
    return size


def _expand(hostlist: str, names: list[str]) -> None:
    for part in _split_top(hostlist.strip()):
        match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", part)
        if not match:
            names.append(part)
        elif len(names) + _size(part) > MAX_HOSTLIST:
            raise ValueError(f"host list {part[:40]!r} has more than {MAX_HOSTLIST} names")
        else:
            prefix, ranges, rest = match.groups()
            for item in ranges.split(","):
                low, _, high = item.partition("-")
                if not high:
                    values: Iterable[str] = [low]
                else:
                    first, last = int(low), int(high)
                    if last - first >= MAX_HOSTLIST:
                        raise ValueError(
                            f"host list range [{item[:40]}] has more than {MAX_HOSTLIST} names"
                        )
                    width = len(low) if low.startswith("0") else 0
                    values = (str(v).zfill(width) for v in range(first, last + 1))
                for value in values:
                    _expand(prefix + value + rest, names)
                    if len(names) > MAX_HOSTLIST:
                        raise ValueError(f"host list has more than {MAX_HOSTLIST} names")
        if len(names) > MAX_HOSTLIST:
            raise ValueError(f"host list has more than {MAX_HOSTLIST} names")
