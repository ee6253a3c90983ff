"""The recommendation -> first rung map: every word of the one vocabulary has a rung or an
explicit None, and no host-service or link finding ever reaches a GPU or driver rung."""

from __future__ import annotations

import pytest

from healthd.checks.base import remediation_for
from medic_core.vocabulary import Recommendation
from remediation.policy import FIRST_RUNG, Rung, first_rung


def test_every_recommendation_word_is_mapped() -> None:
    assert set(FIRST_RUNG) == {r.value for r in Recommendation}


@pytest.mark.parametrize(
    ("fault_class", "expected"),
    [
        ("service.down", None),  # munged down: never the driver-reload rung
        ("ib.port.down", None),  # a link: drain and re-check, never reboot then RMA
        ("gpu.xid.94", None),  # restart the app; the node stays in service
    ],
)
def test_service_link_and_app_faults_start_no_repair_rung(
    fault_class: str, expected: Rung | None
) -> None:
    word = {"gpu.xid.94": "restart_app"}.get(fault_class)
    recommendation = word or str(remediation_for(fault_class))
    assert first_rung(fault_class, recommendation) is expected


def test_driver_reload_is_never_a_first_rung() -> None:
    assert Rung.DRIVER_RELOAD not in FIRST_RUNG.values()


def test_an_operator_override_still_wins() -> None:
    assert first_rung("ib.port.down", "recheck", {"ib.port": "reboot"}) is Rung.REBOOT
