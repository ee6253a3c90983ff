"""Slurm's commands a sweep (and the spares and maintenance that build on it) needs beyond
the common client's: reservations of one node for Medic's own jobs, and srun for the probe."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from medic_core import proc
from medic_core.slurm import CliSlurm, SlurmError


def invoking_user() -> str:
    """The user this process runs as: the one a reservation for Medic's own job admits."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


class SweepSlurm(CliSlurm):
    """Slurm's commands a sweep needs beyond the common client's."""

    def create_reservation(
        self, name: str, node: str, minutes: int, user: str, flags: Sequence[str] = ()
    ) -> None:
        """`flags`: Slurm's reservation flags, e.g. ("FLEX", "PURGE_COMP=60") (spares)."""
        self._run(
            "scontrol",
            "create",
            "reservation",
            f"reservationname={name}",
            f"nodes={node}",
            "starttime=now",
            f"duration={minutes}",
            f"users={user}",
            *([f"flags={','.join(flags)}"] if flags else []),
        )

    def reservation_exists(self, name: str) -> bool:
        try:
            self._run("scontrol", "show", "reservation", name)
        except SlurmError as exc:
            if "not found" in str(exc):
                return False
            raise
        return True

    def delete_reservation(self, name: str) -> bool:
        """False when it was already gone (expired, or deleted before a crash)."""
        try:
            self._run("scontrol", "delete", f"reservation={name}")
        except SlurmError as exc:
            if not self.reservation_exists(name):
                return False
            raise SlurmError(f"cannot give back {name}: {exc}") from exc
        return True

    def cancel_reservation_jobs(self, name: str) -> None:
        self._run("scancel", f"--reservation={name}")

    def srun(
        self, args: Sequence[str], timeout: float, env: Mapping[str, str]
    ) -> proc.CommandResult:
        return proc.run([self._binary("srun"), *args], timeout=timeout, env=env)
