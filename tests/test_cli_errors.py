"""Bad input to every command: one line on stderr naming the file, option or device,
exit 2, no traceback — and no silent wrong answer (the probes of a bad-input run)."""

from __future__ import annotations

import json

import pytest

from placetool.cli.main import main
from placetool.costmodel import CostModel, presets


def call(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def user_error(argv, capsys, *words):
    code, out, err = call(argv, capsys)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert str(w) in lines[0], (w, lines[0])
    return lines[0]


# ----------------------------------------------------------------- rl pretrain
@pytest.mark.parametrize("args, words", [
    (["--budget-seconds", "nan"], ["--budget-seconds", "nan"]),
    (["--seconds", "nan"], ["nan"]),                       # the old spelling, same check
    (["--budget-seconds", "-1"], ["--budget-seconds"]),
    (["--samples", "0"], ["--samples"]),
    (["--samples", "-4"], ["--samples"]),
    (["--budget-evals", "0"], ["--budget-evals"]),
    (["-g", ","], ["--graph names no graph"]),
    (["-c", " , "], ["--cluster names no cluster"]),
])
def test_rl_pretrain_arguments(tmp_path, capsys, args, words):
    base = ["rl", "pretrain", "-o", tmp_path / "pol"]
    if "-g" not in args:
        base += ["-g", "synthetic-40"]
    user_error(base + args, capsys, *words)
    assert not (tmp_path / "pol").exists()


def _without_tf(*args):
    """The CLI in a fresh process: (exit status, stderr lines, the last saying whether
    TensorFlow was imported)."""
    import subprocess
    import sys

    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('TF=' + str('tensorflow' in sys.modules), file=sys.stderr))\n"
            "from placetool.cli.main import main\nmain(sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr.strip().splitlines()


def test_rl_pretrain_unknown_policy_is_refused_before_tensorflow_loads(tmp_path):
    code, err = _without_tf("rl", "pretrain", "-g", "synthetic-40", "-c", "k80x2", "-o", tmp_path / "pol",
                            "--policy", "foo")
    assert code == 2 and err == [
        "placetool: error: rl pretrain: --policy 'foo': unknown policy (known: seq2seq, hierarchical, gdp, rule)",
        "TF=False"], err
    assert not (tmp_path / "pol").exists()


@pytest.mark.parametrize("placement,words", [("rr", "placement 'rr': expected a JSON file"),
                                             ("single:d9", "unknown device 'd9'")])
def test_verify_malformed_placement_is_refused_before_tensorflow_loads(tmp_path, placement, words):
    from .helpers import cluster

    cluster(2, kinds=["cpu", "cpu"]).save(tmp_path / "c.toml")
    code, err = _without_tf("verify", "-g", "mlp", "-c", tmp_path / "c.toml", "-p", placement, "--testbed", "2")
    assert code == 2 and len(err) == 2 and words in err[0] and err[1] == "TF=False", err


def test_rl_pretrain_keeps_a_saved_policy(tmp_path, capsys):
    pol = tmp_path / "pol"
    pol.mkdir()
    (pol / "policy.json").write_text("{}")
    user_error(["rl", "pretrain", "-g", "synthetic-40", "-o", pol], capsys, str(pol), "already holds", "--force")
    assert (pol / "policy.json").read_text() == "{}" and not (pol / "weights.npz").exists()


# ----------------------------------------------------------------- tracebacks that were
def test_cluster_path_is_a_folder(tmp_path, capsys):
    (tmp_path / "somedir.toml").mkdir()
    user_error(["simulate", "-c", tmp_path / "somedir.toml"], capsys, "somedir.toml", "folder")


def test_graph_path_is_a_folder(tmp_path, capsys):
    (tmp_path / "g.npz").mkdir()
    user_error(["info", "-g", tmp_path / "g.npz"], capsys, "g.npz", "folder")


def test_negative_seed(capsys):
    user_error(["search", "-g", "synthetic-40", "-m", "random", "--seed", "-1"], capsys, "--seed")


