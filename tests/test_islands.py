"""``islands``: sa spread over a Dask cluster's workers, sharing the best after each epoch."""

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

from placetool.costmodel import CostModel, presets
from placetool.search import Budget, Problem, run

from .test_cli_errors import user_error

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def client():
    from placetool.search.sweeps.sweep import connect_dask

    c, cluster = connect_dask(dask=True, workers=2)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def problem():
    return Problem(CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2")))


def test_islands_share_the_best_and_count_every_evaluation(client, problem):
    r = run("islands", problem, Budget(evals=600), seed=3, client=client, epochs=3)
    m = r.metadata
    assert m["workers"] == 2 and [e["workers"] for e in m["epochs"]] == [2, 2, 2]
    assert m["islands_dropped"] == 0
    # every island's evaluations count against the one budget, and none beyond it
    assert r.evaluations == m["island_evaluations"] <= 600
    assert r.evaluations >= 600 - 2 * 3  # shares are rounded down per island
    # each epoch starts every island from the best so far, so the best never gets worse
    bests = [e["best_step_us"] for e in m["epochs"]]
    assert all(b2 <= b1 for b1, b2 in zip(bests, bests[1:]))
    assert r.step_time_us == bests[-1]
    # the reported step time is the simulator's for the reported placement
    assert r.step_time_us == pytest.approx(problem.cost_model.simulate(r.placement).step_time_us, rel=1e-12)
    assert r.feasible


def test_islands_hand_on_their_best_few_placements_where_they_are_kept(client, problem):
    # --verify-top K measures the K best distinct placements the search scored, the
    # islands' too, not only the best each island reported
    r = run("islands", problem, Budget(evals=200), seed=5, client=client, epochs=1, keep_top=5)
    steps = [t[0] for t in r.top]
    assert len(r.top) == 5 and steps == sorted(steps) and steps[0] == r.step_time_us
    assert len({t[2].tobytes() for t in r.top}) == 5 and r.evaluations <= 200


def test_islands_are_reproducible_under_an_evaluation_budget(client, problem):
    a = run("islands", problem, Budget(evals=200), seed=5, client=client, epochs=2)
    b = run("islands", problem, Budget(evals=200), seed=5, client=client, epochs=2)
    assert np.array_equal(a.assignment, b.assignment) and a.step_time_us == b.step_time_us


def test_sa_start_replaces_the_seeding(problem):
    start = np.zeros(problem.n_groups, np.int32)
    start[:] = np.argmax(problem.allowed, axis=1)
    r = run("sa", problem, Budget(evals=40), seed=0, start=start)
    assert r.metadata["seeds"] == ["start"]
    first = problem.cost_model.simulate(problem.placement(start)).step_time_us
    assert r.history[0][0] == 1 and r.history[0][2] == pytest.approx(first)
    with pytest.raises(Exception, match="start must be a valid assignment"):
        run("sa", problem, Budget(evals=4), start=np.zeros(3, np.int32))


def test_cli_refuses_islands_of_another_method(capsys):
    user_error(["search", "-g", "synthetic-1k", "-c", "k80x2", "-m", "heft", "--dask"], capsys, "need --method sa")
    user_error(["search", "-g", "synthetic-1k", "-c", "k80x2", "--workers", "2"], capsys,
               "--workers only applies with --dask")
    user_error(["search", "-g", "synthetic-1k", "-c", "k80x2", "--dask", "--scheduler", "tcp://127.0.0.1:1"],
               capsys, "only one of --dask, --scheduler")


def _start(args, **kw):
    return subprocess.Popen([str(BIN / "dask"), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, **kw)


@pytest.mark.slow
def test_external_cluster_survives_a_killed_worker(tmp_path):
    """`search --scheduler` against `dask scheduler` + two `dask worker`s; one worker is
    killed mid-search: the search finishes within its budget with what it had."""
    sched_file = tmp_path / "scheduler.json"
    procs = [_start(["scheduler", "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)])]
    try:
        for _ in range(300):
            if sched_file.exists() and sched_file.stat().st_size:
                break
            time.sleep(0.1)
        addr = json.loads(sched_file.read_text())["address"]
        workers = [_start(["worker", addr, "--nthreads", "1", "--no-nanny", "--no-dashboard"]) for _ in range(2)]
        procs += workers
        from distributed import Client

        budget = 16.0
        with Client(addr, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
            t0 = time.perf_counter()
            search = subprocess.Popen([str(BIN / "placetool"), "search", "-g", "nmt", "-c", "k80x4", "-m", "sa",
                                       "--scheduler", addr, "--budget-seconds", str(budget), "--option",
                                       "epochs=2", "--json", "--no-progress"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # kill a worker once both run an island of the first epoch
            while time.perf_counter() - t0 < 60 and sum(map(len, c.processing().values())) < 2:
                time.sleep(0.1)
            time.sleep(1.0)
            os.killpg(workers[0].pid, signal.SIGKILL)
            out, err = search.communicate(timeout=budget + 60)
        wall = time.perf_counter() - t0
        assert search.returncode == 0, err[-2000:]
        d = json.loads(out)
        m = d["metadata"]
        assert d["method"] == "islands" and d["feasible"]
        assert m["cluster"] == "external" and m["workers"] == 2
        # the killed worker's island was rerun on the survivor and reported: nothing lost;
        # any later epoch ran on the survivor alone
        assert m["epochs"][0]["workers"] == 2 and m["epochs"][0]["islands_reported"] == 2
        assert all(e["workers"] == 1 for e in m["epochs"][1:])
        assert m["epochs"][-1]["best_step_us"] == d["step_time_us"]
        assert wall < budget + 10 + 5  # the process's own start-up on top of the budget's +10 s
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
