"""slurmctld's own clock, in the whole seconds Slurm stamps credentials with.

`sdiag` (open to every user) prints it on its first line: "sdiag output at Sat Nov 28
17:05:01 2026 (1795885501)", the same on 22.05, 24.11 and 26.05 (src/sdiag/sdiag.c).
"""

from __future__ import annotations

import re

_FIRST_LINE = re.compile(r"^sdiag output at [^\n]*\((\d{1,12})\)\s*$", re.MULTILINE)


def parse_sdiag_time(text: str) -> int | None:
    """The controller's epoch second sdiag printed; None when the text has none."""
    found = _FIRST_LINE.search(text[:4096])
    return int(found.group(1)) if found else None
