"""`placetool simulate` end to end, in a real subprocess."""

import json
import subprocess
import sys

import numpy as np
import pytest


def placetool(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "placetool.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_simulate_json_on_a_bundled_graph():
    r = placetool("simulate", "--graph", "synthetic-10k", "--cluster", "k80x4", "--placement", "round-robin", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["step_time_us"] > 0 and out["feasible"] is True
    assert set(out["busy_us"]) == {"cpu:0", "gpu:0", "gpu:1", "gpu:2", "gpu:3"}
    assert out["lower_bound_us"] <= out["step_time_us"]


def test_trace_plot_and_placement_file_round_trip(tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    r = placetool("simulate", "-p", "random:3", "--trace", str(trace), "--plot", str(png), "--json")
    assert r.returncode == 0, r.stderr
    step = json.loads(r.stdout)["step_time_us"]
    assert any(e.get("ph") == "X" for e in json.loads(trace.read_text())["traceEvents"])
    assert png.stat().st_size > 1000
    # write the same placement as a placement file and simulate it again
    from placetool.costmodel import CostModel, presets
    from placetool.cli.simulate import parse_placement

    cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))
    p = parse_placement("random:3", cm)
    f = tmp_path / "p.json"
    f.write_text(json.dumps(cm.placement_to_json(p, step)))
    r = placetool("simulate", "-p", str(f), "--json")
    assert json.loads(r.stdout)["step_time_us"] == step


@pytest.mark.parametrize("args,msg", [
    (["--graph", "nope"], "unknown graph 'nope'"),
    (["--cluster", "nope"], "unknown cluster 'nope'"),
    (["-p", "single:gpu:9"], "unknown device 'gpu:9'"),
    (["-p", "sideways"], "placement 'sideways'"),
    (["-p", "missing.json"], "no such placement file"),
    (["--trace", "/nonexistent/dir/t.json"], "does not exist"),
])
def test_user_mistakes_are_one_line_and_exit_2(args, msg):
    r = placetool("simulate", *args)
    assert r.returncode == 2
    assert msg in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_wrong_length_placement_file(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"devices": {"L0/IteratorGetNext_0": "cpu:0"}}))
    r = placetool("simulate", "-p", str(f))
    assert r.returncode == 2 and "names no device for op" in r.stderr


def test_infeasible_placement_writes_no_trace(tmp_path):
    from placetool.costmodel import CostModel, presets

    cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))
    f = tmp_path / "p.json"
    # every op on gpu:0, including the input ops that have no GPU kernel
    f.write_text(json.dumps(cm.placement_to_json(np.full(cm.graph.n_ops, cm.cluster.device_index("gpu:0")))))
    trace = tmp_path / "t.json"
    r = placetool("simulate", "-p", str(f), "--trace", str(trace))
    assert r.returncode == 2 and "no kernel on gpu:0" in r.stderr
    assert not trace.exists()


def test_single_device_keeps_pinned_ops_on_the_host():
    r = placetool("simulate", "-p", "single:gpu:0", "--json")
    out = json.loads(r.stdout)
    assert out["feasible"] and out["busy_us"]["gpu:0"] > 10 * out["busy_us"]["cpu:0"] > 0
