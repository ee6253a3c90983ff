"""The `[hooks]` table: how the Slurm entry points decide and act."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from healthd.checks.base import parse_check_config, setting
from medic_core.config import MedicConfig


@dataclass(frozen=True, kw_only=True)
class HookSettings:
    on_unknown: str = setting(
        "open",
        choices=("open", "closed"),
        doc="launch verdict UNKNOWN (a check could not tell): open runs the job, closed drains",
    )
    launch_budget: float = setting(
        10.0, minimum=0.5, maximum=300, doc="seconds the prolog may spend on a verdict"
    )
    release_held: bool = setting(
        True,
        doc="release a job Slurm held after Medic's prolog refused a node, and make a job"
        " Medic requeued eligible at once instead of after cred_expire and a backfill cycle",
    )
    release_wait: float = setting(
        60.0, minimum=1, maximum=3600, doc="seconds to wait for that job to be held"
    )
    requeue_resilient: bool = setting(
        True, doc="requeue resilient jobs off a node with a fresh CRITICAL fault"
    )
    drain_on_epilog: bool = setting(True, doc="drain a node whose post-job checks are CRITICAL")
    resume: bool = setting(
        True, doc="HealthCheckProgram resumes nodes Medic drained once they check clean"
    )
    slurm_timeout: float = setting(
        15.0, minimum=1, maximum=300, doc="seconds one Slurm command may take"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        return iter(())

    @classmethod
    def from_config(cls, config: MedicConfig) -> HookSettings:
        return parse_check_config(  # type: ignore[type-var]
            cls, config.table("hooks"), prefix="hooks", source=config.source
        )
