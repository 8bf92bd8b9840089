"""Sweeps (`placetool sweep`), the results store and `placetool report`, end to end.

The grids use small synthetic graphs and the methods that ship with search/ today
(single, round-robin, random); failures come from real errors (a cluster too small for
the graph's parameters, a worker process that dies, a run past its timeout).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from placetool import search
from placetool.costmodel import CostModel, UserError, presets
from placetool.search.sweeps.report import markdown, summarize, tables
from placetool.search.sweeps.store import KEY, ResultStore, StoreError
from placetool.search.sweeps.sweep import SweepError, cpu_count, load_sweep, run_one, run_sweep

from .helpers import compiling

ROOT = Path(__file__).resolve().parents[1]

GRID = """
[sweep]
graphs = ["synthetic-100", "synthetic-200"]
clusters = ["k80x2"]
methods = ["single", "round-robin", "random"]
seeds = [0, 1]
budget_evals = 20
"""

# Every device far too small for synthetic-100's 10.6 MB of parameters.
TINY_CLUSTER = """
name = "tiny"
[[devices]]
name = "cpu:0"
kind = "cpu"
memory_bytes = 1000
[[devices]]
name = "gpu:0"
kind = "gpu"
memory_bytes = 1000
[links.default]
latency_us = 10.0
bandwidth_bytes_per_us = 1.0e4
"""


def placetool(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "placetool.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)})


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def local_result(graph, cluster, method, seed, evals, **options):
    cm = CostModel(presets.load_graph(graph), presets.load_cluster(cluster))
    return search.run(method, search.Problem(cm), search.Budget(evals=evals), seed=seed, **options)


# ------------------------------------------------------------------ the sweep file
def test_grid_is_the_product_with_per_method_options(tmp_path):
    f = write(tmp_path / "s.toml", GRID.replace("budget_evals = 20", "budget_evals = 20\nbudget_seconds = 2.5")
              + "\n[options.random]\nbatch = 8\n")
    sw = load_sweep(f)
    runs = sw.runs()
    assert len(sw) == len(runs) == 2 * 1 * 3 * 2
    assert len({r.key for r in runs}) == 12
    assert {(r.graph, r.method, r.seed) for r in runs} == {
        (g, m, s) for g in ("synthetic-100", "synthetic-200") for m in ("single", "round-robin", "random")
        for s in (0, 1)}
    assert all(r.budget == "evals=20,seconds=2.5" for r in runs)
    assert {r.options for r in runs if r.method == "random"} == {(("batch", 8),)}
    assert {r.options for r in runs if r.method != "random"} == {()}


def test_relative_paths_are_taken_from_the_sweep_folder(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "tiny.toml", TINY_CLUSTER)
    write(tmp_path / "sub" / "s.toml", GRID.replace('clusters = ["k80x2"]', 'clusters = ["tiny.toml"]'))
    monkeypatch.chdir(tmp_path)
    sw = load_sweep("sub/s.toml")
    assert sw.sources["cluster", "tiny.toml"] == str((tmp_path / "sub" / "tiny.toml").resolve())
    assert sw.sources["graph", "synthetic-100"] == "synthetic-100"


BAD = [
    ("[sweep\ngraphs = 1", "not valid TOML"),
    ('[other]\nx = 1', "unknown table or key 'other'"),
    ('x = 1', "unknown table or key 'x'"),
    ('[options.single]\n', "no [sweep] table"),
    (GRID.replace('clusters = ["k80x2"]\n', ""), "[sweep] clusters is missing"),
    (GRID.replace('"random"]', '"nope"]'), "unknown method 'nope'"),
    (GRID.replace('"synthetic-200"', '"no-such-graph"'), "unknown graph 'no-such-graph'"),
    (GRID.replace('"k80x2"', '"k99x9"'), "unknown cluster 'k99x9'"),
    (GRID.replace('"k80x2"', '"missing.toml"'), "unknown cluster 'missing.toml'"),
    (GRID.replace("budget_evals = 20", ""), "needs budget_seconds or budget_evals"),
    (GRID.replace("budget_evals = 20", "budget_evals = 0"), "budget_evals must be a positive integer"),
    (GRID.replace("budget_evals = 20", "budget_seconds = -1"), "budget_seconds must be a positive finite number"),
    (GRID.replace("budget_evals = 20", "budget_seconds = inf"), "budget_seconds must be a positive finite number"),
    (GRID.replace('"synthetic-200"', '"synthetic-1"'), "synthetic graph has 2 to"),
    (GRID.replace("seeds = [0, 1]", 'seeds = ["a"]'), "seeds must be a non-empty list of integers"),
    (GRID.replace('methods = ["single", ', 'methods = ["single", "single", '), "methods lists 'single' twice"),
    (GRID.replace("graphs = [", "graphs = [7, "), "graphs must be a non-empty list of names"),
    (GRID.replace("budget_evals = 20", "budget_evals = 20\nbudget = 5"), "[sweep] has unknown key 'budget'"),
    (GRID + "\n[options.sa]\nsteps = 3\n", "[options.sa] is for a method the sweep does not run"),
    (GRID + "\n[options.random]\nbogus = 3\n", "method 'random' takes no option 'bogus' (its options: batch)"),
    (GRID + "\n[options.single]\nbatch = 3\n", "method 'single' takes no option 'batch' (its options: none)"),
    (GRID + "\n[options.random]\nseed = 3\n", "method 'random' takes no option 'seed'"),
    (GRID + "\n[options.random]\nbatch = 0\n", "[options.random] method 'random': option 'batch' must be an integer >= 1, got 0"),
    (GRID.replace('"random"]', '"random", "sa"]') + '\n[options.sa]\nseeds = "bogus"\n',
     "[options.sa] method 'sa': option 'seeds' must be seeding methods"),
]


@pytest.mark.parametrize("text,msg", BAD, ids=[m for _, m in BAD])
def test_malformed_sweep_files_are_user_errors(tmp_path, text, msg):
    f = write(tmp_path / "bad.toml", text)
    with pytest.raises(SweepError) as e:
        load_sweep(f)
    assert msg in str(e.value)
    assert str(f) in str(e.value)  # the message names the file
    assert isinstance(e.value, UserError)


def test_cli_rejects_a_bad_sweep_before_anything_runs(tmp_path):
    f = write(tmp_path / "bad.toml", GRID.replace('"random"]', '"nope"]'))
    db = tmp_path / "r.db"
    r = placetool("sweep", str(f), "--results", str(db))
    assert r.returncode == 2, r.stderr
    assert "unknown method 'nope'" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not db.exists() and not (tmp_path / "r-placements").exists()
    r = placetool("sweep", str(write(tmp_path / "ok.toml", GRID)), "--dask", "--scheduler", "tcp://x:1")
    assert r.returncode == 2 and "at most one of" in r.stderr


# ------------------------------------------------------------------ the store
def test_store_has_one_row_per_grid_point_and_rejects_foreign_files(tmp_path):
    s = ResultStore(tmp_path / "r.db")
    key = dict(graph="g", cluster="c", method="random", seed=0, budget="evals=5", options="{}")
    s.put({**key, "status": "failed", "error": "X: boom"})
    s.put({**key, "status": "ok", "step_time_us": 12.5, "history": [[1, 0.1, 12.5]]})
    s.put({**key, "seed": 1, "status": "ok", "step_time_us": 11.0})
    assert s.count() == 2 and s.count("ok") == 2 and s.count("failed") == 0
    rows = s.rows()
    assert [(r["seed"], r["step_time_us"], r["error"]) for r in rows] == [(0, 12.5, None), (1, 11.0, None)]
    assert rows[0]["history"] == [[1, 0.1, 12.5]]
    assert s.statuses() == {("g", "c", "random", 0, "evals=5", "{}"): "ok", ("g", "c", "random", 1, "evals=5", "{}"): "ok"}
    with pytest.raises(sqlite3.IntegrityError):  # the status column takes ok / failed only
        s.put({**key, "status": "maybe"})
    s.close()
    db = sqlite3.connect(tmp_path / "other.db")
    db.execute("CREATE TABLE runs (x INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 0"):
        ResultStore(tmp_path / "other.db")
    write(tmp_path / "junk.db", "this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a results database"):
        ResultStore(tmp_path / "junk.db")
    with pytest.raises(StoreError, match="no such results file"):
        ResultStore(tmp_path / "none.db", create=False)
    assert KEY == ("graph", "cluster", "method", "seed", "budget", "options")


# ------------------------------------------------------------------ Dask
@pytest.fixture(scope="module")
def dask_sweep(tmp_path_factory):
    """The 2 graphs x 3 methods x 2 seeds grid on a real 2-worker Dask LocalCluster."""
    d = tmp_path_factory.mktemp("dask")
    sw = load_sweep(write(d / "s.toml", GRID))
    with ResultStore(d / "r.db") as st:
        summary = run_sweep(sw, st, dask=True, workers=2, placements_dir=d / "placements")
    return d, sw, summary


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dask_sweep_records_every_run_and_resumes(dask_sweep):
    d, sw, summary = dask_sweep
    assert summary["runner"] == "dask" and summary["ran"] == 12 and summary["ok"] == 12, summary
    with ResultStore(d / "r.db", create=False) as st:
        rows = st.rows()
    assert len(rows) == 12 and all(r["status"] == "ok" for r in rows)
    for r in rows:  # a worker's answer is the answer of the same search run here (same seed, same result)
        want = local_result(r["graph"], r["cluster"], r["method"], r["seed"], 20)
        assert r["step_time_us"] == want.step_time_us
        assert r["evaluations"] == want.evaluations
        assert r["lower_bound_us"] == want.lower_bound_us <= r["step_time_us"]
        assert r["history"][-1][2] == r["step_time_us"]
        assert r["versions"]["numba"] and r["host"] and r["timestamp"] and r["attempts"] == 1
        assert r["numba_threads"] == max(1, cpu_count() // 2)  # 2 workers share the cores
        cm = CostModel(presets.load_graph(r["graph"]), presets.load_cluster(r["cluster"]))
        assert cm.simulate(cm.load_placement(r["placement_path"])).step_time_us == r["step_time_us"]
    def key(r):
        return (r["graph"], r["cluster"], r["method"], r["seed"], r["budget"], json.dumps(r["options"]))

    before = {key(r): r["timestamp"] for r in rows}
    with ResultStore(d / "r.db") as st:
        again = run_sweep(sw, st, dask=True, workers=2, placements_dir=d / "placements")
        assert again["ran"] == 0 and again["skipped"] == 12 and st.count() == 12
        assert {key(r): r["timestamp"] for r in st.rows()} == before


# ------------------------------------------------------------------ failures
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_that_raises_is_recorded_as_failed_while_the_others_finish(tmp_path):
    write(tmp_path / "tiny.toml", TINY_CLUSTER)
    f = write(tmp_path / "s.toml", GRID.replace('"synthetic-100", "synthetic-200"', '"synthetic-100"')
              .replace('"k80x2"', '"k80x2", "tiny.toml"').replace("seeds = [0, 1]", "seeds = [0]"))
    db = tmp_path / "r.db"
    r = placetool("sweep", str(f), "--results", str(db), "--workers", "2", "--json")
    assert r.returncode == 1, r.stderr  # some runs failed
    out = json.loads(r.stdout)
    assert (out["ran"], out["ok"], out["failed"]) == (6, 3, 3)
    with ResultStore(db, create=False) as st:
        rows = st.rows()
    ok = {(x["cluster"], x["method"]) for x in rows if x["status"] == "ok"}
    failed = [x for x in rows if x["status"] == "failed"]
    assert ok == {("k80x2", m) for m in ("single", "round-robin", "random")}
    assert {x["cluster"] for x in failed} == {"tiny.toml"} and len(failed) == 3
    assert all(x["numba_threads"] == max(1, cpu_count() // 2) for x in rows if x["status"] == "ok")
    for x in failed:
        assert x["error"].startswith("SearchError: cluster 'tiny' cannot hold the parameters")
        assert "Traceback" in x["traceback"] and x["step_time_us"] is None
    assert len(list((tmp_path / "r-placements").glob("*.json"))) == 3
    # resume: --skip-failed runs nothing; without it, the failed points run (and fail) again
    r = placetool("sweep", str(f), "--results", str(db), "--skip-failed", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ran"] == 0
    with ResultStore(db) as st:
        again = run_sweep(load_sweep(f), st, workers=1)
        assert (again["ran"], again["failed"], st.count()) == (3, 3, 6)


def flaky_run(run, threads=None):
    """A worker that dies under round-robin always, and under random the first time."""
    marker = Path(run.placements_dir) / f"died-{run.method}-{run.seed}"
    if run.method == "round-robin" or (run.method == "random" and not marker.exists()):
        marker.touch()
        os._exit(3)
    return run_one(run, threads)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_whose_worker_dies_is_retried(tmp_path):
    f = write(tmp_path / "s.toml", GRID.replace('"synthetic-100", "synthetic-200"', '"synthetic-100"')
              .replace("seeds = [0, 1]", "seeds = [0]"))
    seen = []
    with ResultStore(tmp_path / "r.db") as st:
        summary = run_sweep(load_sweep(f), st, workers=2, placements_dir=tmp_path, run_fn=flaky_run,
                            on_result=seen.append)
        rows = {r["method"]: r for r in st.rows()}
    assert (summary["ok"], summary["failed"]) == (2, 1) and len(seen) == 3
    # single may have been in flight beside round-robin when its worker died: then it ran twice
    assert rows["single"]["status"] == "ok" and rows["single"]["attempts"] in (1, 2)
    assert rows["random"]["status"] == "ok" and rows["random"]["attempts"] == 2
    assert rows["random"]["step_time_us"] == local_result("synthetic-100", "k80x2", "random", 0, 20).step_time_us
    rr = rows["round-robin"]  # died twice alone, maybe once more beside another run first
    assert rr["status"] == "failed" and rr["attempts"] in (2, 3)
    assert f"worker process died under it {rr['attempts']} times" in rr["error"]


@pytest.mark.timeout(60)
def test_a_run_past_its_timeout_fails_instead_of_hanging(tmp_path):
    f = write(tmp_path / "s.toml", """
