"""The dev profile's scaling of property tests (tests/conftest.py): a plain `pytest` runs a
twentieth of each test's examples, at least 10, and never more than the test asks for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from tests.conftest import dev_examples, scale_to_the_profile


def test_dev_examples_is_a_twentieth_with_a_floor_and_never_more_than_written() -> None:
    assert [dev_examples(n) for n in (1, 10, 100, 300, 1_250, 10_000)] == [1, 10, 10, 15, 63, 500]


def test_a_given_test_shared_by_parametrized_cases_is_scaled_once() -> None:
    @settings(max_examples=300, deadline=None)
    @given(st.integers())
    def prop(x: int) -> None:
        pass

    for _case in range(3):  # three parametrized items, one function
        scale_to_the_profile(SimpleNamespace(cls=None, obj=prop))  # type: ignore[arg-type]
    assert prop._hypothesis_internal_use_settings.max_examples == 15  # type: ignore[attr-defined]
    assert prop._hypothesis_internal_use_settings.deadline is None  # type: ignore[attr-defined]


class Machine(RuleBasedStateMachine):
    @rule()
    def step(self) -> None:
        pass


def test_a_state_machines_test_case_is_scaled_and_its_other_settings_kept() -> None:
    case: Any = Machine.TestCase
    case.settings = settings(max_examples=1_250, stateful_step_count=7)
    scale_to_the_profile(SimpleNamespace(cls=case, obj=case.runTest))  # type: ignore[arg-type]
    scale_to_the_profile(SimpleNamespace(cls=case, obj=case.runTest))  # type: ignore[arg-type]
    assert (case.settings.max_examples, case.settings.stateful_step_count) == (63, 7)
