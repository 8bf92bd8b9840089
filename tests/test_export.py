"""placetool export / apply_placement: a placement run by TensorFlow puts each op where it says."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from placetool.cli.main import cli
from placetool.costmodel.errors import UserError

from .helpers import cluster as make_cluster


def _invoke(*args):
    return CliRunner().invoke(cli, list(args))


def test_export_refuses_bad_options_before_tracing(tmp_path):
    r = _invoke("export", "-g", "mlp", "-p", "round-robin", "-o", str(tmp_path / "o"))
    assert isinstance(r.exception, UserError) and "give --cluster" in str(r.exception)
    f = tmp_path / "file"
    f.write_text("x")
    r = _invoke("export", "-g", "mlp", "-p", "round-robin", "-c", "k80x2", "-o", str(f))
    assert r.exit_code == 2 and "is a file" in r.output
    r = _invoke("export", "-g", "mlp", "-p", "round-robin", "-c", "k80x2", "--testbed", "2", "-o", str(tmp_path / "o"))
    assert isinstance(r.exception, UserError) and "has 3 devices but 2 devices" in str(r.exception)
    assert not (tmp_path / "o").exists()


def _cli_without_tf(*args, cwd=None):
    """The CLI in a fresh process; its stderr ends with whether TensorFlow was imported."""
    import subprocess
    import sys

    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('TF=' + str('tensorflow' in sys.modules), file=sys.stderr))\n"
            "from placetool.cli.main import main\nmain(sys.argv[1:])\n")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def _refused_before_tf(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[-1] == "TF=False" and len(lines) == 2, r.stderr
    for w in words:
        assert str(w) in lines[0], (w, lines[0])


def test_export_into_a_folder_that_is_not_empty_needs_force(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    (out / "graph.pb").write_bytes(b"my graph")
    r = _cli_without_tf("export", "-g", "mlp", "-p", "round-robin", "-c", "k80x2", "-o", out)
    _refused_before_tf(r, f"--out {out} is not empty", "--force")
    assert (out / "graph.pb").read_bytes() == b"my graph" and sorted(p.name for p in out.iterdir()) == [
        "graph.pb", "notes.txt"]


def test_export_refuses_malformed_placements_and_a_second_cpu_of_one_process_before_tracing(tmp_path):
    cl = make_cluster(2, kinds=["cpu", "cpu"], name="two-cpus")
    cl.save(tmp_path / "c.toml")
    c = tmp_path / "c.toml"
    base = ("export", "-g", "mlp", "-c", c, "-o", tmp_path / "o")
    _refused_before_tf(_cli_without_tf(*base, "-p", "roundrobin"), "placement 'roundrobin': expected a JSON file")
    _refused_before_tf(_cli_without_tf(*base, "-p", "single:gpu:7"), "unknown device 'gpu:7'")
    bad = tmp_path / "bad.json"
    bad.write_text('{"devices": {"dense/MatMul": "d0"}, "step_time_us": Infinity}')
    _refused_before_tf(_cli_without_tf(*base, "-p", bad), f"{bad}: step_time_us: Infinity")
    bad.write_text('{"devices": {"dense/MatMul": "d9"}}')
    _refused_before_tf(_cli_without_tf(*base, "-p", bad), f"{bad}: devices['dense/MatMul']: unknown device 'd9'")
    # no cluster spec and no recorded TF devices: one process has no /device:CPU:1
    _refused_before_tf(_cli_without_tf(*base, "-p", "single:d1"), "device 'd1' would be /device:CPU:1",
                       "--testbed N or --cluster-spec FILE")
    # a graph file is no model to trace
    npz = tmp_path / "g.npz"
    _refused_before_tf(_cli_without_tf("export", "-g", npz, "-c", c, "-p", "single:d0", "-o", tmp_path / "o"),
                       f"--graph {npz}: a placetool graph file, not a model")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # traces the model (TensorFlow)
def test_export_round_robin_on_two_cpus_of_one_process_is_refused(tmp_path):
    cl = make_cluster(2, kinds=["cpu", "cpu"], name="two-cpus")
    cl.save(tmp_path / "c.toml")
    r = _invoke("export", "-g", "mlp", "--batch", "16", "-c", str(tmp_path / "c.toml"), "-p", "round-robin",
                "-o", str(tmp_path / "o"), "-q")
    assert isinstance(r.exception, UserError) and "device 'd1' would be /device:CPU:1" in str(r.exception)
    assert not (tmp_path / "o").exists()
    # on CPU:0 alone it is written, and --force writes into a folder holding other files
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    r = _invoke("export", "-g", "mlp", "--batch", "16", "-c", str(tmp_path / "c.toml"), "-p", "single:d0",
                "-o", str(tmp_path / "o"), "-q", "--force")
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["export.json", "graph.pb", "notes.txt",
                                                                  "placement.json"]


@pytest.fixture(scope="module")
def testbed():
    from placetool.costmodel.tf.testbed import Testbed

    with Testbed.start(2, timeout_s=120) as tb:
        yield tb


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_exported_graph_runs_on_a_testbed_with_ops_where_the_placement_says(tmp_path, testbed):
    from placetool.costmodel.tf import run_export

    cl = make_cluster(2, kinds=["cpu", "cpu"], name="two-cpus")
    cl.save(tmp_path / "c.toml")
    out = tmp_path / "placed"
    r = _invoke("export", "-g", "mlp", "--batch", "16", "-c", str(tmp_path / "c.toml"), "-p", "round-robin",
                "--testbed", "2", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output + repr(r.exception)
    pl = json.loads((out / "placement.json").read_text())
    man = json.loads((out / "export.json").read_text())
    assert set(pl["devices"].values()) == {"d0", "d1"}  # round-robin used both workers
    assert man["devices_used"] == testbed.spec.tf_devices and man["jobs"] == ["worker"]
    assert {pl["tf_devices"][op] for op, d in pl["devices"].items() if d == "d1"} == {testbed.spec.tf_devices[1]}
    got = run_export(out, testbed.spec.target, steps=2)
    assert got["step_us"] > 0 and np.isfinite(got["loss"])
    # every op of the graph ran, and on the device the placement names (FULL_TRACE step stats)
    assert set(got["op_device"]) == set(pl["tf_devices"])
    assert got["op_device"] == pl["tf_devices"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_apply_placement_trains_a_keras_model_under_a_placement(testbed):
    from placetool.costmodel.placement import Placement
    from placetool.costmodel.tf import apply_placement
    from placetool.costmodel.tf.importer import trace

    t = trace("mlp", batch=16)
    g = t.graph
    cl = make_cluster(2, kinds=["cpu", "cpu"])
    first_dense = next(i for i, n in enumerate(g.names) if n.endswith("MatMul"))
    p = np.zeros(g.n_ops, np.int32)
    p[g.group == g.group[first_dense]] = 1
    pl = Placement.from_array(g, cl, p)
    with apply_placement("mlp", pl, cluster=cl, spec=testbed, batch=16) as step:
        assert step.device_of(g.names[first_dense]) == testbed.spec.tf_devices[1]
        assert step.device_of(g.names[0]) == testbed.spec.tf_devices[0]
        x, y = (np.asarray(v) for v in t.feeds.values())
        losses = [step.run(x, y) for _ in range(8)]
        assert losses[-1] < losses[0] and len(step.step_us) == 8
        with pytest.raises(UserError, match="traced for"):
            step.run(x[:3], y[:3])
        var = next(iter(step._pg.variables.values()))
        before = var.numpy().copy()
        step.sync_to_model()
        assert not np.allclose(var.numpy(), before)  # the model now holds the trained weights
