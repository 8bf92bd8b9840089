"""Identifying the run queue's per-message costs from traced steps (costmodel/workers_fit.py).

Known answers: steps the workers model itself "traced" under known costs give those costs
back (or costs that replay them exactly, where the steps cannot tell them apart); and the
checked-in towers recording (``tests/data/towers_sa.timeline.*``) replays within 1% under
the costs identified from it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from placetool.costmodel import graph as graphs
from placetool.costmodel import timeline as TL
from placetool.costmodel.synthetic import layered
from placetool.costmodel.workers import TESTBED_COSTS, WorkerCosts
from placetool.costmodel.workers_fit import (BOUNDS, fit_worker_costs, op_inflation, replay_errors, steps_of,
                                             traced_like)

DATA = os.path.join(os.path.dirname(__file__), "data")


def _links(lat=80.0, bw=1500.0):
    L = np.full((2, 2), lat)
    np.fill_diagonal(L, 0.0)
    return L, np.full((2, 2), bw)


def _steps(costs, n=6, seed=0):
    g = layered(60, width=4, seed=seed)
    rng = np.random.default_rng(seed)
    lat, bw = _links()
    op_us = rng.uniform(20.0, 400.0, g.n_ops)
    out = []
    for k in range(n):
        p = (rng.random(g.n_ops) < 0.15 + 0.1 * k).astype(np.int64)
        out.append(traced_like(g, op_us, p, lat, bw, costs, label=str(k)))
    return out, lat, bw


def test_known_costs_are_replayed_back():
    true = WorkerCosts(request_us=25.0, handler_us=75.0, send_us_per_byte=250e-6, arrive_us=50.0,
                       recv_us_per_byte=250e-6)
    steps, lat, bw = _steps(true)
    assert np.all(replay_errors(steps, lat, bw, true) == 0.0)
    # the request cost barely moves these spans: the search needs 2,000 points to land
    # where every step replays within 1%
    fit = fit_worker_costs(steps, lat, bw, max_evaluations=2000)
    s = fit.summary()
    assert s["median_abs_error_pct"] < 0.25 and s["max_abs_error_pct"] < 1.0
    assert fit.costs.handler_us == pytest.approx(75.0, rel=0.05)
    assert fit.costs.arrive_us == pytest.approx(50.0, rel=0.1)
    assert fit.costs.send_us_per_byte == pytest.approx(250e-6, rel=0.1)
    assert fit.labels == [str(k) for k in range(6)] and 1800 <= fit.evaluations <= 2200


def test_a_box_without_the_answer_fits_worse():
    true = WorkerCosts(request_us=30.0, handler_us=62.0, send_us_per_byte=310e-6, arrive_us=9.0,
                       recv_us_per_byte=310e-6)
    steps, lat, bw = _steps(true, seed=3)
    fit = fit_worker_costs(steps, lat, bw)
    no_handler = fit_worker_costs(steps, lat, bw, bounds={"handler_us": (0.0, 0.0), "request_us": (0.0, 0.0)})
    assert fit.summary()["median_abs_error_pct"] < 0.25
    assert no_handler.costs.handler_us == no_handler.costs.request_us == 0.0
    assert 900 <= no_handler.evaluations <= 1100  # the budget is the same with fewer costs free
    assert no_handler.summary()["median_abs_error_pct"] > 2 * fit.summary()["median_abs_error_pct"]


def test_pinned_bounds_are_the_costs():
    steps, lat, bw = _steps(WorkerCosts(handler_us=50.0), n=3, seed=1)
    pin = {"request_us": (0.0, 0.0), "handler_us": (50.0, 50.0), "arrive_us": (0.0, 0.0), "us_per_mb": (0.0, 0.0)}
    fit = fit_worker_costs(steps, lat, bw, bounds=pin)
    assert fit.costs == WorkerCosts(handler_us=50.0) and fit.summary()["max_abs_error_pct"] == 0.0
    assert set(BOUNDS) == set(pin)


def test_no_steps_is_an_error():
    lat, bw = _links()
    with pytest.raises(ValueError, match="no traced steps"):
        fit_worker_costs([], lat, bw)


def test_the_towers_recording_identifies_costs_that_replay_it():
    g = graphs.load(os.path.join(DATA, "towers_sa.timeline.npz"))
    rec = TL.load(os.path.join(DATA, "towers_sa.timeline.json"), g)
    lat, bw = _links(120.0, 2000.0)
    steps = steps_of(rec)
    fit = fit_worker_costs(steps, lat, bw)
    e = fit.summary()
    testbed = np.abs(replay_errors(steps, lat, bw, TESTBED_COSTS))
    assert e["n_steps"] == 3 and e["median_abs_error_pct"] < 1.0
    assert e["median_abs_error_pct"] <= np.median(testbed) and e["max_abs_error_pct"] < 5.0
    # the same replay as timeline.replay's, under the identified costs
    from dataclasses import replace

    from .helpers import cluster

    cl = replace(cluster(2, latency=120.0, bandwidth=2000.0), link_queue="none")
    for k in range(3):
        r = TL.replay(rec, k, cluster=cl, links=TL.WORKERS, costs=fit.costs)
        assert r["error_pct"] == pytest.approx(fit.errors_pct[k], abs=1e-9)


def test_op_inflation_is_time_weighted_and_leaves_the_dispatch_cost_out():
    g = layered(20, width=2, seed=0)
    lat, bw = _links()
    op_us = np.full(g.n_ops, 100.0)
    steps = [traced_like(g, op_us, np.zeros(g.n_ops, np.int64), lat, bw, WorkerCosts())]
    T = np.full((g.n_ops, 2), 60.0)  # 50 µs profiled + 10 µs of dispatch
    assert op_inflation(steps, T, [10.0, 10.0]) == pytest.approx(2.0)
    assert op_inflation(steps, T) == pytest.approx(100.0 / 60.0)


def test_message_inflation_recovers_cpu_per_message_on_each_end():
    """Ops that ran 40 µs longer per message their device sent and 10 per message it
    received (and nothing per byte) give those figures back."""
    from placetool.costmodel.commfit import transfer_counts
    from placetool.costmodel.workers_fit import message_inflation, with_inflation

    g = layered(80, width=4, seed=2)
    rng = np.random.default_rng(2)
    lat, bw = _links()
    profiled = rng.uniform(50.0, 300.0, g.n_ops)
    steps, prof = [], []
    for f in (0.1, 0.25, 0.4, 0.6):
        p = (rng.random(g.n_ops) < f).astype(np.int64)
        c = transfer_counts(g, p, 2)
        op_us = profiled.copy()
        for d in range(2):  # the extra time spread over the device's ops
            on = np.flatnonzero(p == d)
            op_us[on] += (40.0 * c[d, 0] + 10.0 * c[d, 2]) / on.size
        steps.append(traced_like(g, op_us, p, lat, bw, WorkerCosts()))
        prof.append(profiled)
    m = message_inflation(steps, prof, 2)
    assert m["send_us"] == pytest.approx(40.0, abs=1e-6) and m["recv_us"] == pytest.approx(10.0, abs=1e-6)
    assert m["send_us_per_byte"] == pytest.approx(0.0, abs=1e-9)
    assert m["recv_us_per_byte"] == pytest.approx(0.0, abs=1e-9)
    c = with_inflation(WorkerCosts(request_us=5.0, handler_us=50.0, arrive_us=20.0), m)
    assert (c.request_us, c.handler_us, c.arrive_us) == (5.0, pytest.approx(90.0), pytest.approx(30.0))
    # one device: no messages, nothing to learn
    one = [traced_like(g, profiled, np.zeros(g.n_ops, np.int64), lat, bw, WorkerCosts())]
    assert message_inflation(one, [profiled], 2) == {"send_us": 0.0, "send_us_per_byte": 0.0, "recv_us": 0.0,
                                                     "recv_us_per_byte": 0.0}


def test_refine_identifies_the_costs_from_each_rounds_recordings_and_keeps_them():
    """``--refine``'s refit under links.send "workers" (cli.verifytop._WorkerRefit) on the
    checked-in towers recording: the costs it puts on the cluster are those identified
    from the recorded steps on the cluster's lone-transfer links; a diverse split's
    measured step judges them; a round that traced nothing split keeps steps and costs."""
    from dataclasses import replace

    from placetool.cli.verifytop import _WorkerRefit, predicted_us
    from placetool.costmodel import CostModel
    from placetool.costmodel.workers import with_worker_costs

    from .helpers import cluster

    g = graphs.load(os.path.join(DATA, "towers_sa.timeline.npz"))
    rec = TL.load(os.path.join(DATA, "towers_sa.timeline.json"), g)
    cl = with_worker_costs(replace(cluster(2, latency=120.0, bandwidth=2000.0, kinds=["cpu", "cpu"]),
                                   name="tb"))
    refit = _WorkerRefit(g, cl, None, ("cpu",))
    diverse = np.asarray(rec.placement)[::-1].copy()
    summary = {"recordings": [("search", "search #1", rec)], "placements_g": [rec.placement, diverse],
               "rows": [{"source": "search", "measured_us": 1.0}, {"source": "diverse", "measured_us": 5e4}]}
    cl1, fs = refit.add(summary, 1)
    lat, bw = _links(120.0, 2000.0)
    want = fit_worker_costs(steps_of(rec), lat, bw)
    assert cl1.link_send == "workers" and cl1.name == "tb" and fs["samples"] == 3 and fs["design_samples"] == 0
    assert fs["replay_params"] == {k: getattr(want.costs, k) for k in fs["replay_params"]}
    assert cl1.devices[0].send_us == want.costs.handler_us and cl1.devices[1].request_us == want.costs.request_us
    assert fs["fit_median_abs_error_pct"] == pytest.approx(want.summary()["median_abs_error_pct"])
    pred = predicted_us(CostModel(g, cl1), None, diverse)
    assert fs["held_out_median_abs_error_pct"] == pytest.approx(abs(pred - 5e4) / 5e4 * 100)
    cl2, fs2 = refit.add({"placements_g": [], "rows": []}, 2)  # nothing split was traced
    assert cl2 is cl1 and fs2["samples"] == 3 and fs2["params"] == fs["params"]


def test_costs_from_several_graphs_take_one_profile_per_graph():
    """Steps of graphs calibrated apart are pooled, each on its own profile: a list of
    profiles that does not match the graphs is refused before any fitting."""
    from placetool.costmodel.tf.calibrate import worker_costs_from_steps

    g = graphs.load(os.path.join(DATA, "towers_sa.timeline.npz"))
    rec = TL.load(os.path.join(DATA, "towers_sa.timeline.json"), g)
    with pytest.raises(ValueError, match="2 profiles for 1 graphs"):
        worker_costs_from_steps([steps_of(rec)], object(), [None, None])
