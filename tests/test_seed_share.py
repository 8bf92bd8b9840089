"""A seeding share that runs on until a placement that fits is scored
(``Tracker.sub_budget(until_feasible=...)``, ``seeding.seed_limits``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from placetool.costmodel import CostModel, presets
from placetool.search import Budget, Problem
from placetool.search.seeding import UNTIL_FEASIBLE_SHARE, seed_limits
from placetool.search.tracker import Tracker


@pytest.fixture(scope="module")
def problem():
    return Problem(CostModel(presets.load_graph("synthetic-100"), presets.load_cluster("k80x2")))


def score(t, problem, feasible: bool) -> None:
    a = np.zeros((1, problem.n_groups), np.int32)
    t.record(a, [1000.0], [feasible], np.zeros((1, problem.n_devices), np.int64))


def test_a_share_without_a_placement_that_fits_runs_on_until_one_is_scored(problem):
    t = Tracker(problem, Budget(seconds=60))
    with t.sub_budget(0.05, until_feasible=30.0):
        time.sleep(0.1)
        assert not t.done() and t.seconds_left() > 20  # past its share, nothing fits yet
        score(t, problem, feasible=False)
        assert not t.done()
        score(t, problem, feasible=True)
        assert t.done() and t.seconds_left() < 0
    assert not t.done()  # the budget itself goes on


def test_a_share_that_found_one_in_time_ends_at_its_share(problem):
    t = Tracker(problem, Budget(seconds=60))
    with t.sub_budget(0.1, until_feasible=30.0):
        score(t, problem, feasible=True)
        assert not t.done()
        time.sleep(0.15)
        assert t.done()


def test_the_longer_limit_still_ends_it(problem):
    t = Tracker(problem, Budget(seconds=60))
    with t.sub_budget(0.02, until_feasible=0.08):
        time.sleep(0.05)
        assert not t.done()
        time.sleep(0.05)
        assert t.done()
    # and a plain share is the old one: it ends at its seconds, fitting or not
    with t.sub_budget(0.05):
        time.sleep(0.07)
        assert t.done()


def test_a_fit_scored_in_an_inner_share_counts_for_the_outer(problem):
    t = Tracker(problem, Budget(seconds=60))
    with t.sub_budget(0.02, until_feasible=30.0):
        with t.sub_budget(10.0):
            score(t, problem, feasible=True)
        time.sleep(0.05)
        assert t.done()


def test_seed_limits():
    assert seed_limits(Budget(seconds=10), 0.25) == (2.5, 10 * UNTIL_FEASIBLE_SHARE)
    assert seed_limits(Budget(seconds=10), 0.8) == (8.0, 8.0)  # never shorter than the share
    assert seed_limits(Budget(evals=100), 0.25) == (60.0, None)


def test_a_share_inside_one_that_has_ended_ends_with_it(problem):
    t = Tracker(problem, Budget(seconds=60))
    with t.sub_budget(0.02, until_feasible=30.0):
        score(t, problem, feasible=True)
        time.sleep(0.05)
        assert t.done()
        with t.sub_budget(10.0):  # the enclosing share is over: so is this one
            assert t.done()
