"""`placetool search --verify-top K`: the best placements found are run on a real testbed."""

import json
import subprocess
import sys

import pytest

CPU2 = """
name = "cpu2"
[[devices]]
name = "w0"
kind = "cpu"
memory_bytes = 8000000000
[[devices]]
name = "w1"
kind = "cpu"
memory_bytes = 8000000000
[links.default]
latency_us = 200.0
bandwidth_bytes_per_us = 1000.0
"""


def placetool(*args):
    return subprocess.run([sys.executable, "-m", "placetool.cli.main", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_verify_top_measures_the_k_best_on_a_two_worker_testbed(tmp_path):
    cluster = tmp_path / "cpu2.toml"
    cluster.write_text(CPU2)
    graph = tmp_path / "mlp.npz"
    r = placetool("import", "mlp", "--out", str(graph), "--batch", "32")
    assert r.returncode == 0, r.stderr
    r = placetool("search", "-g", str(graph), "-c", str(cluster), "--method", "random", "--budget-evals", "40",
                  "--verify-top", "2", "--testbed", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["verified"]["measured"]
    assert sorted(x["rank"] for x in rows) == [0, 1]
    assert all(x["measured_us"] > 0 for x in rows)
    assert rows[0]["measured_us"] <= rows[1]["measured_us"]  # best measured first
    assert min(x["predicted_us"] for x in rows) == pytest.approx(out["step_time_us"])


@pytest.mark.parametrize("args,msg", [
    (["-g", "synthetic-1k", "--verify-top", "2", "--testbed", "2"], "not a zoo model"),
    (["-g", "nmt", "--verify-top", "2"], "needs --testbed N"),
    (["-g", "nmt", "--verify-top", "2", "--testbed", "2"], "has 5 devices but 2"),
])
def test_verify_top_refuses_before_searching(args, msg):
    r = placetool("search", "--method", "single", *args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
