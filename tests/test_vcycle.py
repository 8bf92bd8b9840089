"""V-cycles (search/vcycle.py) and sa's use of them on large problems."""

from __future__ import annotations

import numpy as np
import pytest

from placetool.costmodel import CostModel, presets
from placetool.search import Budget, Problem, annealing, run, vcycle
from placetool.search.tracker import Tracker
from placetool.search.vcycle import race, vcycles


@pytest.fixture(scope="module")
def p1k():
    return Problem(CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4")))


def test_sa_runs_its_vcycles_from_the_seeds_best_and_keeps_the_budget(p1k):
    seed_step = run("m-etf", p1k, Budget(evals=10), seed=0).step_time_us
    r = run("sa", p1k, Budget(evals=300), seed=0, seeds="m-etf", cycles=2)
    assert [row["stage"] for row in r.metadata["levels"]] == ["v-cycle 1", "v-cycle 2"]
    assert r.evaluations <= 300 and r.feasible and r.step_time_us <= seed_step
    assert r.step_time_us == pytest.approx(p1k.cost_model.simulate(r.placement).step_time_us)
    again = run("sa", p1k, Budget(evals=300), seed=0, seeds="m-etf", cycles=2)
    assert np.array_equal(again.assignment, r.assignment)  # same seed, same answer


def test_sa_cycles_by_default_only_under_seconds_on_large_problems(p1k, monkeypatch):
    """One cycle per 15 s of a seconds budget, on problems of CYCLE_MIN_GROUPS groups."""
    cycles = annealing._default_cycles
    assert p1k.n_groups < annealing.CYCLE_MIN_GROUPS and cycles(p1k, Budget(seconds=60), None) == 0
    monkeypatch.setattr(annealing, "CYCLE_MIN_GROUPS", p1k.n_groups)
    assert [cycles(p1k, Budget(seconds=s), None) for s in (10, 15, 29.9, 60)] == [0, 1, 1, 4]
    assert cycles(p1k, Budget(evals=10_000), None) == 0
    assert cycles(p1k, Budget(seconds=60), np.zeros(p1k.n_groups, np.int32)) == 0  # islands, refinement


def test_vcycles_coarsen_and_improve_a_poor_start(p1k):
    tracker = Tracker(p1k, Budget(evals=200))
    start = np.arange(p1k.n_groups, dtype=np.int32) % p1k.n_devices
    ok = p1k.allowed[np.arange(p1k.n_groups), start]
    start = np.where(ok, start, np.argmax(p1k.allowed, axis=1)).astype(np.int32)  # round robin where allowed
    first = float(tracker.evaluate(start).step_time_us[0])
    rows = vcycles(p1k, Budget(evals=200), 0, tracker, cycles=2, share=0.9, target=80)
    assert [row["stage"] for row in rows] == ["v-cycle 1", "v-cycle 2"]
    assert all(row["clusters"] < p1k.n_groups and row["evaluations"] > 0 for row in rows)
    assert tracker.evaluations <= 200
    # round robin splits every chain; moving whole clusters takes the step well below it
    assert tracker.best_step_us < 0.9 * first  # 15% below it with this seed
    assert tracker.best_step_us == min(r["fine_step_us"] for r in rows if r["fine_step_us"] is not None)



def test_race_runs_both_sides_from_the_same_start_and_names_the_faster(p1k):
    tracker = Tracker(p1k, Budget(seconds=30))
    start = run("m-topo", p1k, Budget(evals=10), seed=0).assignment
    first = float(tracker.evaluate(start).step_time_us[0])
    got = race(p1k, Budget(seconds=30), 0, tracker, share=0.02)
    lead = got["v-cycle_us"] - got["groups_us"]  # how far ahead the groups ended
    assert got["start_us"] == first and got["won"] == ("groups" if lead > vcycle.RACE_MARGIN * first else "v-cycles")
    assert got["row"]["stage"] == "v-cycle 1" and got["seconds"] == pytest.approx(0.6)
    # both started from the seeds' best: neither is worse than it, and the tracker holds the faster
    assert max(got["v-cycle_us"], got["groups_us"]) <= first
    assert tracker.best_step_us == min(got["v-cycle_us"], got["groups_us"])
    assert tracker.evaluations > 3  # the annealing's evaluations are counted, not only its best


def test_the_race_hands_on_the_best_few_placements_it_saw_where_they_are_kept(p1k):
    # --verify-top K measures the K best distinct placements: the race's annealing, on
    # its own tracker, must not hand on its best alone
    tracker = Tracker(p1k, Budget(seconds=30), keep_top=6)
    start = run("m-topo", p1k, Budget(evals=10), seed=0).assignment
    tracker.evaluate(start)
    got = race(p1k, Budget(seconds=30), 0, tracker, share=0.02)
    steps = [t[0] for t in tracker.top]
    assert len(tracker.top) == 6 and steps == sorted(steps) and all(t[1] for t in tracker.top)
    assert len({t[2].tobytes() for t in tracker.top}) == 6
    assert steps[0] == tracker.best_step_us == min(got["v-cycle_us"], got["groups_us"])


def test_sa_runs_cycles_on_only_where_the_race_went_to_them(p1k, monkeypatch):
    monkeypatch.setattr(annealing, "CYCLE_MIN_GROUPS", p1k.n_groups)
    monkeypatch.setattr(vcycle, "CYCLE_SECONDS", 1.0)  # 3 cycles in 3 s
    for seed in (0, 1):
        r = run("sa", p1k, Budget(seconds=3), seed=seed, seeds="m-topo")
        race_ = r.metadata["race"]
        stages = [row["stage"] for row in r.metadata["levels"]]
        lead = race_["v-cycle_us"] - race_["groups_us"]
        if race_["won"] == "v-cycles":
            assert lead <= vcycle.RACE_MARGIN * race_["start_us"] and stages[:2] == ["v-cycle 1", "v-cycle 2"]
        else:
            assert lead > vcycle.RACE_MARGIN * race_["start_us"] and stages == ["v-cycle 1"]
        assert r.step_time_us <= min(race_["v-cycle_us"], race_["groups_us"])
    # a number of cycles asked for runs without a race
    r = run("sa", p1k, Budget(seconds=3), seed=0, seeds="m-topo", cycles=2)
    assert "race" not in r.metadata and len(r.metadata["levels"]) == 2


def test_the_race_benchmark_prints_paired_ratios(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vcycle_race.py"
    spec = importlib.util.spec_from_file_location("vcycle_race", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--instances", "synthetic-1k/k80x2", "--seconds", "1", "--seeds", "0"]) == 0
    out = capsys.readouterr().out
    assert "| synthetic-1k/k80x2 |" in out and "race / before, all runs: median" in out
    assert "1 paired runs" in out  # synthetic-1k is too small for cycles: each variant is plain sa