@pytest.mark.parametrize("method, option, words", [
    ("sa", "batch=abc", ["'sa'", "option 'batch'", "integer >= 1", "'abc'"]),   # was a TypeError deep in sa
    ("sa", "batch=-5", ["batch", "integer >= 1", "-5"]),
    ("sa", "guided=1.5", ["guided", "from 0 to 1", "1.5"]),
    ("exact", "leaf-batch=2.5", ["leaf_batch", "integer >= 1", "2.5"]),
    ("heft", "insertion=maybe", ["insertion", "true or false", "'maybe'"]),  # was taken as true
    ("m-sct", "lp-seconds=0", ["lp_seconds", "> 0"]),
    ("rl", "explore=none", ["explore", "> 0", "None"]),
    ("heft", "nonsense=1", ["'heft'", "no option 'nonsense'", "insertion, links"]),
    ("random", "seed=3", ["'random'", "no option 'seed'"]),
])
def test_search_option_of_the_wrong_kind(capsys, method, option, words):
    user_error(["search", "-g", "synthetic-40", "-m", method, "--budget-evals", "5", "--option", option], capsys,
               *words)


@pytest.mark.parametrize("value", ["nan", "inf", "0.5"])
def test_calibrate_timeout(value, tmp_path, capsys):
    user_error(["calibrate", "-g", "mlp", "--local", "--timeout", value, "-o", tmp_path / "p.json"], capsys,
               "--timeout")


def _store(tmp_path, graphs=("synthetic-40",)):
    sw = tmp_path / "s.toml"
    sw.write_text(f'[sweep]\ngraphs = {json.dumps(list(graphs))}\nclusters = ["k80x2"]\n'
                  'methods = ["single", "random"]\nseeds = [0, 1]\nbudget_evals = 8\n')
    code = main_code(["sweep", sw, "--results", tmp_path / "r.db", "-n", "1", "-q"])
    assert code == 0
    return sw, tmp_path / "r.db"


def main_code(argv):
    try:
        main([str(a) for a in argv])
    except SystemExit as e:
        return e.code
    return 0


def test_damaged_results_store(tmp_path, capsys):
    sw, db = _store(tmp_path)
    capsys.readouterr()
    # flip bytes inside the table's pages (not the header): text columns stop decoding
    data = bytearray(db.read_bytes())
    page = 4096
    for i in range(page + 100, len(data), 7):
        data[i] ^= 0xA5
    db.write_bytes(bytes(data))
    user_error(["report", db, "--out", tmp_path / "rep", "--no-gantt"], capsys, db)
    user_error(["sweep", sw, "--results", db, "--dry-run"], capsys, db)


@pytest.mark.parametrize("damage", ["graph = X'ff00'", "seed = 'zero'", "status = 7"])
def test_results_row_of_the_wrong_type(tmp_path, capsys, damage):
    # a flipped record header decodes without an SQLite error, as values of another type
    import sqlite3

    sw, db = _store(tmp_path)
    capsys.readouterr()
    con = sqlite3.connect(db)
    con.execute("PRAGMA ignore_check_constraints = 1")
    with con:
        con.execute(f"UPDATE runs SET {damage} WHERE id = 1")
    con.close()
    line = user_error(["sweep", sw, "--results", db, "--dry-run"], capsys, db)
    assert "damaged row" in line


def test_results_file_that_is_not_sqlite(tmp_path, capsys):
    (tmp_path / "r.db").write_bytes(b"\x00garbage" * 100)
    user_error(["report", tmp_path / "r.db"], capsys, "r.db")


# ----------------------------------------------------------------- silent wrong answers
def test_report_names_do_not_collide(tmp_path, capsys):
    for v in ("v1", "v2"):
        (tmp_path / v).mkdir()
        presets.load_graph(f"synthetic-{40 if v == 'v1' else 60}").save(tmp_path / v / "model.npz")
    _store(tmp_path, graphs=("v1/model.npz", "v2/model.npz"))
    capsys.readouterr()
    code, out, err = call(["report", tmp_path / "r.db", "--out", tmp_path / "rep", "--json"], capsys)
    assert code == 0, err
    files = json.loads(out)["files"]
    gantts = [f for f in files if "gantt_" in f]
    assert len(gantts) == 2 and len(set(files)) == len(files)
    assert all((tmp_path / "rep" / f.split("/")[-1]).is_file() for f in files)


