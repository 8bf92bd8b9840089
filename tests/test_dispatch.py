"""The learnt dispatching rule: HEFT when its weights are 0, each term as computed by
hand, rule files read as data, and the pre-training command's round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from placetool.cli.main import cli
from placetool.costmodel import CostModel, OpGraph, presets
from placetool.costmodel.errors import UserError
from placetool.search import Budget, Problem, SearchError, run
from placetool.search.dispatch import TERMS, read_rules, write_rules
from placetool.search.listsched import _Data
from placetool.search.rule_kernels import N_RULE

from .helpers import cluster, nxgraph


def portfolio(tmp_path, *rules) -> str:
    """A rule file holding ``rules`` (none: HEFT alone)."""
    return str(write_rules(tmp_path / "rules", np.array(rules, np.float64).reshape(len(rules), N_RULE)).parent)


@pytest.mark.parametrize("graph,clu", [("synthetic-1k", "k80x4"), ("nmt", "k40x8"), ("inception_v3", "v100x8")])
def test_a_rule_of_zeros_schedules_exactly_as_heft(graph, clu, tmp_path):
    p = Problem(CostModel(presets.load_graph(graph), presets.load_cluster(clu)))
    data = _Data(p)
    g0, (place0, start0, finish0, _) = data.eft(data.rank_u())
    g1, (place1, start1, finish1, _) = data.eft(data.rank_u(), rule=np.zeros(N_RULE))
    assert np.array_equal(g0, g1) and np.array_equal(place0, place1)
    assert np.array_equal(start0, start1) and np.array_equal(finish0, finish1)
    h = run("heft", p, Budget(evals=20), seed=0)
    d = run("dispatch", p, Budget(evals=20), seed=0, policy=portfolio(tmp_path))  # HEFT alone
    assert np.array_equal(h.assignment, d.assignment) and d.step_time_us == h.step_time_us
    assert d.metadata["picked"] == 0 and d.metadata["scheduled"] == 1


def group_follows() -> Problem:
    """x (1 µs anywhere) feeds a, which feeds b; a and b are one colocation group. a runs
    in 1 µs on d0 and 5 on d1, b in 20 on d0 and 2 on d1. Free links, two GPUs."""
    g = nxgraph({"x": 0, "a": {"out_bytes": 0, "group": "ab"}, "b": {"out_bytes": 0, "group": "ab"}},
                [("x", "a"), ("a", "b")], name="group-follows")
    cl = cluster(2, latency=0.0, bandwidth=1e9, kinds=["gpu", "gpu"])
    return Problem(CostModel(OpGraph.from_networkx(g), cl, op_times=[[1.0, 1.0], [1.0, 5.0], [20.0, 2.0]]))


def test_the_group_term_sees_what_the_rest_of_a_group_costs():
    # By hand. HEFT: x on d0 (a tie, the first device), a on d0 (finishes at 2, against
    # 6 on d1), so b follows on d0: 2 + 20 = 22 µs. The group term adds to each device
    # what b costs there above its cheapest (d0: 20 - 2 = 18, d1: 0): a scores 2 + 18 = 20
    # on d0 and 6 on d1, goes to d1, and b with it: 6 + 2 = 8 µs.
    p = group_follows()
    data = _Data(p)
    w = np.zeros(N_RULE)
    _, (place, _, finish, _) = data.eft(data.rank_u())
    assert place.tolist() == [0, 0, 0] and finish.max() == 22.0
    w[TERMS.index("group")] = 1.0
    gdev, (place, _, finish, _) = data.eft(data.rank_u(), rule=w)
    assert place.tolist() == [0, 1, 1] and finish.max() == 8.0
    assert p.cost_model.simulate(p.placement(gdev.astype(np.int32))).step_time_us == 8.0
    # half the weight: a scores 2 + 9 = 11 on d0, still above 6
    w[TERMS.index("group")] = 0.5
    assert data.eft(data.rank_u(), rule=w)[1][0].tolist() == [0, 1, 1]
    # a weight of 0.2 (2 + 3.6 = 5.6 < 6) keeps HEFT's choice
    w[TERMS.index("group")] = 0.2
    assert data.eft(data.rank_u(), rule=w)[1][0].tolist() == [0, 0, 0]


def test_the_traffic_term_prices_bytes_from_other_devices():
    # x (1 µs) on d0 sends 1,000 bytes to y; y runs in 3 µs on d0 and 1 µs on d1; links
    # 1,000 B/µs and no latency. HEFT: y on d1 finishes at 1 + 1 + 1 = 3, on d0 at 4:
    # d1. The traffic term adds 1,000 B x 1 µs/1,000 B = 1 µs x weight on d1 only; at
    # weight 2 y scores 5 on d1 against 4 on d0 and stays with x.
    g = nxgraph({"x": 1000, "y": 0}, [("x", "y", {"bytes": 1000})], name="traffic")
    cl = cluster(2, latency=0.0, bandwidth=1000.0, kinds=["gpu", "gpu"])
    p = Problem(CostModel(OpGraph.from_networkx(g), cl, op_times=[[1.0, 1.0], [3.0, 1.0]]))
    data = _Data(p)
    assert data.eft(data.rank_u())[1][0].tolist() == [0, 1]
    w = np.zeros(N_RULE)
    w[TERMS.index("traffic")] = 2.0
    assert data.eft(data.rank_u(), rule=w)[1][0].tolist() == [0, 0]
    w[TERMS.index("traffic")] = 0.5  # 3.5 on d1 < 4 on d0
    assert data.eft(data.rank_u(), rule=w)[1][0].tolist() == [0, 1]


def test_the_method_keeps_the_fastest_of_heft_and_its_rules(tmp_path):
    p = group_follows()
    good, bad = np.zeros(N_RULE), np.zeros(N_RULE)
    good[TERMS.index("group")] = 1.0
    bad[TERMS.index("group")] = 0.2  # HEFT's choice again
    r = run("dispatch", p, Budget(evals=20), seed=0, policy=portfolio(tmp_path, bad, good))
    assert r.step_time_us == 8.0 and r.metadata["picked"] == 2 and r.metadata["scheduled"] == 3
    r = run("dispatch", p, Budget(evals=20), seed=0, policy=portfolio(tmp_path, good, bad))
    assert r.step_time_us == 8.0 and r.metadata["picked"] == 1
    # a rule that places as HEFT does: HEFT (scheduled last) ties and the first is kept
    r = run("dispatch", p, Budget(evals=20), seed=0, policy=portfolio(tmp_path, bad))
    assert r.step_time_us == 22.0 and r.metadata["picked"] == 1 and r.metadata["scheduled"] == 2


def test_the_shipped_rules_are_data_and_read_back(tmp_path):
    r = read_rules("dispatch")
    assert r.weights.ndim == 2 and r.weights.shape[1] == N_RULE and len(r.weights) >= 1
    assert np.isfinite(r.weights).all() and (r.weights >= 0).all()
    assert r.meta["recipe"]["policy"] == "rule"
    again = read_rules(write_rules(tmp_path / "copy", r.weights, r.meta))
    assert np.array_equal(again.weights, r.weights)


@pytest.mark.parametrize("doc,field", [
    ({"format": "other"}, "format"),
    ({"version": 99}, "version"),
    ({"terms": ["memory"]}, "terms"),
    ({"weights": [1.0] * N_RULE}, "weights"),
    ({"weights": [[1.0] * (N_RULE - 1)]}, "weights"),
    ({"weights": [[1.0] * (N_RULE - 1) + ["__import__('os')"]]}, "weights"),
    ({"weights": [[1.0] * (N_RULE - 1) + [float("nan")]]}, "weights"),
    ({"weights": [[1.0] * (N_RULE - 1) + [True]]}, "weights"),
])
def test_a_bad_rule_file_is_refused_naming_its_field(tmp_path, doc, field):
    path = write_rules(tmp_path / "r", np.zeros((1, N_RULE)))
    good = json.loads(path.read_text())
    path.write_text(json.dumps({**good, **doc}))
    with pytest.raises(SearchError, match=rf"{path}: field '{field}'"):
        read_rules(tmp_path / "r")


def test_a_missing_or_broken_rule_is_a_clear_error(tmp_path):
    with pytest.raises(SearchError, match="no rule at"):
        read_rules(tmp_path / "nothing-here.json")
    (tmp_path / "policy.json").write_text("{not json")
    with pytest.raises(SearchError, match="not a dispatching rule"):
        read_rules(tmp_path)


def test_pretrain_a_rule_and_place_with_it(tmp_path):
    out = tmp_path / "rule"
    res = CliRunner().invoke(cli, ["rl", "pretrain", "--policy", "rule", "-g", "synthetic-300", "-c", "k80x2",
                                    "-o", str(out), "--budget-evals", "48", "--samples", "4", "--rules", "2",
                                    "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["policy"] == "rule" and doc["vs_heft"] <= 1.0 and doc["evaluations"] >= 48
    assert len(doc["rules"]) == doc["rules_kept"] <= 2 and all(set(r) == set(TERMS) for r in doc["rules"])
    res = CliRunner().invoke(cli, ["search", "-g", "synthetic-300", "-c", "k80x2", "--method", "dispatch",
                                    "--option", f"policy={out}", "--budget-evals", "40", "--json"])
    assert res.exit_code == 0, res.output
    found = json.loads(res.output)
    assert found["feasible"] and found["metadata"]["rules"] == [[r[t] for t in TERMS] for r in doc["rules"]]
    # the training's own figure: the best of HEFT and the rules, against HEFT alone
    heft = json.loads(CliRunner().invoke(cli, ["search", "-g", "synthetic-300", "-c", "k80x2", "--method", "heft",
                                                "--budget-evals", "40", "--json"]).output)
    assert found["step_time_us"] <= heft["step_time_us"]
    # the saved rule is kept unless --force
    res = CliRunner().invoke(cli, ["rl", "pretrain", "--policy", "rule", "-g", "synthetic-300", "-c", "k80x2",
                                    "-o", str(out), "--budget-evals", "4", "--samples", "4"])
    assert isinstance(res.exception, UserError) and "--force" in str(res.exception)
