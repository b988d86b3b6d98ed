"""The attainable overlapped round `bench rounds --overlap` reports beside its measured one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mutualrl.bench.overlap import attainable_round_s, work_bound_round_s


def test_sampling_then_the_rest_of_the_update_on_all_threads() -> None:
    # 2 s of sampling on one thread beside an update of 4 s on one thread: half the update is
    # done when sampling ends; the other half takes half of the 2.5 s update on two threads.
    assert attainable_round_s(2.0, 4.0, 2.5) == pytest.approx(2.0 + 0.5 * 2.5)
    # without lending, the update keeps its one thread
    assert attainable_round_s(2.0, 4.0, 2.5, lend=False) == pytest.approx(4.0)


def test_an_update_shorter_than_sampling_hides_behind_it() -> None:
    assert attainable_round_s(3.0, 2.0, 1.2) == 3.0
    assert attainable_round_s(3.0, 2.0, 1.2, lend=False) == 3.0


def test_the_balanced_case_on_two_cores() -> None:
    # phases equal in-process (S = U_all = 1) and an update c times faster on two threads:
    # the best overlapped round is 2 - 1/c, so the ratio to the in-process 2 is 2c / (2c - 1)
    for c in (1.0, 1.7, 2.0):
        ratio = 2.0 / attainable_round_s(1.0, c, 1.0)
        assert ratio == pytest.approx(2 * c / (2 * c - 1))


positive = st.floats(min_value=0.01, max_value=100.0)


def test_lending_is_not_taken_where_all_threads_are_slower() -> None:
    # an oversubscribed machine: the update is slower on two threads than on one
    assert attainable_round_s(1.0, 2.0, 3.0) == pytest.approx(2.0)


@given(positive, positive, st.floats(min_value=0.25, max_value=4.0))
def test_the_bound_is_between_the_phases_and_their_sum(s: float, u_all: float, c: float
                                                      ) -> None:
    u_learner = c * u_all
    best = attainable_round_s(s, u_learner, u_all)
    fastest_update = min(u_all, u_learner)
    assert max(s, fastest_update) - 1e-9 <= best <= s + fastest_update + 1e-9
    assert best <= attainable_round_s(s, u_learner, u_all, lend=False) + 1e-9


def test_no_schedule_beats_the_phases_work_over_the_cores() -> None:
    # sampling 2.0 s on one thread, 1.9 on two; the update 3.6 s on one, 2.0 on two: the
    # least core-seconds are 2.0 + 3.6, over two cores 2.8 s, longer than either phase alone
    assert work_bound_round_s({1: 2.0, 2: 1.9}, {1: 3.6, 2: 2.0}, 2) == pytest.approx(2.8)
    # a phase that is slower than the work's share bounds the round by itself
    assert work_bound_round_s({1: 5.0, 2: 4.9}, {1: 1.0, 2: 0.6}, 2) == pytest.approx(4.9)
    # the worker's schedule is one schedule: never below the bound
    assert attainable_round_s(2.0, 3.6, 2.0) >= work_bound_round_s(
        {1: 2.0, 2: 1.9}, {1: 3.6, 2: 2.0}, 2)
