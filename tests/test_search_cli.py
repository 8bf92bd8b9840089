"""`placetool search`: JSON output, placement files, exit codes."""

from __future__ import annotations

import json

import pytest

from placetool.cli.main import main
from placetool.costmodel import CostModel, presets
from placetool.search import Budget, Problem
from tests.helpers import cluster


def call(argv, capsys):
    """Run the CLI in-process; (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_json_and_out_file_round_trip(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, _ = call(["search", "-g", "synthetic-150", "-c", "k80x2", "-m", "heft", "--json",
                            "--out", str(out)], capsys)
    assert code == 0
    d = json.loads(stdout)
    for k in ("graph", "cluster", "method", "step_time_us", "feasible", "lower_bound_us", "evaluations",
              "seconds", "history", "gap_to_lower_bound"):
        assert k in d
    assert (d["graph"], d["cluster"], d["method"], d["feasible"]) == ("synthetic-150", "k80x2", "heft", True)
    assert d["evaluations"] in (1, 2) and d["step_time_us"] >= d["lower_bound_us"] > 0
    cm = CostModel(presets.load_graph("synthetic-150"), presets.load_cluster("k80x2"))
    p = cm.load_placement(out)
    assert cm.simulate(p).step_time_us == pytest.approx(d["step_time_us"])


def test_human_output_with_compare(capsys):
    code, stdout, _ = call(["search", "-g", "synthetic-100", "-m", "m-etf", "--compare", "--budget-evals", "5"], capsys)
    assert code == 0
    assert "step time" in stdout and "single" in stdout and "expert" in stdout


def test_exact_says_whether_it_proved_the_optimum(capsys):
    code, stdout, _ = call(["search", "-g", "synthetic-12", "-c", "k80x2", "-m", "exact", "--budget-evals", "100000"],
                           capsys)
    assert code == 0 and "proof       optimal" in stdout
    code, stdout, _ = call(["search", "-g", "synthetic-100", "-c", "k80x2", "-m", "exact", "--budget-evals", "50"],
                           capsys)
    assert code == 0 and "proof       not finished: no placement is below" in stdout and "gap" in stdout
    groups = Problem(CostModel(presets.load_graph("synthetic-100"), presets.load_cluster("k80x2"))).n_groups
    assert f"exact proves problems of up to ~36 groups in a minute, this one has {groups}" in stdout


def test_list_methods(capsys):
    code, stdout, _ = call(["search", "--list"], capsys)
    assert code == 0
    names = {line.split()[0] for line in stdout.splitlines()}
    assert {"heft", "m-sct", "metis", "mincut", "expert", "single"} <= names
    code, stdout2, _ = call(["search", "--method", "list"], capsys)
    assert code == 0 and stdout2 == stdout


@pytest.mark.parametrize("args, words", [
    (["-m", "nope"], "unknown method"),
    (["-m", "heft", "--budget-evals", "0"], "budget"),
    (["-m", "heft", "--budget-seconds", "-1"], "budget"),
    (["-m", "heft", "--storage", "sqlite:///x.db"], "--storage"),
])
def test_user_errors_exit_2(args, words, capsys):
    code, stdout, err = call(["search", "-g", "synthetic-50", *args], capsys)
    assert code == 2 and stdout == ""
    assert words in err and len(err.strip().splitlines()) == 1


def test_impossible_memory_exits_2(tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    cluster(3, memory=1000).save(path)
    code, _, err = call(["search", "-g", "synthetic-200", "-c", str(path), "-m", "heft"], capsys)
    assert code == 2 and ("no placement fits" in err or "cannot hold" in err)


def test_infeasible_best_exits_1_and_writes_nothing(tmp_path, capsys):
    g = presets.load_graph("synthetic-200")
    params = int(g.param_bytes.sum())
    path = tmp_path / "small.toml"
    # parameters fit, activations do not
    cluster(2, memory=[params + 1, params + 1]).save(path)
    out = tmp_path / "p.json"
    code, stdout, err = call(["search", "-g", "synthetic-200", "-c", str(path), "-m", "single",
                              "--out", str(out)], capsys)
    assert code == 1
    assert "does not fit" in err and "out of memory" in err
    assert not out.exists()
    code, stdout, err = call(["search", "-g", "synthetic-200", "-c", str(path), "-m", "single", "--json"], capsys)
    assert code == 1 and json.loads(stdout)["feasible"] is False
    e = json.loads(err)  # the error as one JSON object on stderr
    assert e["exit_code"] == 1 and "out of memory" in e["error"]


def test_missing_out_folder_fails_before_search(tmp_path, capsys):
    code, _, err = call(["search", "-g", "synthetic-50", "-m", "heft", "--out", str(tmp_path / "no" / "p.json")],
                        capsys)
    assert code == 2 and "does not exist" in err


@pytest.fixture
def method_that_fails_midway(monkeypatch):
    """A method registered for the test: it scores three random placements, then fails as
    a bug would (ZeroDivisionError). Returns (name, step times it scored)."""
    import numpy as np

    import placetool.search.registry as B

    scored = []

    def fails_midway(problem, budget, seed, tracker):
        rng = np.random.default_rng(seed)
        r = tracker.evaluate(np.stack([problem.random_assignment(rng) for _ in range(3)]))
        scored.extend(np.where(r.feasible, r.step_time_us, np.inf))
        return 1 / 0

    B.get("sa")  # the registry filled first, so the test method is not overwritten
    monkeypatch.setitem(B.REGISTRY, "fails-midway", B.MethodInfo("fails-midway", fails_midway, "fails", Budget(evals=9), None))
    return "fails-midway", scored


def test_a_fault_in_the_method_keeps_the_best_found_and_says_it_is_a_bug(tmp_path, capsys, method_that_fails_midway):
    name, scored = method_that_fails_midway
    out = tmp_path / "p.json"
    code, stdout, stderr = call(["search", "-g", "synthetic-100", "-c", "k80x2", "-m", name, "--out", str(out)], capsys)
    assert code == 1
    assert "ZeroDivisionError" in stderr and "Traceback" in stderr and "fails_midway" in stderr  # the traceback
    assert f"method '{name}' failed after 3 placements (ZeroDivisionError: division by zero)" in stderr
    assert f"the best placement found before it is in {out}" in stderr and "a bug in placetool" in stderr
    cm = CostModel(presets.load_graph("synthetic-100"), presets.load_cluster("k80x2"))
    assert cm.simulate(cm.load_placement(out)).step_time_us == pytest.approx(min(scored))
    assert "step time" in stdout  # the report of what was found comes first
    scored.clear()
    code, stdout, stderr = call(["search", "-g", "synthetic-100", "-c", "k80x2", "-m", name, "--json"], capsys)
    assert code == 1 and json.loads(stdout)["failed"] == "ZeroDivisionError: division by zero"
    assert json.loads(stdout)["step_time_us"] == pytest.approx(min(scored))
    err = json.loads(stderr)
    assert err["exit_code"] == 1 and "ZeroDivisionError" in err["traceback"] and name in err["error"]
