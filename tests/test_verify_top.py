"""`placetool search --verify-top K`: the search's best placements are run on real devices
beside the single-device placement and the best one-shot baseline; the measured best wins."""

import json
import subprocess
import sys
import textwrap

import pytest

from placetool.costmodel.tf.runner import _tally, confirm, judge

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

#: the same two workers under TensorFlow's run queue (links.send "workers")
CPU2_WORKERS = CPU2.replace("[links.default]", """[links]
queue = "none"
send = "workers"
[links.default]""")

MODEL = textwrap.dedent('''
    import keras

    def two_towers():
        x = keras.Input((24,), name="features")
        a = keras.layers.Dense(32, activation="relu", name="tower_a")(x)
        b = keras.layers.Dense(32, activation="relu", name="tower_b")(x)
        h = keras.layers.Concatenate(name="join")([a, b])
        return keras.Model(x, keras.layers.Dense(4, name="logits")(h))

    def three_towers():
        x = keras.Input((24,), name="features")
        a = keras.layers.Dense(32, activation="relu", name="tower_a")(x)
        b = keras.layers.Dense(32, activation="relu", name="tower_b")(x)
        c = keras.layers.Dense(32, activation="relu", name="tower_c")(x)
        h = keras.layers.Concatenate(name="join")([a, b, c])
        return keras.Model(x, keras.layers.Dense(4, name="logits")(h))
''')

