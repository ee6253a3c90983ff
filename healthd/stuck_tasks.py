"""The tasks stuck in uninterruptible sleep (state D) under a proc root: the evidence of a
node Slurm drained for "Kill task failed" (a step's processes that did not die: usually a
hung GPU driver call or file system), kept in the episode before the reboot loses it.

Each task: pid, command name, the kernel function it waits in (`wchan`) and the first lines
of its kernel stack (`stack`, readable by root only; absent elsewhere). Bounded: at most
MAX_TASKS tasks, MAX_STACK_LINES lines each, every file read capped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from healthd.hostfs import read_text

MAX_TASKS = 20
MAX_STACK_LINES = 12
MAX_PIDS = 1_000_000  # a proc tree with more entries is not a kernel's: the rest is not read


def task_state(stat: str) -> tuple[str, str] | None:
    """(command name, state letter) from a /proc/PID/stat line; None when it is not one.
    The name is between the first '(' and the last ')' (it may hold both itself)."""
    start, end = stat.find("("), stat.rfind(")")
    if start < 0 or end < start:
        return None
    rest = stat[end + 1 :].split()
    return (stat[start + 1 : end], rest[0]) if rest else None


def stuck_tasks(proc: Path) -> list[dict[str, Any]]:
    """The D-state tasks under `proc` (the host's /proc), oldest pid first."""
    try:
        pids = sorted(int(n) for n in os.listdir(proc) if n.isdigit())[:MAX_PIDS]
    except OSError:
        return []
    found: list[dict[str, Any]] = []
    for pid in pids:
        try:
            parsed = task_state(read_text(proc, f"{pid}/stat", max_bytes=4096) or "")
        except OSError:  # gone meanwhile, or not readable
            continue
        if parsed is None or parsed[1] != "D":
            continue
        task: dict[str, Any] = {"pid": pid, "comm": parsed[0][:64]}
        for name in ("wchan", "stack"):
            try:
                text = read_text(proc, f"{pid}/{name}", max_bytes=8192)
            except OSError:
                text = None
            if text:
                lines = text.strip().splitlines()
                task[name] = lines[0][:128] if name == "wchan" else lines[:MAX_STACK_LINES]
        found.append(task)
        if len(found) >= MAX_TASKS:
            break
    return found
