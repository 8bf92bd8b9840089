"""Clusters of hundreds of devices: memory that grows with the transfers booked, not with
device pairs; budgets kept; a cluster past the simulator's limit refused in one line."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from placetool.cli.main import main
from placetool.costmodel import Cluster, CostModel, presets
from placetool.costmodel.cluster import MAX_DEVICES, ClusterError
from placetool.search import Budget, Problem, run
from placetool.search import BudgetExhausted, Tracker
from placetool.search.listsched import heft


def cluster_file(path, n_devices: int):
    """One CPU and ``n_devices - 1`` GPUs with one default link."""
    out = [f'name = "scale{n_devices}"']
    for i in range(n_devices):
        kind, name = ("cpu", "cpu:0") if i == 0 else ("gpu", f"gpu:{i - 1}")
        out += ["[[devices]]", f'name = "{name}"', f'kind = "{kind}"', f"memory_bytes = {12 << 30}"]
    out += ["[links.default]", "latency_us = 10.0", "bandwidth_bytes_per_us = 12000.0"]
    path.write_text("\n".join(out) + "\n")
    return path


def capped(args, gb: int = 4):
    """The CLI in a child process held to ``gb`` GiB of address space (two numba threads
    and two malloc arenas, so that the cap measures our arrays, not the machine's cores)."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (gb << 30, gb << 30))

    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
    return subprocess.run([sys.executable, "-m", "placetool.cli.main", *map(str, args)], capture_output=True,
                          text=True, preexec_fn=cap, env=env, timeout=300)


def test_a_cluster_past_the_limit_is_refused_in_one_line(tmp_path, capsys):
    path = cluster_file(tmp_path / "big.toml", MAX_DEVICES + 1)
    with pytest.raises(SystemExit) as e:
        main(["search", "-g", "synthetic-20", "-c", str(path), "-m", "sa", "--budget-seconds", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "big.toml" in err and "1,025 devices" in err and "at most 1,024" in err


def test_the_limit_itself_loads_and_a_cluster_built_past_it_is_refused(tmp_path):
    cl = Cluster.load(cluster_file(tmp_path / "c.toml", MAX_DEVICES))
    assert cl.n_devices == MAX_DEVICES == 1024
    CostModel(presets.load_graph("synthetic-20"), cl)
    D = MAX_DEVICES + 1
    big = Cluster("built", cl.devices + [cl.devices[-1].__class__(**{**cl.devices[-1].__dict__, "name": "x"})],
                  np.zeros((D, D)), np.ones((D, D)))
    with pytest.raises(ClusterError, match="cluster 'built': 1,025 devices; .* at most 1,024"):
        CostModel(presets.load_graph("synthetic-20"), big)


def test_heft_at_512_devices_fits_in_4_gb(tmp_path):
    # one timeline per device pair, each with room for every transfer of the graph, took
    # 512^2 x 2,000 x 16 bytes = 8.4 GB on synthetic-1k
    r = capped(["search", "-g", "synthetic-1k", "-c", cluster_file(tmp_path / "c.toml", 512), "-m", "heft",
                "--json", "-q"])
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["feasible"] and d["evaluations"] == 2
    assert d["metadata"]["simulated_us"] == d["step_time_us"] >= d["lower_bound_us"]


def test_sa_seeded_by_heft_at_256_devices_keeps_its_budget(tmp_path):
    # heft's one timeline per device pair (2 GB here) took 10-30 s to fill, past the budget.
    # Now it takes 0.5-0.6 s on a quiet machine: 4 s leaves its 40% seeding share room
    # beside another test worker (2 s did not, once in a full run)
    r = capped(["search", "-g", "synthetic-1k", "-c", cluster_file(tmp_path / "c.toml", 256), "-m", "sa",
                "--option", "seeds=heft", "--budget-seconds", "4", "--json", "-q"])
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["feasible"] and d["seconds"] <= 4 + 0.5, d["seconds"]
    assert d["metadata"]["seeds"][0] == "heft"


def test_metis_asked_for_hundreds_of_parts_keeps_the_json_output_clean(tmp_path):
    # METIS prints "Cannot bisect a graph with 0 vertices!" with C's printf on stdout
    r = capped(["search", "-g", "synthetic-1k", "-c", cluster_file(tmp_path / "c.toml", 512), "-m", "metis",
                "--json", "-q"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["metadata"]["parts"] == 511


def test_a_list_scheduler_seeding_a_search_stops_at_the_end_of_its_share(tmp_path):
    p = Problem(CostModel(presets.load_graph("synthetic-1k"), Cluster.load(cluster_file(tmp_path / "c.toml", 128))))
    t = Tracker(p, Budget(seconds=60))
    with t.sub_budget(0.001):
        with pytest.raises(BudgetExhausted):
            heft(p, t.budget, 0, t)
    assert t.evaluations == 0
    # run on its own it always answers, as every one-shot method does
    assert run("heft", p, Budget(seconds=1e-9)).evaluations >= 1


def test_single_simulates_one_device_of_each_kind_of_twin():
    cm = CostModel(presets.load_graph("synthetic-200"), presets.load_cluster("k80x4"))
    p = Problem(cm)
    r = run("single", p, Budget(evals=100))
    assert (r.metadata["candidates"], r.metadata["simulated"]) == (5, 2)
    fallback = np.argmax(p.allowed, axis=1)
    every = cm.simulate_batch(np.stack([np.where(p.allowed[:, d], d, fallback) for d in range(5)]))
    best = np.flatnonzero(every.feasible)[np.argmin(every.step_time_us[every.feasible])]
    assert r.step_time_us == every.step_time_us[best] and r.evaluations == 5
    # a GPU with less memory is no twin of the others
    d = presets.load_cluster("k80x4").to_dict()
    d["devices"][3]["memory_bytes"] = 1 << 30
    assert run("single", Problem(CostModel(cm.graph, Cluster.from_dict(d))), Budget(evals=100)).metadata[
        "simulated"] == 3