def placetool(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "placetool.cli.main", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def _row(label, source, pred, meas, spread=1.0, **kw):
    return {"label": label, "source": source, "predicted_us": pred, "measured_us": meas, "spread_pct": spread, **kw}


# ---------------------------------------------------------------- the verdict (no TF)
def test_a_search_placement_measured_faster_beyond_the_noise_is_confirmed():
    v = judge([_row("search #1", "search", 80.0, 90.0), _row("search #2", "search", 85.0, 95.0),
               _row("single", "single", 100.0, 100.0, spread=2.0), _row("metis", "baseline", 95.0, 120.0)])
    assert v["confirmed"] and v["recommended"] == 0
    assert v["gain_pct"] == pytest.approx(10.0)  # 90 vs the best baseline, single at 100
    assert v["noise_floor_pct"] == pytest.approx(1.0)
    assert v["message"].startswith("confirmed on hardware")


def test_a_simulated_gain_that_hardware_contradicts_recommends_the_baseline():
    # the search predicts 40% faster, but its placement measures 20% slower than one device
    v = judge([_row("search #1", "search", 60.0, 120.0), _row("single", "single", 100.0, 100.0),
               _row("m-etf", "baseline", 90.0, 130.0)])
    assert not v["confirmed"] and v["recommended"] == 1
    assert v["gain_pct"] == pytest.approx(-20.0)
    assert "NOT confirmed" in v["message"] and "predicted 40.0% faster than single" in v["message"]
    assert "slower than" in v["message"] and "recommending single" in v["message"]


def test_a_gain_within_the_noise_floor_is_not_confirmed():
    # 3% faster, but repeated runs of either placement spread by 5%: not a measured gain
    v = judge([_row("search #1", "search", 80.0, 97.0, spread=5.0), _row("single", "single", 100.0, 100.0, 4.0)])
    assert not v["confirmed"] and v["recommended"] == 1 and "no faster than" in v["message"]
    # the same gain on a quiet machine is confirmed
    v = judge([_row("search #1", "search", 80.0, 97.0, spread=0.5), _row("single", "single", 100.0, 100.0, 0.5)])
    assert v["confirmed"] and v["recommended"] == 0


def test_a_baseline_within_the_noise_of_one_device_does_not_replace_it():
    """metis measured 4.5% faster than one device with a 5% noise floor: when the search is
    not confirmed, one device is recommended, not metis; beyond the noise, metis."""
    rows = [_row("search #1", "search", 80.0, 85.0, spread=2.0), _row("single", "single", 100.0, 86.6, 2.0),
            _row("metis", "baseline", 95.0, 82.7, 4.0)]
    v = judge(rows, sentinel_floor_pct=5.0)
    assert not v["confirmed"] and v["best_baseline"] == 2 and v["recommended"] == 1
    assert "recommending single (metis measured only 4.5% faster than single, within the noise)" in v["message"]
    v = judge(rows, sentinel_floor_pct=1.0)
    assert not v["confirmed"] and v["recommended"] == 2 and v["message"].endswith("recommending metis")


def test_a_fresh_run_with_too_few_steady_rounds_confirms_nothing():
    """The same rounds, 8-10% faster each: all five, or three the sentinel kept, confirm;
    one or two kept rounds do not, and the tally says how many it kept."""
    fast, base = [90, 92, 91, 90, 92], [100, 100, 101, 99, 100]
    assert confirm(fast, base, noise_floor_pct=2.0)["confirmed"]
    assert confirm(fast, base, noise_floor_pct=2.0, keep=[0, 2, 4])["confirmed"]
    for keep in ([3], [1, 4]):
        c = confirm(fast, base, noise_floor_pct=2.0, keep=keep)
        assert not c["confirmed"] and c["gain_pct"] > 2.0 and c["rounds_faster"] == c["rounds"] == len(keep)
    assert _tally(confirm(fast, base, 2.0, keep=[3])) == "faster in 1 of 1, the 1 of 5 the sentinel kept"
    assert _tally(confirm(fast, base, 2.0)) == "faster in 5 of 5"
    # a run whose every round the sentinel flagged keeps none: its gain is shown, nothing confirmed
    c = confirm(fast, base, noise_floor_pct=2.0, keep=[])
    assert not c["confirmed"] and c["rounds"] == 0 and c["rounds_faster"] == 5 and c["gain_pct"] > 8.0
    assert _tally(c) == "faster in 5 of 5, every one flagged by the sentinel"
    # a run of two rounds needs both
    assert confirm(fast[:2], base[:2], noise_floor_pct=2.0)["confirmed"]


def test_a_search_result_equal_to_a_baseline_is_that_baseline():
    v = judge([_row("search #1", "search", 100.0, 99.0), _row("single", "single", 100.0, 99.0, same_as="search #1")])
    assert not v["confirmed"] and v["recommended"] == 1 and "single placement itself" in v["message"]


# ---------------------------------------------------------------- refused before searching
@pytest.mark.parametrize("args,msg", [
    (["-g", "synthetic-1k", "--verify-top", "2", "--testbed", "2"], "records no model source"),
    (["-g", "nmt", "--verify-top", "2"], "needs --testbed N"),
    (["-g", "nmt", "--verify-top", "2", "--testbed", "2"], "has 5 devices but 2"),
])
def test_verify_top_refuses_before_searching(args, msg):
    r = placetool("search", "--method", "single", *args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _tampered(tmp_path, source="evilmod:build", kind="module"):
    """A graph file whose meta names a module (in a folder of the sender's choosing) that
    leaves a marker file when imported, and a two-CPU cluster for it."""
    from placetool.costmodel import presets

    evil = tmp_path / "sender"
    evil.mkdir()
    marker = tmp_path / "IMPORTED"
    (evil / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                     "def build():\n    return 'not a model'\n")
    g = presets.load_graph("synthetic-1k")
    g.meta["trace"] = {"kind": kind, "source": source, "cwd": str(evil), "batch": 8, "mode": "train",
                       "optimizer": "sgd"}
    path = tmp_path / "victim.npz"
    g.save(path)
    cluster = tmp_path / "cpu2.toml"
    cluster.write_text(CPU2)
    return path, cluster, marker, evil


def test_a_tampered_graph_file_imports_nothing_without_the_users_say(tmp_path):
    path, cluster, marker, evil = _tampered(tmp_path)
    g, c = str(path), str(cluster)
    r = placetool("search", "-g", g, "-c", c, "--method", "round-robin", "--verify-top", "1", "--testbed", "2",
                  cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (f"was traced from evilmod:build in {evil}; placetool does not run or load a model a graph file names"
            in r.stderr and "--model" in r.stderr and "--trust-graph-source" in r.stderr), r.stderr
    # the commands that only read a graph file never import what it names
    for args in (["simulate", "-g", g, "-c", c], ["show", "-g", g, "-c", c, "-o", str(tmp_path / "g.svg")],
                 ["search", "-g", g, "-c", c, "--method", "round-robin"], ["info", "--graph", g]):
        r = placetool(*args, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stderr)
    # verify and calibrate take a model, not a graph file: refused before TensorFlow loads
    for args in (["verify", "-g", g, "-c", c, "-p", "round-robin", "--testbed", "2"],
                 ["calibrate", "-g", g, "--testbed", "2", "-o", str(tmp_path / "p.json")]):
        r = placetool(*args, cwd=tmp_path)
        assert r.returncode == 2 and f"--graph {g}: a placetool graph file, not a model" in r.stderr, r.stderr
    # --model and the trust flag only mean something with --verify-top
    r = placetool("search", "-g", g, "-c", c, "--trust-graph-source", cwd=tmp_path)
    assert r.returncode == 2 and "--trust-graph-source only applies with --verify-top" in r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("kind,source", [("saved_model", "{evil}"), ("graph_def", "{evil}/model.pb")])
def test_a_recorded_model_file_is_not_loaded_without_the_users_say(tmp_path, kind, source):
    path, cluster, marker, evil = _tampered(tmp_path)
    from placetool.costmodel import presets

    graph = presets.load_graph(str(path))
    graph.meta["trace"] = {"kind": kind, "source": source.format(evil=evil), "batch": 8, "mode": "infer"}
    graph.save(path)
    r = placetool("search", "-g", str(path), "-c", str(cluster), "--method", "round-robin", "--verify-top", "1",
                  "--testbed", "2")
    assert r.returncode == 2 and "placetool does not run or load a model a graph file names" in r.stderr
    assert f"give --model {source.format(evil=evil)}" in r.stderr


@pytest.mark.slow  # loads TensorFlow
def test_the_trust_flag_imports_the_recorded_module_and_says_which(tmp_path):
    path, cluster, marker, evil = _tampered(tmp_path)
    r = placetool("search", "-g", str(path), "-c", str(cluster), "--method", "round-robin", "--verify-top", "1",
                  "--testbed", "2", "--trust-graph-source", "-q", cwd=tmp_path)
    assert marker.exists()  # the user asked for it
    assert (f"placetool: importing module 'evilmod' from {evil / 'evilmod.py'} and calling build() "
            "(recorded in graph 'synthetic-1k', --trust-graph-source)") in r.stderr, r.stderr
    # the module is no Keras model builder: one line, exit 2
    assert r.returncode == 2 and "evilmod:build: returned str, not a keras.Model" in r.stderr


@pytest.mark.slow  # loads TensorFlow
def test_model_named_on_the_command_line_is_imported_from_the_current_folder(tmp_path):
    path, cluster, marker, evil = _tampered(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    r = placetool("search", "-g", str(path), "-c", str(cluster), "--method", "round-robin", "--verify-top", "1",
                  "--testbed", "2", "--model", "evilmod:build", cwd=mine)
    assert r.returncode == 2 and f"--model evilmod:build: no module 'evilmod' in {mine}" in r.stderr, r.stderr
    assert not marker.exists()  # the sender's folder is not searched for the named module
    r = placetool("search", "-g", str(path), "-c", str(cluster), "--method", "round-robin", "--verify-top", "1",
                  "--testbed", "2", "--model", "evilmod:build", cwd=evil)
    assert marker.exists()
    assert (f"placetool: importing module 'evilmod' from {evil / 'evilmod.py'} and calling build() "
            "(named by --model)") in r.stderr, r.stderr
    assert r.returncode == 2 and "returned str, not a keras.Model" in r.stderr


def test_a_graph_whose_module_is_gone_is_refused_before_searching(tmp_path):
    from placetool.costmodel import presets

    g = presets.load_graph("synthetic-1k")
    g.meta["trace"] = {"kind": "module", "source": "gone_module:build", "cwd": str(tmp_path),
                       "batch": 8, "mode": "train", "optimizer": "sgd"}
    path = tmp_path / "g.npz"
    g.save(path)
    cluster = tmp_path / "cpu2.toml"
    cluster.write_text(CPU2)
    r = placetool("search", "-g", str(path), "-c", str(cluster), "--method", "single", "--verify-top", "1",
                  "--testbed", "2", "--trust-graph-source")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"was traced from gone_module:build in {tmp_path}, but module 'gone_module' is not there" in r.stderr


# ---------------------------------------------------------------- real workers
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_verify_top_on_an_imported_user_model(tmp_path):
    """The README's path: import a user's module:function, search, --verify-top on a testbed,
    run from another directory than the model's."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "pt_user_towers.py").write_text(MODEL)
    graph = tmp_path / "my.npz"
    r = placetool("import", "pt_user_towers:two_towers", "--batch", "32", "--out", str(graph), cwd=models)
    assert r.returncode == 0, r.stderr
    from placetool.costmodel import presets

    src = presets.load_graph(str(graph)).meta["trace"]
    assert src == {"kind": "module", "source": "pt_user_towers:two_towers", "cwd": str(models.resolve()),
                   "batch": 32, "mode": "train", "optimizer": "sgd"}

    cluster = tmp_path / "cpu2.toml"
    cluster.write_text(CPU2)
    # a model named on the command line must be the graph's own
    r = placetool("search", "-g", str(graph), "-c", str(cluster), "--method", "random", "--budget-evals", "40",
                  "--verify-top", "2", "--testbed", "2", "--model", "pt_user_towers:three_towers", cwd=models)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "graph 'pt_user_towers:two_towers': --model pt_user_towers:three_towers gives " in r.stderr
    out = tmp_path / "best.json"
    r = placetool("search", "-g", str(graph), "-c", str(cluster), "--method", "random", "--budget-evals", "40",
                  "--verify-top", "2", "--testbed", "2", "--json", "--out", str(out), "--trust-graph-source",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"placetool: importing module 'pt_user_towers' from {models.resolve() / 'pt_user_towers.py'}" in r.stderr
    d = json.loads(r.stdout)
    v = d["verified"]
    rows = v["rows"]
    assert [x["source"] for x in rows] == ["search", "search", "single", "baseline"]
    assert [x["label"] for x in rows[:3]] == ["search #1", "search #2", "single"]
    for x in rows:
        assert x["measured_us"] > 0 and len(x["round_us"]) == 3 and x["spread_pct"] >= 0
        assert x["error_pct"] == pytest.approx(100 * (x["predicted_us"] - x["measured_us"]) / x["measured_us"])
    assert rows[0]["predicted_us"] == pytest.approx(d["step_time_us"])  # no profile: no overhead added
    rec = rows[v["recommended"]]
    assert v["recommended_label"] == rec["label"]
    # the recommendation is never measured slower than the best baseline beyond the noise
    base = min(x["measured_us"] for x in rows if x["source"] != "search")
    assert rec["measured_us"] <= base * (1 + max(x["spread_pct"] for x in rows) / 100)
    written = json.loads(out.read_text())
    assert written["verified"] == {"label": rec["label"], "measured_us": rec["measured_us"],
                                   "confirmed": v["confirmed"]}
    used = sorted(set(written["devices"].values()))
    assert used == rec["devices_used"]


@pytest.mark.parametrize("args,msg", [
    (["-g", "synthetic-1k", "--refine", "2"], "--refine only applies with --verify-top"),
    (["-g", "synthetic-1k", "--verify-top", "1", "--testbed", "2", "--refine", "2", "--profile-out", "p.json"],
     "--profile-out needs --refine and --profile"),
])
def test_refine_options_are_checked_before_anything_runs(args, msg):
    r = placetool("search", "--method", "single", *args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def _refine_two_towers(tmp_path, cluster_toml) -> dict:
    """``search -m sa --verify-top 2 --refine 2`` of an imported two-tower model on a
    2-worker testbed and ``cluster_toml``: the result's ``verified``."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "pt_user_towers.py").write_text(MODEL)
    graph = tmp_path / "my.npz"
    assert placetool("import", "pt_user_towers:two_towers", "--batch", "32", "--out", str(graph),
                     cwd=models).returncode == 0
    cluster = tmp_path / "cpu2.toml"
    cluster.write_text(cluster_toml)
    r = placetool("search", "-g", str(graph), "-c", str(cluster), "--method", "sa", "--budget-evals", "60",
                  "--verify-top", "2", "--refine", "2", "--testbed", "2", "--json", "--trust-graph-source",
                  cwd=models)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["verified"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_refine_measures_refits_and_searches_again(tmp_path):
    """--verify-top 2 --refine 2 on a 2-worker testbed: each round measures the search's
    picks, two diverse splits and the baselines, refits the transfer costs on every step
    measured so far (the diverse ones held out) and searches again from the best measured."""
    v = _refine_two_towers(tmp_path, CPU2)
    rounds = v["refine"]["rounds"]
    assert 1 <= len(rounds) <= 2 and v["refine"]["stopped"] in ("prediction within the noise floor", "rounds")
    labels = [x["label"] for x in v["rows"]]
    assert "diverse #1" in labels and "diverse #2" in labels and "single" in labels
    for i, t in enumerate(rounds):
        assert t["round"] == i + 1 and t["samples"] >= 5  # 2 picks, 2 diverse, single (+ a baseline)
        assert t["error_pct"] == pytest.approx(100 * (t["predicted_us"] - t["measured_us"]) / t["measured_us"])
        assert t["held_out_median_abs_error_pct"] is not None and set(t["params"]) >= {"latency_us", "send_us"}
    n = [t["samples"] for t in rounds]
    assert all(b > a for a, b in zip(n, n[1:]))  # every round's steps join the fit
    if len(rounds) == 2:
        assert "best measured (" in " ".join(labels)  # the best so far is measured again in the next round
    # never recommended slower than the best baseline beyond the noise
    rec = v["rows"][v["recommended"]]
    base = min(x["measured_us"] for x in v["rows"] if x["source"] not in ("search", "diverse"))
    assert rec["measured_us"] <= base * (1 + v["noise_floor_pct"] / 100)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_refine_under_the_workers_rule_identifies_costs_from_traced_steps(tmp_path):
    """Under links.send "workers", --refine traces calibrate's designed splits once and
    the measured split placements of the search and the best baseline every round, and
    identifies the per-message costs from those traced steps (every round's kept); the
    diverse splits are not traced, and judge the costs."""
    graph, v = tmp_path / "my.npz", _refine_two_towers(tmp_path, CPU2_WORKERS)
    assert v["refine"]["rule"] == "traced steps (workers)" and "recordings" not in v
    rounds = v["refine"]["rounds"]
    # round 1 traced calibrate's designed splits (2 steps each), and every round 2 steps of
    # each distinct split placement of the search and the baseline
    from placetool.costmodel import OpGraph
    from placetool.costmodel.tf.calibrate import designed_splits
    from placetool.costmodel.tf.testbed import ClusterSpec

    designs = [x for x in designed_splits(OpGraph.load(graph), ClusterSpec.for_workers(["localhost:0"] * 2))
               if not x[0].startswith("single:")]
    assert all(t["design_samples"] == 2 * len(designs) for t in rounds)
    split = [x for x in v["rows"] if x["source"] in ("search", "baseline") and len(x["devices_used"]) > 1
             and "same_as" not in x]
    before = rounds[-2]["samples"] if len(rounds) > 1 else 2 * len(designs)
    assert rounds[-1]["samples"] - before == 2 * len(split)
    for t in rounds:
        if t["samples"]:
            assert set(t["params"]) == {"request_us", "handler_us", "send_us_per_byte", "arrive_us",
                                        "recv_us_per_byte"}
            assert t["fit_median_abs_error_pct"] >= 0 and t["held_out_median_abs_error_pct"] >= 0
    n = [t["samples"] for t in rounds]
    assert all(b >= a for a, b in zip(n, n[1:]))  # every round's traced steps are kept
    rec = v["rows"][v["recommended"]]
    base = min(x["measured_us"] for x in v["rows"] if x["source"] not in ("search", "diverse"))
    assert rec["measured_us"] <= base * (1 + v["noise_floor_pct"] / 100)
