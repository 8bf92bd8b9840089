"""Lower bounds: known answers, and never above the best placement brute force finds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from placetool.costmodel import CostModel, OpGraph
from placetool.search import Problem
from placetool.search.bounds import energy_bound, lower_bound
from tests.helpers import brute_force, cluster, cost_models, nxgraph


def independent_ops(n, times):
    g = OpGraph.from_networkx(nxgraph({f"op{i}": 0 for i in range(n)}, []))
    return CostModel(g, cluster(len(times[0]), kinds=["gpu"] * len(times[0])), op_times=np.asarray(times, float))


def test_energy_bound_counts_a_slow_device_at_its_speed():
    # 8 independent ops, 1 µs on the fast device, 4 µs on the slow one: within [0, C]
    # the fast one does C of them and the slow one C / 4, so C >= 8 / (1 + 1/4) = 6.4
    # (the optimum is 7: 6 fast, 2 slow takes 8; 7 fast, 1 slow takes 7). Counting the
    # slow device as a fast one would give 4.
    cm = independent_ops(8, [[1.0, 4.0]] * 8)
    assert energy_bound(cm, 0.0) == pytest.approx(6.4, abs=0.01)
    assert lower_bound(Problem(cm))["best"] <= 7.0


def test_energy_bound_of_identical_devices_is_the_work_over_the_devices():
    cm = independent_ops(6, [[2.0, 2.0, 2.0]] * 6)
    assert energy_bound(cm, 0.0) == pytest.approx(4.0, abs=0.01)


def test_an_op_pinned_to_the_slow_device_counts_there():
    # op0 runs only on device 1 (10 µs), the rest (1 µs) anywhere: at least 10
    cm = independent_ops(4, [[np.inf, 10.0]] + [[1.0, 1.0]] * 3)
    assert lower_bound(Problem(cm))["best"] == pytest.approx(10.0, abs=0.01)


def test_an_op_on_its_slower_class_fills_at_most_the_window():
    # device 0 is the "fastest class" (least total time), but ops 1 and 3 take 3 µs there
    # and 5 µs on device 1; the optimum is 5 (op 1 on device 0, op 3 on device 1). Counting
    # an op's least time inside a window at its fastest duration, then scaling by its
    # slow-down on the class, put more than the window's length of it there: 5.85.
    cm = independent_ops(4, [[0.0, 2.0], [3.0, 5.0], [1.0, 0.0], [3.0, 5.0]])
    assert energy_bound(cm, 0.0) <= 5.0 + 1e-9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_models(min_ops=1, max_ops=7, max_devices=3, memories=(1 << 40,)))
def test_every_bound_is_below_the_best_placement(cm):
    p = Problem(cm)
    best = brute_force(p)
    for name, value in lower_bound(p).items():
        assert value <= best * (1 + 1e-9) + 1e-9, name
