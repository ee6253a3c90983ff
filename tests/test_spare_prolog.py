"""A handed spare judged without its daemon: a job launching in a `medic-spare-<id>`
reservation that is not job <id> is refused in its prolog, fails closed, and never runs
(the spare's daemon, busy or stopped for half a second, once let the user's other job
start there: the front gave up on it and the Python prolog judged the node alone)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from medic_core import proc
from medic_core.settings import HookSettings
from medic_core.spare_names import foreign_spare_run, job_reservation
from remediation.decide import SPARE_REFUSAL, GateDecision
from slurm_hooks import gate
from tests.test_burn_in_gate import (  # noqa: F401  (slow_path: the fixture)
    config_with,
    front_without_daemon,
    slow_path,
)

job_ids = st.from_regex(r"[0-9]{1,9}(_[0-9]{1,4})?", fullmatch=True)


@given(job=job_ids, other=job_ids, name=st.text(max_size=30))
def test_only_another_jobs_spare_reservation_is_foreign(job: str, other: str, name: str) -> None:
    assert not foreign_spare_run(job, job_reservation(job))
    assert foreign_spare_run(job, job_reservation(other)) == (other != job)
    if not name.startswith("medic-spare-"):
        assert not foreign_spare_run(job, name)  # any other reservation, or none


def test_without_a_daemons_answer_a_foreign_spare_run_is_refused_without_checks(
    tmp_path: Path,
    slow_path: dict[str, Any],  # noqa: F811
) -> None:
    config = config_with(tmp_path, "[]")
    settings = HookSettings.from_config(config)
    reply = {"allow": None, "note": "medic-healthd: timed out", "spare": job_reservation("7")}
    assert gate.gate_slow_path(config, settings, "8", reply, time.monotonic() + 5) == 1
    refused: GateDecision = slow_path["refused"]
    assert slow_path["inline"] == 0 and refused.first is not None
    assert refused.first.fault_class == SPARE_REFUSAL and refused.first.target == "job:8"
    # The run the spare was handed to is judged as any job is.
    ok = {"allow": None, "note": "medic-healthd: timed out"}
    assert gate.gate_slow_path(config, settings, "7", ok, time.monotonic() + 5) == 0


def test_the_front_and_the_python_prolog_refuse_another_jobs_spare_with_no_daemon(
    tmp_path: Path,
) -> None:
    front, env = front_without_daemon(tmp_path, "[]")
    refused = proc.run(
        [str(front)], env=env | {"SLURM_JOB_RESERVATION": job_reservation("7")}, timeout=60
    )
    assert refused.returncode == 1, refused.stderr
    assert "handed to another run" in refused.stderr
    # Any other reservation (an admin's) is judged on the node's health alone.
    allowed = proc.run([str(front)], env=env | {"SLURM_JOB_RESERVATION": "maint"}, timeout=60)
    assert allowed.returncode == 0, allowed.stderr