@pytest.fixture
def placement_file(tmp_path):
    cm = CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x2"))
    doc = cm.placement_to_json(cm.single_device(1))

    def write(**change):
        d = json.loads(json.dumps(doc))
        for k, v in change.items():
            if k == "device":
                d["devices"][next(iter(d["devices"]))] = v
            else:
                d[k] = v
        p = tmp_path / "p.json"
        p.write_text(json.dumps(d))
        return p
    return write


@pytest.mark.parametrize("change, words", [
    ({"version": 2}, ["version: 2"]),
    ({"version": True}, ["version"]),
    ({"format": "other"}, ["format: 'other'"]),
    ({"device": True}, ["must be a device name or index, got True"]),
    ({"device": 1.0}, ["got 1.0"]),
    ({"device": None}, ["got None"]),
])
def test_placement_file_checks(placement_file, capsys, change, words):
    p = placement_file(**change)
    user_error(["simulate", "-g", "synthetic-40", "-c", "k80x2", "-p", p], capsys, p, *words)


def test_placement_file_by_index_and_name_still_load(placement_file, capsys):
    import math

    p = placement_file(device=1)
    code, out, _ = call(["simulate", "-g", "synthetic-40", "-c", "k80x2", "-p", p, "--json"], capsys)
    cm = CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x2"))
    want = cm.simulate(cm.load_placement(p)).step_time_us  # inf (a split group) is null in JSON
    assert code == 0 and json.loads(out)["step_time_us"] == (want if math.isfinite(want) else None)


CLUSTER = """name = "c"
[[devices]]
name = "cpu:0"
kind = "cpu"
memory_bytes = {mem}
{extra}
[[devices]]
name = "gpu:0"
kind = "gpu"
memory_bytes = 12884901888
[links.default]
latency_us = 10.0
bandwidth_bytes_per_us = {bw}
"""


@pytest.mark.parametrize("fields, words", [
    (dict(extra="peak_flop_per_us = 1e6"), ["unknown field 'peak_flop_per_us'", "cpu:0"]),
    (dict(bw="inf"), ["bandwidth_bytes_per_us", "finite", "inf"]),
    (dict(bw="nan"), ["bandwidth_bytes_per_us"]),
    (dict(mem="1.5e10"), ["memory_bytes", "whole number"]),
    (dict(mem="0.5"), ["memory_bytes"]),
])
def test_cluster_file_checks(tmp_path, capsys, fields, words):
    d = dict(mem="68719476736", extra="", bw="1.2e4") | fields
    p = tmp_path / "c.toml"
    p.write_text(CLUSTER.format(**d))
    user_error(["simulate", "-g", "synthetic-40", "-c", p], capsys, p, *words)


