"""The schedule bound (CP-SAT): known answers, and never above the best placement brute force finds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from placetool.costmodel import CostModel, OpGraph
from placetool.search import Budget, Problem, run
from tests.helpers import brute_force, cluster, cost_models, nxgraph

pytest.importorskip("ortools")

from placetool.search.schedule_bound import schedule_bound  # noqa: E402


def join_problem(link_us: float) -> Problem:
    """a and b (10 µs each, independent) feed c (1 µs), on two identical GPUs whose link
    costs ``link_us`` per transfer (the tensors are 1 byte)."""
    g = nxgraph({"a": 1, "b": 1, "c": 1}, [("a", "c", {"bytes": 1}), ("b", "c", {"bytes": 1})])
    cl = cluster(2, latency=link_us - 1.0, bandwidth=1.0, kinds=["gpu", "gpu"])
    return Problem(CostModel(OpGraph.from_networkx(g), cl, op_times=[[10.0, 10.0], [10.0, 10.0], [1.0, 1.0]]))


def test_a_slow_link_keeps_the_join_on_one_device():
    # split: b's output reaches c 15 µs after b ends, 10 + 15 + 1 = 26; together 10 + 10 + 1
    # = 21. The bounds without communication see 11 (critical path) and 10.5 (work / 2);
    # the communication term sees that c's inputs either queue on its device or cross
    # the link: 21 as well
    p = join_problem(15.0)
    b = schedule_bound(p, seconds=10)
    assert b.status == "optimal" and b.bound_us == pytest.approx(21.0)
    bounds = p.lower_bounds()
    assert max(v for k, v in bounds.items() if k not in ("communication", "best")) == pytest.approx(11.0)
    assert p.lower_bound_us() == pytest.approx(21.0)
    assert len(set(b.assignment.tolist())) == 1
    # a fast link splits them: 10 + 2 + 1 = 13
    assert schedule_bound(join_problem(2.0), seconds=10).bound_us == pytest.approx(13.0)


def test_one_link_carries_one_transfer_at_a_time():
    # a0, a1 on device 0 (1 µs each) feed c on device 1, which alone can run c (20 µs
    # elsewhere is ruled out by an inf kernel): both tensors cross the one link, 10 µs
    # each, one after the other: a0 ends at 1, its tensor 1-11, a1's 11-21, c 21-22
    g = nxgraph({"a0": 1, "a1": 1, "c": 1}, [("a0", "c", {"bytes": 1}), ("a1", "c", {"bytes": 1})])
    cl = cluster(2, latency=9.0, bandwidth=1.0, kinds=["gpu", "gpu"])
    T = [[1.0, np.inf], [1.0, np.inf], [np.inf, 1.0]]
    p = Problem(CostModel(OpGraph.from_networkx(g), cl, op_times=T))
    b = schedule_bound(p, seconds=10)
    assert b.bound_us == pytest.approx(22.0)
    assert b.bound_us == pytest.approx(p.cost_model.simulate(b.assignment).step_time_us)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_models(min_ops=1, max_ops=7, max_devices=3, memories=(1 << 40,)))
def test_the_bound_is_below_the_best_placement(cm):
    # groups, several outputs per op, control edges, send/receive costs: none of it lets a
    # simulated run beat the best schedule
    p = Problem(cm)
    best = brute_force(p)
    b = schedule_bound(p, seconds=20, workers=1)
    assert b.status == "optimal"
    assert b.bound_us <= best * (1 + 1e-9) + 1e-9
    # the schedule it found is no longer than the simulator's run of its placement
    assert b.schedule_us <= cm.simulate(b.assignment).step_time_us * (1 + 1e-9) + 1e-9


def test_exact_reports_the_schedule_bound_and_proves_with_it():
    # the join on a slow link: the tree's bounds see 11 µs at the root, the schedule 21,
    # which the single-device placement reaches: optimal without a tree node
    p = join_problem(15.0)
    r = run("exact", p, Budget(seconds=5), seed=0)
    m = r.metadata
    assert m["status"] == "optimal" and r.step_time_us == pytest.approx(21.0)
    assert m["schedule_bound_us"] == pytest.approx(21.0) and m["bound_us"] == pytest.approx(21.0)
    assert m["nodes"] == 0
    off = run("exact", p, Budget(seconds=5), seed=0, schedule_share=0).metadata
    assert off["schedule_bound_us"] is None and off["status"] == "optimal" and off["nodes"] > 0


def test_a_failed_solver_leaves_exact_to_its_tree(monkeypatch):
    # the solver's process cannot start: the bound is skipped, exact proves with its tree
    import placetool.search.schedule_bound as sb

    monkeypatch.setattr(sb.sys, "executable", "/nonexistent/python")
    assert sb.schedule_bound(join_problem(15.0), seconds=5).status.startswith("failed")
    r = run("exact", join_problem(15.0), Budget(seconds=5), seed=0)
    assert r.metadata["schedule"].startswith("failed") and r.metadata["schedule_bound_us"] is None
    assert r.metadata["status"] == "optimal" and r.step_time_us == pytest.approx(21.0)


@pytest.mark.slow
def test_the_bound_in_a_process_that_loaded_tensorflow():
    # CP-SAT crashes a process that has loaded TensorFlow (protobuf and absl builds
    # clash): the solver runs in its own process, so rl and exact can share one
    import subprocess
    import sys

    pytest.importorskip("tensorflow")
    code = ("import tensorflow\n"
            "from tests.test_schedule_bound import join_problem\n"
            "from placetool.search.schedule_bound import schedule_bound\n"
            "print(schedule_bound(join_problem(15.0), seconds=10).bound_us)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) == pytest.approx(21.0)
