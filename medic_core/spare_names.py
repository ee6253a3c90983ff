"""The name of a handed spare's reservation, which the spare's daemon and the prolog read.
A module of its own: the prolog imports it on its fast path."""

from __future__ import annotations

# A hot spare handed to a requeued job is reserved for that job alone: `medic-spare-<id>`.
JOB_RESERVATION_PREFIX = "medic-spare-"


def job_reservation(job_id: str) -> str:
    return f"{JOB_RESERVATION_PREFIX}{job_id}"


def foreign_spare_run(job_id: str, reservation: str) -> bool:
    """A job launching in a handed spare's reservation that was handed to another job (the
    user's other job may name it: Slurm admits it, Medic must not let it run there)."""
    return reservation.startswith(JOB_RESERVATION_PREFIX) and reservation != job_reservation(job_id)
