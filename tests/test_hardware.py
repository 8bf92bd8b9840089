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
from placetool.costmodel.calibration import (OpFit, Profile, ProfileError, count_latency, fit_link,
                                   fit_op_type, load_profile)
from placetool.costmodel.errors import UserError

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


def test_latency_fit_to_steps_recovers_the_true_latency():
    from placetool.costmodel.tf.calibrate import fit_latency_to_steps

    g = _chain()
    true = make_cluster(2, latency=120.0, bandwidth=50.0, kinds=["cpu", "cpu"])
    prof = Profile(devices=[], step_overhead_us=[10.0, 30.0])
    prof.add_op_medians("cpu", g, {"a": 10.0, "b": 1.0, "c": 30.0, "d": 2.0})
    cm = CostModel(g, true, profile=prof)
    samples = []
    for p in ([0, 1, 0, 1], [0, 0, 1, 1], [1, 0, 0, 0]):
        p = np.array(p, np.int32)
        samples.append((g, p, cm.simulate(p).step_time_us + prof.step_overhead(2)))
    guess = make_cluster(2, latency=1.0, bandwidth=50.0, kinds=["cpu", "cpu"])
    L, err = fit_latency_to_steps(samples, guess, prof, grid=np.array([0.0, 60.0, 120.0, 240.0]))
    assert L == 120.0 and err == pytest.approx(0.0, abs=1e-12)


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
    assert m2.transfers and {x["dst"] for x in m2.transfers} == set(testbed.spec.tf_devices)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_verify_top_measures_the_k_best_predicted(mlp, testbed):
    from placetool.costmodel.tf.runner import verify_top

    g = mlp.graph
    cl = make_cluster(2, kinds=["cpu", "cpu"])
    single = np.zeros(g.n_ops, np.int32)
    split = g.to_placement((np.arange(g.n_groups) % 2).astype(np.int32))
    other = np.ones(g.n_ops, np.int32)
    rows = verify_top(mlp, cl, [split, single, other], k=2, predicted=[300.0, 100.0, 200.0],
                      spec=testbed.spec, warmup=1, steps=2)
    # the two best predictions (single: 100, other: 200) were measured, split was not
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert sorted(r["predicted_us"] for r in rows) == [100.0, 200.0]
    assert [r["measured_us"] for r in rows] == sorted(r["measured_us"] for r in rows)
    for r in rows:
        assert r["measured_us"] > 0
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_us"] - r["measured_us"]) / r["measured_us"])


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
                                 "--trace-steps", "2", "--json"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    prof = load_profile(out)
    cl = prof.cluster()
    assert cl.names == ["cpu:0", "cpu:1"] and cl.metadata["tf_devices"] == testbed.spec.tf_devices
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
def test_workers_die_with_their_parent(sig):
    code = ("from placetool.costmodel.tf.testbed import Testbed\n"
            "with Testbed.start(1, timeout_s=100) as tb:\n"
            "    print(' '.join(map(str, tb.pids)), flush=True)\n"
            "    import time; time.sleep(100)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
        # SIGKILL: no atexit, no handler, the workers must notice; SIGTERM: clean unwinding
        parent.send_signal(sig)
        assert parent.wait(timeout=10) == (-9 if sig == signal.SIGKILL else 128 + signal.SIGTERM)
        assert _wait_dead(pids, timeout=15)
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