[sweep]
graphs = ["synthetic-100"]
clusters = ["k80x2"]
methods = ["random"]
seeds = [0]
budget_seconds = 60
timeout_seconds = 0.5
""")
    with ResultStore(tmp_path / "r.db") as st:
        summary = run_sweep(load_sweep(f), st, workers=1)
        (row,) = st.rows()
    assert summary["failed"] == 1 and summary["seconds"] < 30
    assert row["error"] == "RunTimeout: run took longer than timeout_seconds = 0.5"


def _compiles_past_the_timeout(problem, budget, seed, tracker):
    """A first run on a machine: its kernels compile for longer than the run's timeout."""
    compiling(0.8)
    tracker.evaluate(np.zeros((1, problem.n_groups), np.int32))


def _half_second_run(monkeypatch, name: str, fn, what: str):
    """A one-evaluation run of ``fn``, registered as method ``name``, with a 0.5 s timeout."""
    from placetool.search import Budget
    from placetool.search import registry as B
    from placetool.search.sweeps.sweep import Run

    monkeypatch.setitem(B.REGISTRY, name, B.MethodInfo(name, fn, what, Budget(evals=1), None))
    return Run("synthetic-100", "synthetic-100", "k80x2", "k80x2", name, 0, 1, None, timeout_seconds=0.5)


