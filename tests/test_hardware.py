"""Real devices: the TF worker testbed, the runner, calibrate and verify; profiles.

The slow tests start real ``tf.distribute.Server`` workers on localhost (2 at most: the
machine has 2 cores) and run the zoo's tiny MLP on them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from placetool.costmodel import CostModel
from placetool.costmodel.calibration import (UNMEASURED_BANDWIDTH, OpFit, Profile, ProfileError, count_latency,
                                             fit_link, fit_op_type, load_profile)
from placetool.costmodel.errors import UserError
from placetool.costmodel.workers import TESTBED_COSTS

from .helpers import cluster as make_cluster
from .helpers import nxgraph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


# ---------------------------------------------------------------- profile (no TF)
def _chain():
    from placetool.costmodel import OpGraph

    return OpGraph.from_networkx(nxgraph(
        {"a": {"op_type": "MatMul", "out_bytes": 400, "flops": 1e6},
         "b": {"op_type": "Relu", "out_bytes": 400},
         "c": {"op_type": "MatMul", "out_bytes": 400, "flops": 2e6},
         "d": {"op_type": "Softmax", "out_bytes": 40}},
        [("a", "b"), ("b", "c"), ("c", "d")], name="chain"))


def test_fit_op_type_recovers_known_coefficients():
    flops = np.array([1e6, 2e6, 4e6, 8e6, 3e6])
    nbytes = np.array([1e4, 5e3, 4e4, 1e4, 2e4])
    t = 5.0 + flops * 2e-6 + nbytes * 1e-4
    f = fit_op_type(flops, nbytes, t)
    assert f.intercept_us == pytest.approx(5.0, rel=1e-6)
    assert f.us_per_flop == pytest.approx(2e-6, rel=1e-6)
    assert f.us_per_byte == pytest.approx(1e-4, rel=1e-6)
    one = fit_op_type([1e6], [10], [7.0])  # one sample: an intercept, nothing extrapolated
    assert (one.intercept_us, one.us_per_flop, one.us_per_byte) == (7.0, 0.0, 0.0)


def test_link_fits_recover_latency_and_bandwidth():
    sizes = [1024 * 4 ** k for k in range(9)]
    t = [30.0 + s / 500.0 for s in sizes]
    lat, bw = fit_link(sizes, t)
    assert lat == pytest.approx(30.0, rel=1e-6) and bw == pytest.approx(500.0, rel=1e-6)
    assert count_latency([2, 8, 32], [100 + 2 * 40, 100 + 8 * 40, 100 + 32 * 40]) == pytest.approx(40.0)
    with pytest.raises(ValueError):
        fit_link([1024, 1024], [1.0, 2.0])
    # larger transfers no slower (noise over too small a range): no per-byte cost, said as such
    assert fit_link([1024, 4096, 16384, 65536], [120.0, 118.0, 117.0, 115.0]) == (pytest.approx(117.5),
                                                                                   UNMEASURED_BANDWIDTH)


def test_profile_measured_then_fit_then_nan_and_round_trip(tmp_path):
    g = _chain()
    cl = make_cluster(3, kinds=["cpu", "cpu", "gpu"])
    p = Profile(devices=[{"name": n, "kind": k} for n, k in zip(cl.names, cl.kinds)],
                step_overhead_us=[100.0, 250.0])
    p.add_op_medians("cpu", g, {"a": 10.0, "c": 30.0, "b": 1.5})
    p.fits = {"cpu": {"MatMul": OpFit(0.0, 1e-5, 0.0, 2), "*": OpFit(2.0, 0.0, 0.0, 3)}}
    T = p.op_times(g, cl)
    # measured a, b, c; d (Softmax) from the all-ops fit; no GPU data at all
    assert T[:, 0].tolist() == [10.0, 1.5, 30.0, 2.0]
    assert T[:, 1].tolist() == T[:, 0].tolist()
    assert np.isnan(T[:, 2]).all()
    assert p.step_overhead(1) == 100.0 and p.step_overhead(2) == 250.0 and p.step_overhead(5) == 250.0
    # a measurement taken at another size (other FLOPs) is not used: the MatMul fit is
    g2 = _chain()
    g2.flops[0] = 3e6
    assert p.op_times(g2, cl)[0, 0] == pytest.approx(30.0)
    # the per-op dispatch cost is added to every profiled time of its kind
    p.dispatch_us = {"cpu": 0.5}
    T = p.op_times(g, cl)
    assert T[:, 0].tolist() == [10.5, 2.0, 30.5, 2.5]
    assert p.dispatch_per_device(cl).tolist() == [0.5 if k == "cpu" else 0.0 for k in cl.kinds]
    path = tmp_path / "p.json"
    p.save(path)
    q = load_profile(path)
    assert np.array_equal(q.op_times(g, cl), T, equal_nan=True)
    # CostModel: measured first, roofline where the profile knows nothing (the GPU)
    cm = CostModel(g, cl, profile=q)
    assert cm.T[:, 0].tolist() == [10.5, 2.0, 30.5, 2.5]
    assert np.isfinite(cm.T[:, 2]).all() and cm.T[0, 2] != 10.0


def test_profile_refit_and_bad_files(tmp_path):
    g = _chain()
    p = Profile(devices=[])
    p.add_op_medians("cpu", g, {"a": 12.0, "b": 1.0, "c": 22.0, "d": 3.0})
    p.refit()
    assert set(p.fits["cpu"]) == {"MatMul", "Relu", "Softmax", "*"}
    assert p.fits["cpu"]["Relu"].intercept_us == 1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**p.to_dict(), "version": 99}))
    with pytest.raises(ProfileError, match="bad.json.*version 99"):
        load_profile(bad)
    d = p.to_dict()
    d["ops"]["cpu"]["chain"]["a"] = ["MatMul", -1.0, 0, 0]
    bad.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="op 'a'"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile(tmp_path / "missing.json")


def _towers(n_towers=3, depth=4):
    """Input -> parallel chains -> join: the shape where transfer costs decide a split."""
    from placetool.costmodel import OpGraph

    nodes = {"x": {"op_type": "Input", "out_bytes": 4000}, "join": {"op_type": "Concat", "out_bytes": 3000},
             "out": {"op_type": "Dense", "out_bytes": 40}}
    edges = [("join", "out")]
    for t in range(n_towers):
        prev = "x"
        for k in range(depth):
            v = f"t{t}_{k}"
            nodes[v] = {"op_type": "Dense", "out_bytes": 1000 * (1 + (t + k) % 3)}
            edges.append((prev, v))
            prev = v
        edges.append((prev, "join"))
    return OpGraph.from_networkx(nxgraph(nodes, edges, name="towers"))


TRUE = {"latency_us": 30.0, "send_us": 50.0, "send_us_per_byte": 0.01, "recv_us": 20.0, "recv_us_per_byte": 0.005}


def _samples(g, base, prof):
    from placetool.costmodel.calibration import StepSample, with_transfer_params
    from placetool.costmodel.tf.calibrate import designed_splits
    from placetool.costmodel.tf.testbed import ClusterSpec

    true = with_transfer_params(base, TRUE)
    cm = CostModel(g, true, profile=prof)
    designs = designed_splits(g, ClusterSpec.for_workers(["localhost:0"] * 2))
    return [StepSample(g, p, cm.simulate(p).step_time_us + prof.step_overhead(len(np.unique(p))), 0.5, label, held)
            for label, p, held in designs]


def test_transfer_counts_and_device_costs_keep_a_lone_transfers_time():
    from placetool.costmodel.calibration import count_transfers, with_transfer_params

    g = _towers()
    x, t00, t10 = g.index["x"], g.index["t0_0"], g.index["t1_0"]
    p = np.zeros(g.n_ops, np.int32)
    assert count_transfers(g, p) == 0
    p[[t00, t10]] = 1  # x's one tensor goes to device 1 once, for both consumers
    assert count_transfers(g, p) == 1 + 2  # and t0_1, t1_1 on device 0 need t0_0's and t1_0's outputs
    p[x] = 1
    assert count_transfers(g, p) == 1 + 2  # x now sends to the third tower on device 0 instead
    base = make_cluster(2, latency=100.0, bandwidth=50.0, kinds=["cpu", "cpu"])
    c = with_transfer_params(base, TRUE)
    assert c.transfer_costs()[:, 0].tolist() == [50.0, 0.01, 20.0, 0.005]
    assert c.latency_us[0, 1] == 30.0 and c.latency_us[0, 0] == 0.0
    # per byte, a lone transfer costs what it did: 1/50 µs, now 0.01 sending + 0.005 on the link + 0.005 receiving
    assert 1.0 / c.bandwidth_bytes_per_us[0, 1] == pytest.approx(0.02 - 0.015)
    # a GPU keeps its zero device costs
    mixed = with_transfer_params(make_cluster(2, kinds=["cpu", "gpu"]), TRUE)
    assert mixed.transfer_costs()[:, 1].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_designed_splits_cover_both_directions_few_and_many_transfers():
    from placetool.costmodel.calibration import count_transfers
    from placetool.costmodel.tf.calibrate import designed_splits
    from placetool.costmodel.tf.testbed import ClusterSpec

    g = _towers()
    designs = designed_splits(g, ClusterSpec.for_workers(["localhost:0"] * 2))
    labels = [label for label, _, _ in designs]
    assert {"single:0", "single:1", "cut:0->1", "cut:1->0", "alternate:0->1", "alternate:1->0"} <= set(labels)
    assert [held for _, _, held in designs] == [i % 3 == 2 for i in range(len(designs))]
    n = {label: count_transfers(g, p) for label, p, _ in designs}
    assert n["single:0"] == 0 and 0 < n["cut:0->1"] < n["alternate:0->1"]
    for _, p, _ in designs:  # whole groups, valid placements
        assert CostModel(g, make_cluster(2, kinds=["cpu", "cpu"])).violation(p) is None
    assert len({p.tobytes() for _, p, _ in designs}) == len(designs)


def test_transfer_fit_to_whole_steps_predicts_held_out_placements():
    from placetool.costmodel.calibration import fit_transfer_costs

    g = _towers()
    prof = Profile(devices=[], step_overhead_us=[10.0, 30.0])
    prof.add_op_medians("cpu", g, {n: 100.0 + 10 * (i % 4) for i, n in enumerate(g.names)})
    base = make_cluster(2, latency=100.0, bandwidth=50.0, kinds=["cpu", "cpu"])  # the lone-transfer fit
    samples = _samples(g, base, prof)
    fit = fit_transfer_costs(samples, base, prof)
    s = fit.summary()
    assert s["fit"]["n"] + s["held_out"]["n"] == len(samples) and s["held_out"]["n"] >= 4
    assert s["fit"]["median_abs_error_pct"] < 1.0 and s["held_out"]["median_abs_error_pct"] < 2.0
    assert s["noise_floor_pct"] == 0.5
    # the steps need the device-side costs: link time alone predicts them far worse
    from placetool.costmodel.calibration import with_transfer_params

    zero = with_transfer_params(base, {"latency_us": 100.0, "send_us": 0.0, "send_us_per_byte": 0.0,
                                       "recv_us": 0.0, "recv_us_per_byte": 0.0})
    cm0 = CostModel(g, zero, profile=prof)
    err0 = [abs(cm0.simulate(x.placement).step_time_us + prof.step_overhead(len(np.unique(x.placement)))
                - x.measured_us) / x.measured_us for x in samples if len(np.unique(x.placement)) > 1]
    assert np.median(err0) > 0.05
    assert fit.params["send_us"] + fit.params["recv_us"] > 20.0
    # exact data needs no extra per-transfer step cost
    assert fit.per_transfer_us == 0.0 and fit.per_transfer_note.startswith("not needed")


def test_op_times_are_anchored_to_the_one_device_steps_measured_among_the_designs():
    """The designs' one-device steps measured 80% of what the profile predicts (less the
    fixed step overhead): every profiled op time is scaled by 0.8, the scale is recorded,
    and a 1% difference is left alone."""
    from placetool.costmodel.calibration import StepSample
    from placetool.costmodel.tf.calibrate import _anchor_op_times

    g = _towers()
    base = make_cluster(2, latency=100.0, bandwidth=50.0, kinds=["cpu", "cpu"])
    for measured_share, want in ((0.8, 0.8), (0.99, None)):
        prof = Profile(devices=[], step_overhead_us=[10.0, 30.0], meta={"graphs": {}})
        prof.add_op_medians("cpu", g, {n: 100.0 + 10 * (i % 4) for i, n in enumerate(g.names)})
        before = CostModel(g, base, profile=prof).T.copy()
        alone = CostModel(g, base, profile=prof).simulate(np.zeros(g.n_ops, np.int32)).step_time_us
        samples = _samples(g, base, prof)
        for s in samples:
            if s.label.startswith("single:"):
                s.measured_us = measured_share * alone + 10.0
        _anchor_op_times([type("T", (), {"graph": g})()], samples, prof, base, ("cpu",), lambda m: None)
        after = CostModel(g, base, profile=prof).T
        if want is None:
            assert np.array_equal(after, before) and "op_time_scale" not in prof.meta["graphs"].get(g.name, {})
        else:
            assert np.allclose(after, before * want)
            assert prof.meta["graphs"][g.name]["op_time_scale"] == pytest.approx(want)
            assert CostModel(g, base, profile=prof).simulate(np.zeros(g.n_ops, np.int32)).step_time_us \
                == pytest.approx(measured_share * alone)
    assert any(s.label.startswith("single:") for s in samples) and isinstance(samples[0], StepSample)


def test_refine_anchors_op_times_to_the_one_device_step_measured_in_its_round():
    """--refine: one device measured 25% over its prediction (less the fixed overhead):
    the profile's op times of the graph are scaled by 1.25 and the next prediction is the
    measurement; within 2% nothing moves, and without a profile of the graph the factor is 1."""
    from placetool.cli.hardware import step_overhead_us
    from placetool.cli.verifytop import anchor_op_times

    g = _towers()
    base = make_cluster(2, latency=100.0, bandwidth=50.0, kinds=["cpu", "cpu"])
    one, split = np.zeros(g.n_ops, np.int32), (np.arange(g.n_ops) % 2).astype(np.int32)
    for share, want in ((1.25, 1.25), (1.01, 1.0)):
        prof = Profile(devices=[], step_overhead_us=[10.0, 30.0], meta={"graphs": {}})
        prof.add_op_medians("cpu", g, {n: 100.0 + 10 * (i % 4) for i, n in enumerate(g.names)})
        pred = CostModel(g, base, profile=prof).simulate(one).step_time_us + step_overhead_us(prof, one)
        rows = [{"source": "search", "measured_us": 1.0, "predicted_us": 2.0},
                {"source": "single", "measured_us": share * (pred - 10.0) + 10.0, "predicted_us": pred}]
        assert anchor_op_times(prof, g, base, rows, [split, one]) == pytest.approx(want)
        after = CostModel(g, base, profile=prof).simulate(one).step_time_us + step_overhead_us(prof, one)
        assert after == pytest.approx(rows[1]["measured_us"] if want != 1.0 else pred)
    other = Profile(devices=[], step_overhead_us=[10.0, 30.0], meta={"graphs": {}})
    assert anchor_op_times(other, g, base, rows, [split, one]) == 1.0 == anchor_op_times(None, g, base, rows, [])


def test_cluster_spec_file_and_unreachable_worker_fails_fast(tmp_path):
    from placetool.costmodel.tf.testbed import ClusterSpec, TestbedError, free_ports

    port = free_ports(1)[0]  # nothing listens there
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"worker": [f"localhost:{port}"]}))
    spec = ClusterSpec.load(f)
    assert spec.tf_devices == ["/job:worker/replica:0/task:0/device:CPU:0"]
    t = time.monotonic()
    with pytest.raises(TestbedError, match=f"task:0 at localhost:{port} is not reachable after 1 s"):
        spec.check_reachable(timeout_s=1.0)
    assert time.monotonic() - t < 5
    f.write_text("[1, 2]")
    with pytest.raises(TestbedError, match="spec.json"):
        ClusterSpec.load(f)
    f.write_text('{"worker": 5}')
    with pytest.raises(TestbedError, match=r"job 'worker' must list its tasks.*got 5"):
        ClusterSpec.load(f)


# ---------------------------------------------------------------- real workers
def _fresh_keras():
    """Keras numbers layer names per process; a fresh session makes every trace of the
    same model name its ops alike (as separate ``placetool`` processes do)."""
    import keras

    keras.backend.clear_session()


@pytest.fixture(scope="module")
def mlp():
    from placetool.costmodel.tf.importer import trace

    _fresh_keras()
    return trace("mlp", batch=16)


@pytest.fixture(scope="module")
def testbed():
    from placetool.costmodel.tf.testbed import Testbed

    with Testbed.start(2, timeout_s=120) as tb:
        pids = list(tb.pids)
        yield tb
    assert _wait_dead(pids)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_runner_single_and_split_placements(mlp, testbed):
    from placetool.costmodel.tf.runner import measure

    g = mlp.graph
    m = measure(mlp, np.zeros(g.n_ops, np.int32), testbed.spec, warmup=1, steps=3, trace_steps=2)
    assert m.step_us > 0 and len(m.steps_us) == 3
    assert set(m.op_us) == set(g.names)  # the per-op profile covers every op
    assert m.devices_used() == {testbed.spec.tf_devices[0]} and not m.transfers
    # a split placement: whole groups alternate between the workers
    p = g.to_placement((np.arange(g.n_groups) % 2).astype(np.int32))
    m2 = measure(mlp, p, testbed.spec, warmup=1, steps=3, trace_steps=1)
    assert m2.devices_used() == set(testbed.spec.tf_devices)
    assert all(m2.op_device[n] == testbed.spec.tf_devices[p[i]] for i, n in enumerate(g.names) if n in m2.op_device)
    assert len(m2.op_device) == g.n_ops
    # a traced step lists the RecvTensor events its workers reported in time: some, and
    # each one between the two workers (not always both directions in one step)
    assert m2.transfers and all(x["src"] != x["dst"] and {x["src"], x["dst"]} <= set(testbed.spec.tf_devices)
                                for x in m2.transfers), m2.transfers


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_interleaved_measurements_and_verify_top(mlp, testbed):
    from placetool.costmodel.tf.runner import measure_interleaved, verify_top

    g = mlp.graph
    single = np.zeros(g.n_ops, np.int32)
    split = g.to_placement((np.arange(g.n_groups) % 2).astype(np.int32))
    reps = measure_interleaved(mlp, [single, split, single.copy()], testbed.spec, rounds=3, steps=2, warmup=1)
    assert reps[0] == reps[2]  # the same placement is measured once (same numbers)
    for r in reps:
        assert len(r.round_us) == 3 and len(r.steps_us) == 6 and min(r.steps_us) > 0
        assert r.step_us == float(np.median(r.steps_us))
        assert r.spread_pct == pytest.approx(100 * (max(r.round_us) - min(r.round_us)) / 2 / r.step_us)
    cut = g.to_placement((np.arange(g.n_groups) >= g.n_groups // 2).astype(np.int32))
    v = verify_top(mlp, [{"label": "search #1", "source": "search", "placement": split, "predicted_us": 50.0},
                         {"label": "single", "source": "single", "placement": single, "predicted_us": 100.0},
                         {"label": "cut", "source": "baseline", "placement": cut, "predicted_us": 80.0}],
                   spec=testbed.spec, rounds=2, steps=2, warmup=1)
    assert [r["label"] for r in v["rows"]] == ["search #1", "single", "cut"]
    meas = [r["measured_us"] for r in v["rows"]]
    assert v["gain_pct"] == pytest.approx(100 * (meas[v["best_baseline"]] - meas[0]) / meas[v["best_baseline"]])
    # a baseline other than one device is recommended only once a fresh paired run confirms it too
    if v["rows"][v["recommended"]]["source"] == "baseline":
        assert v["baseline_confirmation"]["confirmed"] and v["baseline_confirmation"]["rounds"] == 5
    elif "baseline_confirmation" in v:
        assert not v["baseline_confirmation"]["confirmed"] and v["recommended"] == 1
        assert v["message"].endswith("recommending single")
    for r in v["rows"]:
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_us"] - r["measured_us"]) / r["measured_us"])
    # never a placement that measured slower than the baseline beyond the noise
    assert v["sentinel"]["noise_floor_pct"] >= 0 and v["noise_floor_pct"] >= v["sentinel"]["noise_floor_pct"]
    assert v["rows"][1]["ratio_to_single"] == 1.0
    if v["recommended"] == 0:
        # chosen by one run, recommended only after a fresh paired run confirmed it
        c = v["confirmation"]
        assert v["confirmed"] and c["confirmed"] and meas[0] < min(meas[1:]) and c["rounds"] == 5
        assert c["gain_pct"] > c["noise_floor_pct"] and c["rounds_faster"] >= 4
        # beating the best baseline is not enough: one device too, in the same fresh run
        one = c["against_single"]
        assert (one is None) == (v["best_baseline"] == 1) and (one is None or one["confirmed"])
    elif "confirmation" in v:
        assert not v["confirmation"]["confirmed"] and not v["confirmed"]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_bad_placements_refused_before_anything_runs(mlp):
    from placetool.costmodel.tf.runner import RunError, measure
    from placetool.costmodel.tf.testbed import ClusterSpec, free_ports

    g = mlp.graph
    # unreachable workers: had the runner tried to run, the error would say so instead
    spec = ClusterSpec.for_workers([f"localhost:{p}" for p in free_ports(2)])
    p = np.zeros(g.n_ops, np.int32)
    p[3] = 2
    with pytest.raises(RunError, match=f"op '{g.names[3]}': device index 2 is not one of the 2 devices"):
        measure(mlp, p, spec)
    big = next(k for k in range(g.n_groups) if len(g.group_ops[k]) > 1)
    ops = g.group_ops[big]
    p = np.zeros(g.n_ops, np.int32)
    p[ops[-1]] = 1
    with pytest.raises(RunError, match="splits the group"):
        measure(mlp, p, spec)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_calibrate_and_verify_cli(mlp, testbed, tmp_path):
    from click.testing import CliRunner

    from placetool.cli.main import cli

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"worker": testbed.spec.workers}))
    out = tmp_path / "prof.json"
    _fresh_keras()
    r = CliRunner().invoke(cli, ["calibrate", "-g", "mlp", "--batch", "16", "--cluster-spec", str(spec),
                                 "--out", str(out), "--reps", "3", "--max-transfer", "65536",
                                 "--trace-steps", "2", "--split-steps", "1", "--rounds", "2", "--max-noise", "0",
                                 "--json"])  # TF workers: links.send workers, its costs fitted to whole steps
    assert r.exit_code == 0, r.output + repr(r.exception)
    summary = json.loads(r.output[r.output.index("{"):r.output.rindex("}") + 1])
    prof = load_profile(out)
    cl = prof.cluster()
    # the transfer costs fitted to designed split placements, judged on held-out ones
    fit = prof.meta["transfer_fit"]
    assert summary["transfer_fit"]["params"] == fit["params"]
    assert fit["fit"]["n"] >= 6 and fit["held_out"]["n"] >= 3 and fit["noise_floor_pct"] >= 0
    labels = {row["label"] for row in fit["placements"]}
    assert {"single:0", "cut:0->1", "cut:1->0", "alternate:0->1"} <= labels
    for row in fit["placements"]:
        assert row["error_pct"] == pytest.approx(100 * (row["predicted_us"] - row["measured_us"]) / row["measured_us"])
    costs = cl.transfer_costs()
    assert costs[:, 0].tolist() == costs[:, 1].tolist() == [fit["params"][k] for k in
                                                            ("send_us", "send_us_per_byte", "recv_us", "recv_us_per_byte")]
    # the run queue: handler and arrival fitted, the request's cost the testbed's
    assert cl.link_send == summary["link_send"] == "workers" and "worker_fit" not in prof.meta
    assert [d.request_us for d in cl.devices] == [TESTBED_COSTS.request_us] * 2
    from placetool.costmodel.cluster import load as load_cluster

    assert np.array_equal(load_cluster(tmp_path / "prof.toml").transfer_costs(), costs)  # the TOML carries them
    # --max-noise 0: any spread is too much, and the user is told (the files are still written)
    assert summary["noisy"].startswith("the machine is too noisy to calibrate") == (fit["noise_floor_pct"] > 0)
    assert cl.names == ["cpu:0", "cpu:1"] and cl.metadata["tf_devices"] == testbed.spec.tf_devices
    # TF workers' transfers run side by side (gRPC): the calibrated links do not queue
    assert cl.link_queue == "none" and summary["link_queue"] == "none"
    assert prof.coverage(mlp.graph, "cpu") == {"measured": mlp.graph.n_ops, "fitted": 0, "roofline": 0}
    assert len(prof.links) == 2 and len(prof.step_overhead_us) == 2
    assert (tmp_path / "prof.toml").exists()

    placement = tmp_path / "rr.json"
    cm = CostModel(mlp.graph, cl, profile=prof)
    p = mlp.graph.to_placement((np.arange(mlp.graph.n_groups) % 2).astype(np.int32))
    placement.write_text(json.dumps(cm.placement_to_json(p)))
    _fresh_keras()
    r = CliRunner().invoke(cli, ["verify", "-g", "mlp", "--batch", "16", "-p", str(placement),
                                 "--profile", str(out), "--cluster-spec", str(spec), "--steps", "3",
                                 "--warmup", "1", "--json"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    d = json.loads(r.output[r.output.index("{"):])
    assert d["measured_us"] > 0 and d["devices_used"] == ["cpu:0", "cpu:1"]
    assert d["predicted_us"] == pytest.approx(d["simulated_us"] + prof.step_overhead(2))
    assert d["error_pct"] == pytest.approx(100 * (d["predicted_us"] - d["measured_us"]) / d["measured_us"])
    # beside one device in paired rounds, with the sentinel's noise floor
    assert d["noise_floor_pct"] >= 0 and d["one_device_us"] > 0
    assert d["ratio_to_one_device"] == pytest.approx(float(np.median(d["ratios_to_one_device"])))

    # a placement naming a device the cluster lacks is refused before anything runs
    bad = json.loads(placement.read_text())
    bad["devices"][mlp.graph.names[0]] = "gpu:7"
    placement.write_text(json.dumps(bad))
    _fresh_keras()
    r = CliRunner().invoke(cli, ["verify", "-g", "mlp", "--batch", "16", "-p", str(placement),
                                 "--profile", str(out), "--cluster-spec", str(spec)])
    assert isinstance(r.exception, UserError) and "unknown device 'gpu:7'" in str(r.exception)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_worker_that_does_not_come_up_is_an_error_and_no_orphans():
    from placetool.costmodel.tf.testbed import Testbed, TestbedError

    def ours():
        out = subprocess.run(["pgrep", "-f", f"placetool-testbed-worker.*--parent {os.getpid()}"],
                             capture_output=True, text=True)
        return {int(x) for x in out.stdout.split() if _alive(int(x))}

    before = ours()  # other tests' workers, if any
    t = time.monotonic()
    with pytest.raises(TestbedError, match="worker 0 .* not ready after 0.01 s"):
        Testbed.start(1, timeout_s=0.01)
    assert time.monotonic() - t < 10
    assert ours() <= before  # the worker it started is gone again


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_their_parent(sig, tmp_path):
    code = ("from placetool.costmodel.tf.testbed import Testbed\n"
            "with Testbed.start(1, timeout_s=100) as tb:\n"
            "    print(' '.join(map(str, tb.pids)), flush=True)\n"
            "    import time; time.sleep(100)\n")
    # a SIGKILLed parent cannot remove its workers' log folder: make it under tmp_path
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
        # SIGKILL: no atexit, no handler, the workers must notice; SIGTERM: clean unwinding
        parent.send_signal(sig)
        assert parent.wait(timeout=10) == (-9 if sig == signal.SIGKILL else 128 + signal.SIGTERM)
        assert _wait_dead(pids, timeout=15)
        if sig == signal.SIGTERM:  # unwound: the testbed removed the log folder it made
            assert not list(tmp_path.glob("placetool-testbed-*"))
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_testbed_up_status_down_cli(tmp_path):
    from click.testing import CliRunner

    from placetool.cli.main import cli

    state = tmp_path / "tb.json"
    r = CliRunner().invoke(cli, ["testbed", "up", "--workers", "1", "--state", str(state), "--json"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    pids = json.loads(r.output)["pids"]
    try:
        r = CliRunner().invoke(cli, ["testbed", "status", "--state", str(state), "--json"])
        assert json.loads(r.output)["up"] is True
        r = CliRunner().invoke(cli, ["testbed", "up", "--workers", "1", "--state", str(state)])
        assert isinstance(r.exception, UserError) and "already up" in str(r.exception)
        r = CliRunner().invoke(cli, ["testbed", "down", "--state", str(state), "--json"])
        d = json.loads(r.output)
        assert (d["stopped"], d["state"]) == (1, str(state))
        assert d["removed_logs"] and not Path(d["removed_logs"]).exists()  # the workers' log folder
        assert _wait_dead(pids) and not state.exists()
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_calibrate_identifies_worker_costs_from_its_own_traced_steps(mlp, testbed, tmp_path):
    """``calibrate --worker-costs traces`` on TF workers (``links.send`` workers, the default
    there): the per-message costs come from traced split steps of the session itself,
    replayed; the links stay the lone transfers' and every device carries the identified
    costs."""
    from click.testing import CliRunner

    from placetool.cli.main import cli
    from placetool.costmodel.tf.calibrate import designed_splits

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"worker": testbed.spec.workers}))
    out = tmp_path / "prof.json"
    _fresh_keras()
    r = CliRunner().invoke(cli, ["calibrate", "-g", "mlp", "--batch", "16", "--cluster-spec", str(spec),
                                 "--out", str(out), "--reps", "3", "--max-transfer", "65536", "--trace-steps", "1",
                                 "--split-steps", "1", "--rounds", "2", "--worker-costs", "traces"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    logs = r.output.splitlines()
    prof = load_profile(out)
    cl = prof.cluster()
    wf = prof.meta["worker_fit"]
    splits = [lb for lb, _, _ in designed_splits(mlp.graph, testbed.spec) if not lb.startswith("single:")]
    assert cl.link_send == "workers" and cl.link_queue == "none" and "transfer_fit" not in prof.meta
    assert wf["n_steps"] == len(splits)  # one traced step of each
    assert 900 <= wf["evaluations"] <= 1100  # the search's budget of cost points
    c, rc, m = wf["costs"], wf["replay_costs"], wf["message_inflation"]
    assert all(v >= 0 for v in [*c.values(), *m.values()]) and rc["send_us_per_byte"] == rc["recv_us_per_byte"]
    # the replay's costs plus what the traced ops hold per message against the profile
    assert c["handler_us"] == pytest.approx(rc["handler_us"] + m["send_us"])
    assert c["recv_us_per_byte"] == pytest.approx(rc["recv_us_per_byte"] + m["recv_us_per_byte"])
    assert c["request_us"] == rc["request_us"]
    for d in cl.devices:
        assert (d.request_us, d.send_us, d.send_us_per_byte, d.recv_us, d.recv_us_per_byte) == (
            c["request_us"], c["handler_us"], c["send_us_per_byte"], c["arrive_us"], c["recv_us_per_byte"])
    assert [cl.latency_us[0, 1], cl.latency_us[1, 0]] == [l["latency_us"] for l in prof.links]
    assert 0 <= wf["median_abs_error_pct"] <= wf["max_abs_error_pct"] and wf["op_inflation"] > 0
    rows = wf["steps"]
    assert len(rows) == wf["predicted"]["n"] == len(designed_splits(mlp.graph, testbed.spec))
    err = [abs(100 * (x["predicted_us"] - x["measured_us"]) / x["measured_us"]) for x in rows]
    assert wf["predicted"]["max_abs_error_pct"] == pytest.approx(max(err))
    assert any("worker costs (from" in m for m in logs)
    shown = next(m for m in logs if "per message on the compute threads" in m)
    assert f"handler {c['handler_us']:,.1f} µs + {c['send_us_per_byte'] * 1e6:,.0f} µs/MB" in shown
    assert any(m.strip().startswith("traced split steps replayed: median |error|") for m in logs)
