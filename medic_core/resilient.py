"""The `medic:resilient=N` tag in a job's comment: how a job asks Medic to requeue it.

`sbatch --resilient[=N]` (the SPANK plugin and cli_filter.lua in slurm_hooks/spank) and
`medic sbatch --resilient[=N]` both submit the job with --requeue and this tag; N is the
number of automatic restarts Medic may give it. The tag is one whitespace-separated word,
so an existing comment is kept around it.
"""

from __future__ import annotations

import re

# Restarts for a bare --resilient. The plugin is compiled with the same value
# (slurm_hooks/spank/build.py passes -DMEDIC_RESILIENT_DEFAULT).
DEFAULT_RESTARTS = 3
MAX_RESTARTS = 1000
TAG_PREFIX = "medic:resilient="

_TAG = re.compile(r"(?:^|(?<=\s))medic:resilient=(\S*)(?=\s|$)")
_DIGITS = re.compile(r"[0-9]{1,9}", re.ASCII)


def parse_resilient(comment: str | None) -> int | None:
    """Restarts asked for in a job comment, or None when the job is not resilient.

    A malformed tag (`medic:resilient=x`) counts as not resilient: Medic never requeues a
    job on a guess."""
    if not comment:
        return None
    match = _TAG.search(comment)
    if match is None:
        return None
    value = match.group(1)
    # ASCII digits only: str.isdigit() also accepts "²" (which int() then refuses) and
    # "٣" (which int() reads); a comment is user text and must never raise.
    if not _DIGITS.fullmatch(value) or int(value) > MAX_RESTARTS:
        return None
    return int(value)


def tag(comment: str | None, n: int) -> str:
    """`comment` with its resilient tag set to `n` (replacing any), other words kept."""
    check_restarts(n)
    words = [w for w in (comment or "").split() if not w.startswith(TAG_PREFIX)]
    return " ".join([*words, f"{TAG_PREFIX}{n}"])


def check_restarts(n: int) -> int:
    if not 0 <= n <= MAX_RESTARTS:
        raise ValueError(f"--resilient={n}: expected a number of restarts from 0 to {MAX_RESTARTS}")
    return n