@pytest.mark.timeout(60)
def test_a_runs_timeout_leaves_compiling_out_as_its_budget_does(monkeypatch):
    from placetool.search.sweeps import sweep

    run = _half_second_run(monkeypatch, "compiles-past-timeout", _compiles_past_the_timeout, "compiles, then scores")
    rec = run_one(run)
    assert rec["status"] == "ok", rec.get("error")
    assert rec["compile_seconds"] >= 0.8 and rec["wall_seconds"] > 0.8 and rec["evaluations"] == 1
    # but not for ever: a compile that does not return is a hang like any other
    monkeypatch.setattr(sweep, "COMPILE_GRACE_S", 0.1)
    rec = run_one(run)
    assert rec["status"] == "failed" and rec["error"] == "RunTimeout: run took longer than timeout_seconds = 0.5"
    assert rec["wall_seconds"] < 0.8


def _work(seconds: float) -> None:
    """``seconds`` of this thread's CPU time, in plain Python."""
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


class _SlowToFree:
    """Frees itself for a second of work, as llvmlite's compiled code does in ``__del__``."""

    def __del__(self):
        _work(1.0)


def _times_out_inside_a_finalizer(problem, budget, seed, tracker):
    """The run's timeout (0.5 s) comes while a finalizer runs (0-1 s), then plain work."""
    x = _SlowToFree()
    del x
    _work(10.0)
    tracker.evaluate(np.zeros((1, problem.n_groups), np.int32))


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped first one
def test_a_timeout_that_lands_in_a_finalizer_is_raised_again(monkeypatch):
    run = _half_second_run(monkeypatch, "times-out-in-del", _times_out_inside_a_finalizer, "frees slowly, then works")
    rec = run_one(run)
    # Python drops the first RunTimeout (raised inside __del__); the next one, after it, sticks
    assert rec["status"] == "failed" and rec["error"] == "RunTimeout: run took longer than timeout_seconds = 0.5"
    assert rec["wall_seconds"] < 5.0


