"""Where the job runs, as slurmd tells its Prolog: the job's partition, account and
reservation."""

from __future__ import annotations

import os
import re

JOB_WORD = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def job_place() -> dict[str, str]:
    """The job's partition and account as slurmd sets them for the Prolog (the job cannot
    set its own), as the compiled front sends them: 1-64 of letters, digits, _ - and .,
    else "". `[hooks] skip_launch_partitions` and `skip_launch_accounts` match them."""
    place = {}
    for key in ("partition", "account"):
        value = os.environ.get(f"SLURM_JOB_{key.upper()}", "")
        place[key] = value if JOB_WORD.fullmatch(value) else ""
    return place


def job_reservation_env() -> str:
    """The reservation the job runs in (SLURM_JOB_RESERVATION, which slurmd sets for the
    Prolog from the job's credential), or ""."""
    return os.environ.get("SLURM_JOB_RESERVATION", "")