def test_cluster_file_good_one_loads(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text(CLUSTER.format(mem="68719476736", extra="launch_overhead_us = 1.0", bw="1.2e4"))
    code, out, _ = call(["simulate", "-g", "synthetic-40", "-c", p, "--json"], capsys)
    assert code == 0


def test_calibrate_device_sources_conflict(tmp_path, capsys):
    user_error(["calibrate", "-g", "mlp", "--local", "--testbed", "2", "-o", tmp_path / "p.json"], capsys,
               "--testbed", "--local")


@pytest.mark.slow
def test_zoo_arg_the_builder_refuses(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    user_error(["calibrate", "-g", "mlp", "--zoo-arg", "hidden=abc", "--local", "-q", "-o", tmp_path / "p.json"],
               capsys, "mlp", "--zoo-arg hidden=abc")
    assert not (tmp_path / "p.json").exists()


@pytest.mark.slow
def test_import_of_an_empty_graph_is_refused(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    empty = tmp_path / "empty.pb"
    empty.write_bytes(b"")  # a valid, empty GraphDef
    user_error(["import", empty, "-o", tmp_path / "g.npz"], capsys, "empty.pb", "no ops")
    assert not (tmp_path / "g.npz").exists()


@pytest.mark.slow
def test_import_quiet_prints_nothing(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    code, out, err = call(["import", "mlp", "--batch", "16", "-o", tmp_path / "g.npz", "-q"], capsys)
    assert (code, out, err) == (0, "", "") and (tmp_path / "g.npz").is_file()


@pytest.mark.slow
def test_rl_pretrain_budget_evals(tmp_path, capsys):
    """--budget-evals stops within one training step of that many simulated placements."""
    pytest.importorskip("tensorflow")
    code, out, err = call(["rl", "pretrain", "-g", "synthetic-120", "-c", "k80x2", "-o", tmp_path / "pol",
                           "--budget-evals", "40", "--samples", "8", "--json"], capsys)
    assert code == 0, err
    info = json.loads(out)
    assert 40 <= info["samples"] < 40 + 9 and (tmp_path / "pol" / "weights.npz").is_file()


# ----------------------------------------------------------------- found by a fault probe
def test_output_that_is_an_input_is_refused(tmp_path, capsys):
    g = tmp_path / "g.npz"
    presets.load_graph("synthetic-40").save(g)
    before = g.read_bytes()
    user_error(["search", "-g", g, "-c", "k80x2", "-m", "single", "-o", g], capsys, "--out", "--graph", "destroy")
    assert g.read_bytes() == before
    p = tmp_path / "p.json"
    assert main_code(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "single", "-o", p, "-q"]) == 0
    before = p.read_bytes()
    user_error(["simulate", "-g", "synthetic-40", "-c", "k80x2", "-p", p, "--trace", p], capsys, "--trace",
               "--placement")
    user_error(["show", "-g", "synthetic-40", "-c", "k80x2", "-p", p, "-o", p], capsys, "--placement")
    assert p.read_bytes() == before


def test_output_through_a_link_keeps_the_link(tmp_path, capsys):
    target = tmp_path / "t.json"
    target.write_text("old")
    link = tmp_path / "l.json"
    link.symlink_to(target)
    assert main_code(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "single", "-o", link, "-q"]) == 0
    assert link.is_symlink() and json.loads(target.read_text())["graph"] == "synthetic-40"


def test_seeds_option_names_methods(capsys):
    code, out, err = call(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "sa", "--budget-evals", "20",
                           "--option", "seeds=single,m-etf", "--json"], capsys)
    assert code == 0, err
    assert sorted(json.loads(out)["metadata"]["seeds"]) == ["m-etf", "single"]  # best first
    user_error(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "sa", "--budget-evals", "20",
                "--option", "seeds=bogus"], capsys, "option 'seeds'", "bogus", "m-etf")


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace('kind = "cpu"', 'kind = "gpu"'), ["has no device", "that can run it"]),
    (lambda t: t.replace("memory_bytes = 68719476736", "memory_bytes = 999999999999999999999999", 1),
     ["memory_bytes"]),
    (lambda t: t.replace('name = "cpu:0"', 'name = ""'), ["name must be non-empty"]),
    (lambda t: t.replace("latency_us = 10.0", "latencyus = 10.0\nlatency_us = 10.0"), ["unknown field 'latencyus'",
                                                                                      "links.default"]),
    (lambda t: t + '[[links.pairs]]\nsrc = "cpu:0"\ndst = "gpu:0"\nbandwith_bytes_per_us = 1.0\n',
     ["unknown field 'bandwith_bytes_per_us'", "links.pairs[0]"]),
    (lambda t: t.replace("latency_us = 10.0", "latency_us = 1e308"), ["latency_us", "at most"]),
    (lambda t: "colour = 3\n" + t, ["unknown field 'colour'"]),
    (lambda t: t.replace('kind = "cpu"', 'kind = "cpu"\npeak_flops_per_us = 1e-300', 1), ["peak_flops_per_us",
                                                                                            "at least"]),
])
def test_cluster_files_the_probe_broke(tmp_path, capsys, edit, words):
    p = tmp_path / "c.toml"
    p.write_text(edit(CLUSTER.format(mem="68719476736", extra="", bw="1.2e4")))
    user_error(["simulate", "-g", "synthetic-40", "-c", p], capsys, *words)


@pytest.mark.parametrize("name", ["synthetic-1", "synthetic-0", "synthetic-99999999999"])
def test_synthetic_sizes_out_of_range(capsys, name):
    user_error(["info", "-g", name], capsys, name, "2 to")