# ------------------------------------------------------------------ report
def test_summary_numbers_are_means_and_sample_stds_over_seeds(tmp_path):
    st = ResultStore(tmp_path / "r.db")
    base = dict(graph="g", cluster="c", budget="evals=5", options="{}", status="ok", feasible=1, lower_bound_us=50.0)
    for seed, step in ((0, 100.0), (1, 100.0)):
        st.put({**base, "method": "expert", "seed": seed, "step_time_us": step})
    for seed, step in ((0, 80.0), (1, 120.0)):
        st.put({**base, "method": "random", "seed": seed, "step_time_us": step})
    st.put({**base, "method": "random", "seed": 2, "step_time_us": 40.0, "feasible": 0})  # out of memory
    st.put({**base, "method": "random", "seed": 3, "status": "failed", "step_time_us": None, "error": "X: boom"})
    s = summarize(st.rows())
    cell = s["cells"]["random", ("g", "c")]
    assert (cell["n_ok"], cell["n_failed"], cell["n_infeasible"]) == (3, 1, 1)
    assert cell["step"] == pytest.approx((100.0, np.sqrt(800.0)))
    assert cell["lb_ratio"] == pytest.approx((2.0, np.std([1.6, 2.4], ddof=1)))
    assert cell["expert_ratio"] == pytest.approx((1.0, np.std([0.8, 1.2], ddof=1)))
    assert s["methods"] == ["expert", "random"]
    md = markdown(s, "t", [], [])
    # n is said once in the note (most cells have 2 good runs); expert did not vary: no "± 0"
    # the two tie on the mean: both are best (bold)
    assert "| random | **100.0 ± 28.3 µs; 1 failed, 1 infeasible** |" in md
    assert "| random | **2.000 ± 0.566; 1 failed, 1 infeasible** |" in md
    assert "| random | **1.000 ± 0.283; 1 failed, 1 infeasible** |" in md
    assert "| expert | **100.0 µs** |" in md and "mean ± std over 2 seeds" in md
    assert "| g | c | random | 3 | X: boom |" in md
    assert [t[0] for t in tables(s)] == ["Step time", "Step time / lower bound", "Step time / expert", "Failed runs"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_report_writes_tables_plots_and_one_self_contained_page(dask_sweep, tmp_path):
    d, _, _ = dask_sweep
    out = tmp_path / "rep"
    r = placetool("report", str(d / "r.db"), "--out", str(out), "--html", "--json")
    assert r.returncode == 0, r.stderr
    files = {Path(f).name for f in json.loads(r.stdout)["files"]}
    assert files == {"report.md", "report.html", "methods.png", "convergence.png", "convergence_time.png",
                     "gantt_synthetic-100_k80x2.png", "gantt_synthetic-200_k80x2.png", "tables.csv", "tables.tex"}
    for name in files - {"report.md", "report.html", "tables.csv", "tables.tex"}:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    md = (out / "report.md").read_text()
    with ResultStore(d / "r.db", create=False) as st:
        rows = st.rows()
    steps = [x["step_time_us"] for x in rows if x["method"] == "random" and x["graph"] == "synthetic-200"]
    assert f"{np.mean(steps):,.1f} ± {np.std(steps, ddof=1):,.1f} µs" in md
    assert "Step time / expert" not in md  # no expert runs in this store
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5 and "<h1>placetool sweep report: k80x2</h1>" in page
    assert "src='http" not in page and 'src="http' not in page
    r = placetool("report", str(tmp_path / "none.db"), "--out", str(out))
    assert r.returncode == 2 and "no such results file" in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sweep_on_an_existing_dask_cluster_through_its_scheduler_file(tmp_path):
    from distributed import LocalCluster

    sched = tmp_path / "scheduler.json"
    f = write(tmp_path / "s.toml", GRID.replace('"synthetic-100", "synthetic-200"', '"synthetic-100"')
              .replace('"single", "round-robin", "random"', '"single", "random"'))
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None,
                      scheduler_kwargs={"scheduler_file": str(sched)}):
        r = placetool("sweep", str(f), "--results", str(tmp_path / "r.db"), "--scheduler-file", str(sched), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["runner"], out["ran"], out["ok"]) == ("dask", 4, 4)
    with ResultStore(tmp_path / "r.db", create=False) as st:
        rows = st.rows()
    # one worker with two task threads on this host: each run gets half the cores
    assert {x["numba_threads"] for x in rows} == {max(1, cpu_count() // 2)}
    for x in rows:
        assert x["step_time_us"] == local_result(x["graph"], x["cluster"], x["method"], x["seed"], 20).step_time_us
    bad = tmp_path / "none.db"
    r = placetool("sweep", str(f), "--results", str(bad), "--scheduler-file", str(tmp_path / "gone.json"))
    assert r.returncode == 2 and "no such scheduler file" in r.stderr and not bad.exists()


# ------------------------------------------------------------------ claims
def _key(seed):
    return ("g", "c", "random", seed, "evals=5", "{}")


def test_a_claimed_point_is_refused_to_another_driver(tmp_path):
    from placetool.search.sweeps.store import ResultStore

    with ResultStore(tmp_path / "r.db") as a, ResultStore(tmp_path / "r.db") as b:
        assert a.claim(_key(0), "A") and a.claim(_key(0), "A")      # its own claim: still its own
        assert not b.claim(_key(0), "B")                            # A runs it
        assert b.claim(_key(1), "B")
        a.put({"graph": "g", "cluster": "c", "method": "random", "seed": 0, "budget": "evals=5",
               "options": "{}", "status": "ok", "timestamp": "t1"})
        a.release("A", _key(0))
        # B planned its work before A's row existed: the row changed, so B leaves it
        assert not b.claim(_key(0), "B", seen=None)
        assert b.claim(_key(0), "B", seen=("ok", "t1"))             # B asked knowing the row
        b.release("B")
        assert a.claim(_key(1), "A")


def test_a_claim_of_a_dead_driver_is_taken_over(tmp_path):
    import socket
    import subprocess
    import sys

    from placetool.search.sweeps.store import ResultStore

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a pid that has ended
    with ResultStore(tmp_path / "r.db") as s:
        s.claim(_key(0), "X")
        with s.db:
            s.db.execute("UPDATE claims SET pid = ?, host = ?", (p.pid, socket.gethostname()))
        assert s.claim(_key(0), "Y")  # same host, pid gone: at once
        with s.db:
            s.db.execute("UPDATE claims SET host = 'elsewhere', heartbeat = heartbeat - 100")
        assert not s.claim(_key(0), "Z")                 # another host, fresh heartbeat: alive
        assert s.claim(_key(0), "Z", lease_s=50)         # ... unless its lease ran out


def test_two_sweeps_on_one_store_split_the_grid(tmp_path):
    """Two `placetool sweep` processes on one results file run each point once."""
    import json
    import subprocess
    import sys

    f = tmp_path / "s.toml"
    f.write_text('[sweep]\ngraphs = ["synthetic-200"]\nclusters = ["k80x2"]\nmethods = ["random"]\n'
                 'seeds = [0, 1, 2, 3]\nbudget_seconds = 1.0\n')
    cmd = [sys.executable, "-m", "placetool.cli.main", "sweep", str(f), "--results", str(tmp_path / "r.db"),
           "-n", "1", "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    ran = [json.loads(o[0])["ran"] for o in outs]
    assert sum(ran) == 4, ran  # each point once (before claims, each sweep ran all 4)
    from placetool.search.sweeps.store import ResultStore

    with ResultStore(tmp_path / "r.db", create=False) as s:
        assert s.count("ok") == 4
        assert s.db.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0  # all released