def test_profile_fit_that_predicts_negative_times(tmp_path, capsys):
    prof = {"format": "placetool.profile", "version": 1, "devices": [], "ops": {},
            "fits": {"gpu": {"*": {"intercept_us": -1e6, "us_per_flop": 0.0, "us_per_byte": 0.0}}}}
    p = tmp_path / "p.json"
    p.write_text(json.dumps(prof))
    user_error(["simulate", "-g", "synthetic-40", "-c", "k80x2", "--profile", p], capsys, "fits.gpu.*", ">= 0")


def test_deeply_nested_input(tmp_path, capsys):
    p = tmp_path / "d.json"
    p.write_text("[" * 100000 + "]" * 100000)
    user_error(["simulate", "-g", "synthetic-40", "-c", "k80x2", "-p", p], capsys, "d.json", "nested too deeply")


def test_json_output_has_no_infinity(placement_file, capsys):
    # the input pipeline's first op moved to the GPU, which has no kernel for it: the
    # step time is inf, which JSON spells null (Python's json would write Infinity)
    code, out, err = call(["simulate", "-g", "synthetic-40", "-c", "k80x2", "-p", placement_file(device=1),
                           "--json"], capsys)
    assert code == 0, err
    d = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert d["step_time_us"] is None and d["feasible"] is False


def test_tpe_storage_checked_before_the_seeds(capsys):
    user_error(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "tpe", "--budget-evals", "5",
                "--storage", "bogus://x"], capsys, "bogus://x")


def test_placement_file_with_another_suffix(tmp_path, capsys):
    p = tmp_path / "best.txt"
    assert main_code(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "single", "-o", p, "-q"]) == 0
    code, _, err = call(["simulate", "-g", "synthetic-40", "-c", "k80x2", "-p", p], capsys)
    assert code == 0, err


def test_output_below_a_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    user_error(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "single", "-o", tmp_path / "afile" / "x.json"],
               capsys, "is a file, not a folder")


def test_sweep_results_path_empty(tmp_path, capsys):
    sw = tmp_path / "s.toml"
    sw.write_text('[sweep]\ngraphs = ["synthetic-40"]\nclusters = ["k80x2"]\nmethods = ["single"]\nbudget_evals = 4\n')
    user_error(["sweep", sw, "-r", ""], capsys, "--results")


def test_report_on_a_row_edited_by_hand(tmp_path, capsys):
    import sqlite3

    _, db = _store(tmp_path)
    capsys.readouterr()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET step_time_us = 'abc' WHERE id = 1")
    user_error(["report", db, "--out", tmp_path / "rep", "--no-gantt"], capsys, "step_time_us", "abc")
    assert not (tmp_path / "rep").exists()


def test_bare_command_prints_the_help(capsys):
    code, out, err = call([], capsys)
    assert code == 2 and "Usage: placetool" in err and "Commands:" in err


@pytest.mark.slow
def test_zoo_builder_refusing_a_value(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    user_error(["export", "-g", "mlp", "-p", "round-robin", "-c", "k80x2", "-o", tmp_path / "e", "-q",
                "--zoo-arg", "hidden=-5"], capsys, "mlp", "--zoo-arg hidden=-5")
    assert not (tmp_path / "e").exists()


@pytest.mark.slow
def test_model_that_exits(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tensorflow")
    (tmp_path / "exiter.py").write_text("import sys\n\ndef build():\n    sys.exit('bye')\n")
    monkeypatch.chdir(tmp_path)
    user_error(["import", "exiter:build", "-o", tmp_path / "m.npz"], capsys, "exiter:build", "SystemExit")


def test_output_into_a_pipe_stays_a_pipe(tmp_path, capsys):
    # a device or pipe cannot be replaced by a file: it is written into (a full /dev/full
    # then reports its error instead of turning into a plain file)
    import os
    import stat
    import threading

    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    assert main_code(["search", "-g", "synthetic-40", "-c", "k80x2", "-m", "single", "-o", fifo, "-q"]) == 0
    reader.join(30)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and json.loads(got[0])["graph"] == "synthetic-40"
