"""Importing real Keras / TensorFlow graphs into OpGraph (costmodel.tf.importer)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


MODELS = textwrap.dedent('''
    import keras

    def mlp():
        x = keras.Input((32,), name="features")
        h = keras.layers.Dense(64, activation="relu", name="hidden")(x)
        return keras.Model(x, keras.layers.Dense(10, name="logits")(h))

    def cnn():
        x = keras.Input((8, 8, 3), name="image")
        h = keras.layers.Conv2D(4, 3, padding="same", name="conv1")(x)
        h = keras.layers.Conv2D(6, 3, padding="valid", name="conv2")(h)
        h = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(h)
        h = keras.layers.Flatten()(h)
        return keras.Model(x, keras.layers.Dense(5, name="out")(h))

    def fails():
        x = keras.Input((4,))
        return keras.Model(x, keras.layers.Dense(2)(keras.layers.Reshape((3, 3))(x)))

    def not_a_model():
        return 42
''')


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    (d / "pt_test_models.py").write_text(MODELS)
    return d


@pytest.fixture(scope="module")
def tf():
    from placetool.costmodel.tf.session import import_tf

    return import_tf()


@pytest.fixture(scope="module")
def traced(models_dir, tf):
    from placetool.costmodel.tf.importer import trace

    cwd = os.getcwd()
    os.chdir(models_dir)
    try:
        return trace("pt_test_models:mlp", mode="train", batch=16)
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def traced_cnn(models_dir, tf):
    from placetool.costmodel.tf.importer import trace

    cwd = os.getcwd()
    os.chdir(models_dir)
    try:
        return trace("pt_test_models:cnn", mode="train", batch=2)
    finally:
        os.chdir(cwd)


def _tf_graph(tf, graph_def):
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return g


def test_op_names_one_to_one_with_tf_graph(traced, tf):
    g, gd = traced.graph, traced.graph_def
    assert g.n_ops == len(gd.node) == len(_tf_graph(tf, gd).get_operations())
    assert g.names == [n.name for n in gd.node]
    assert g.op_types == [n.op for n in gd.node]
    # data edges: one per distinct (producer output, consumer) input of the GraphDef
    want = {(n.name, i.split(":")[0]) for n in gd.node for i in n.input if not i.startswith("^")}
    got = {(g.names[d], g.names[s]) for s, d, t in zip(g.edge_src, g.edge_dst, g.edge_tensor) if t >= 0}
    assert got == want


def test_matmul_flops_are_2mnk(traced):
    g = traced.graph
    i = next(k for k, n in enumerate(g.names)
             if g.op_types[k] == "MatMul" and "hidden" in n and not n.startswith("gradient_tape"))
    assert g.flops[i] == 2 * 16 * 32 * 64
    j = next(k for k, n in enumerate(g.names)
             if g.op_types[k] == "MatMul" and "logits" in n and not n.startswith("gradient_tape"))
    assert g.flops[j] == 2 * 16 * 64 * 10
    # backward MatMuls of a dense layer do the same multiply-adds as its forward one
    bw = [g.flops[k] for k, n in enumerate(g.names)
          if g.op_types[k] == "MatMul" and n.startswith("gradient_tape") and "logits" in n]
    assert sorted(bw) == [2 * 16 * 64 * 10] * 2


def _run_step(tf, traced):
    """Run the traced step in a TF1 Session the way the hardware runner does; returns
    {tensor name: value} for every non-resource tensor of the step."""
    from placetool.costmodel.tf.session import runnable_graph_def, session_config

    gd, init = runnable_graph_def(traced)
    assert [n.name for n in gd.node] == traced.graph.names
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(gd, name="")
        assert sorted(op.name for op in g.get_operations()) == sorted(traced.graph.names)
        reads = {k: tf.raw_ops.ReadVariableOp(resource=g.get_tensor_by_name(k + ":0"),
                                              dtype=tf.as_dtype(v.dtype), name="check/" + k)
                 for k, v in init.items()}
        inits = [tf.raw_ops.AssignVariableOp(resource=g.get_tensor_by_name(k + ":0"), value=v,
                                             name="init/" + k) for k, v in init.items()]
        fetch = [t for op in g.get_operations() if op.name in traced.graph.index
                 for t in op.outputs if t.dtype not in (tf.resource, tf.variant)]
    with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
        sess.run(inits)
        vals = sess.run(fetch + [g.get_operation_by_name(f) for f in traced.fetches],
                        feed_dict={k + ":0": v for k, v in traced.feeds.items()})
        after = sess.run(reads)
    # one step ran: every trainable variable (and the iteration counter) moved
    changed = [k for k in init if not np.array_equal(after[k], init[k])]
    assert len(changed) >= len(init) - 1, (changed, list(init))  # learning rate stays
    return {t.name: v for t, v in zip(fetch, vals)}


def test_tensor_bytes_are_elements_times_dtype_size(traced, tf):
    """Every tensor's bytes equal what a real run of the step produces (elements x size)."""
    g = traced.graph
    vals = _run_step(tf, traced)
    idx = g.tensor_output_index
    checked = 0
    for t in range(g.n_tensors):
        key = f"{g.names[g.tensor_op[t]]}:{idx[t]}"
        if key in vals:
            v = np.asarray(vals[key])
            assert g.tensor_bytes[t] == v.size * v.dtype.itemsize, key
            checked += 1
    assert checked > 50
    assert np.array_equal(g.out_bytes, np.bincount(g.tensor_op, g.tensor_bytes, g.n_ops).astype(np.int64))


def test_resource_consumers_share_their_variables_group(traced, tf):
    g, gd = traced.graph, traced.graph_def
    ops = {op.name: op for op in _tf_graph(tf, gd).get_operations()}
    var_phs = {name for name, v in traced.captures if isinstance(v, tf.Variable)}
    assert len(var_phs) >= 5  # 4 weights + learning rate + iteration counter
    consumers = 0
    for n in gd.node:
        for inp in n.input:
            if inp.startswith("^"):
                continue
            src, _, k = inp.partition(":")
            if ops[src].outputs[int(k or 0)].dtype == tf.resource:
                assert g.group[g.index[n.name]] == g.group[g.index[src]], (n.name, src)
                consumers += 1
    # 4 weights x (read + AssignSub), learning rate read 4x, iterations read + assign
    assert consumers == 4 * 2 + 4 + 2
    # and the variable's bytes are the placeholder's parameter bytes
    kernel = next(v for name, v in traced.captures if isinstance(v, tf.Variable)
                  and tuple(v.shape) == (32, 64))
    name = next(nm for nm, v in traced.captures if v is kernel)
    assert g.param_bytes[g.index[name]] == 32 * 64 * 4


def test_train_step_has_gradients_and_updates(traced, tf):
    g = traced.graph
    types = g.op_types
    assert "BiasAddGrad" in types and "ReluGrad" in types
    assert sum(n.startswith("gradient_tape/") for n in g.names) > 5
    assert types.count("AssignSubVariableOp") == 4  # SGD: one update per trainable variable
    assert set(traced.fetches) <= set(g.names)
    assert any(g.op_types[g.index[f]] == "AssignSubVariableOp" for f in traced.fetches)
    assert set(traced.feeds) == {"features", "target"}
    assert traced.feeds["features"].shape == (16, 32)
    assert g.meta["mode"] == "train" and g.meta["batch"] == 16


def test_infer_mode_has_no_gradients(models_dir, monkeypatch, tf):
    from placetool.costmodel.tf.importer import trace

    monkeypatch.chdir(models_dir)
    tr = trace("pt_test_models:mlp", mode="infer", batch=4)
    assert not any(n.startswith("gradient_tape/") for n in tr.graph.names)
    assert "AssignSubVariableOp" not in tr.graph.op_types
    assert tr.graph.flops.sum() == 2 * 4 * 32 * 64 + 2 * 4 * 64 * 10 + 4 * 64 * 2 + 4 * 10


def test_adam_slots_are_grouped_with_their_updates(models_dir, monkeypatch, tf):
    from placetool.costmodel.tf.importer import trace

    monkeypatch.chdir(models_dir)
    tr = trace("pt_test_models:mlp", mode="train", batch=4, optimizer="adam")
    g = tr.graph
    var_phs = [name for name, v in tr.captures if isinstance(v, tf.Variable)]
    # 4 weights, 8 moments, iterations, learning rate
    assert len(var_phs) >= 14
    for name in var_phs:
        members = g.group_ops[g.group[g.index[name]]]
        assert len(members) >= 2  # read or updated by some op in its group
    assert g.meta["optimizer"] == "adam"


def test_conv_and_depthwise_flops(traced_cnn):
    g = traced_cnn.graph

    def one(op_type, layer):
        vals = [g.flops[k] for k, n in enumerate(g.names)
                if g.op_types[k] == op_type and f"/{layer}_" in n]
        assert len(vals) == 1, (op_type, layer, vals)
        return vals[0]

    conv1 = 2 * 2 * 8 * 8 * 4 * 3 * 3 * 3
    conv2 = 2 * 2 * 6 * 6 * 6 * 3 * 3 * 4
    dw = 2 * 2 * 6 * 6 * 6 * 3 * 3
    assert one("Conv2D", "conv1") == conv1
    assert one("Conv2D", "conv2") == conv2
    assert one("Conv2DBackpropFilter", "conv2") == conv2
    assert one("Conv2DBackpropInput", "conv2") == conv2
    assert one("DepthwiseConv2dNative", "dw") == dw
    assert one("DepthwiseConv2dNativeBackpropFilter", "dw") == dw
    assert one("DepthwiseConv2dNativeBackpropInput", "dw") == dw


def test_string_ops_pinned_and_colocation_from_graph_def(tmp_path, tf):
    from placetool.costmodel.graph import KIND_BITS
    from placetool.costmodel.tf.importer import trace

    g0 = tf.Graph()
    with g0.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 3), name="x")
        y = tf.matmul(x, tf.ones((3, 2)), name="mm")
        s = tf.strings.as_string(y, name="as_str")
        tf.strings.reduce_join(s, name="join")
        with g0.colocate_with(y.op):
            tf.identity(y, name="colo")
    path = tmp_path / "g.pbtxt"
    tf.io.write_graph(g0.as_graph_def(), str(tmp_path), "g.pbtxt", as_text=True)
    tr = trace(str(path), batch=4)
    g = tr.graph
    assert g.n_ops == len(g0.get_operations())
    cpu = KIND_BITS["cpu"]
    assert g.allowed[g.index["as_str"]] == cpu
    assert g.allowed[g.index["ReduceJoin/join"]] == cpu
    assert g.allowed[g.index["mm"]] == 3
    assert g.group[g.index["colo"]] == g.group[g.index["mm"]]
    assert g.flops[g.index["mm"]] == 2 * 4 * 3 * 2
    assert tr.feeds["x"].shape == (4, 3)
    # binary GraphDef gives the same graph
    tf.io.write_graph(g0.as_graph_def(), str(tmp_path), "g.pb", as_text=False)
    g2 = trace(str(tmp_path / "g.pb"), batch=4).graph
    assert g2.names == g.names and np.array_equal(g2.flops, g.flops)


def test_saved_model_infer(models_dir, tmp_path, monkeypatch, tf):
    from placetool.costmodel.tf.importer import trace

    monkeypatch.chdir(models_dir)
    monkeypatch.syspath_prepend(str(models_dir))
    import pt_test_models

    pt_test_models.cnn().export(str(tmp_path / "sm"), verbose=False)
    tr = trace(str(tmp_path / "sm"), mode="infer", batch=4)
    g = tr.graph
    conv = [g.flops[i] for i, n in enumerate(g.names) if g.op_types[i] == "Conv2D"]
    assert sorted(conv) == sorted([2 * 4 * 8 * 8 * 4 * 27, 2 * 4 * 6 * 6 * 6 * 36])
    assert g.param_bytes.sum() == 4 * (27 * 4 + 4 + 36 * 6 + 6 + 9 * 6 + 6 + 216 * 5 + 5)
    assert g.meta["unknown_shapes"] == 0 and g.names == [n.name for n in tr.graph_def.node]
    # recorded so it can be traced again, from anywhere
    assert g.meta["trace"] == {"kind": "saved_model", "source": str((tmp_path / "sm").resolve()), "mode": "infer",
                               "batch": 4, "optimizer": None}
    # the inlined signature's node names are numbered per process (TF's function uids), so
    # the same steps in fresh processes give the same names: `placetool import` in one,
    # tracing again (as `search --verify-top` does) in another
    r = subprocess.run([sys.executable, "-m", "placetool.cli.main", "import", str(tmp_path / "sm"), "--mode", "infer",
                        "--batch", "4", "--out", str(tmp_path / "sm.npz")], capture_output=True, text=True,
                       timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    code = ("import sys; from placetool.costmodel.graph import load\n"
            "from placetool.costmodel.tf.importer import retrace\n"
            "g = load(sys.argv[1]); print(retrace(g, trust=True).graph.names == g.names)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sm.npz")], capture_output=True, text=True,
                       timeout=240, cwd=tmp_path)
    assert r.stdout.strip() == "True", r.stderr[-2000:]
    with pytest.raises(Exception, match="use --mode infer"):
        trace(str(tmp_path / "sm"), mode="train", batch=4)


def test_save_load_round_trip(traced, tmp_path):
    from placetool.costmodel.graph import load

    g = traced.graph
    g.save(tmp_path / "m.npz")
    h = load(tmp_path / "m.npz")
    assert h.names == g.names and h.op_types == g.op_types
    for f in ("out_bytes", "param_bytes", "flops", "group", "allowed", "layer", "tensor_op",
              "tensor_bytes", "edge_src", "edge_dst", "edge_tensor"):
        assert np.array_equal(getattr(h, f), getattr(g, f)), f
    assert h.meta == g.meta


def test_zoo_layer_tags_follow_keras_layers(tf):
    from placetool.costmodel.tf.importer import trace

    tr = trace("mlp", batch=8)
    g = tr.graph
    assert g.meta["expert"] == "single-gpu"
    lay = {n: int(g.layer[i]) for i, n in enumerate(g.names)}
    fwd0 = [n for n in g.names if "/dense_0" in n and not n.startswith("gradient_tape")]
    bwd1 = [n for n in g.names if n.startswith("gradient_tape/") and "/logits" in n]
    assert fwd0 and bwd1
    assert all(lay[n] == 0 for n in fwd0)
    assert all(lay[n] == 1 for n in bwd1)
    assert (g.layer >= 0).all()
    for ops in g.group_ops:  # one tag per group
        assert len(set(g.layer[ops].tolist())) == 1


def _cli(args, cwd):
    from placetool.cli.main import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        with pytest.raises(SystemExit) as e:
            main(args)
    finally:
        os.chdir(old)
    return e.value.code


@pytest.mark.parametrize("source, message", [
    ("pt_test_models:nope", "has no function 'nope'"),
    ("no_such_module_xyz:f", "cannot import module"),
    ("pt_test_models:fails", "building the model failed"),
    ("pt_test_models:not_a_model", "not a keras.Model"),
    ("pt_test_models:mlp", "dynamic batch dimension; give --batch"),
    ("not_a_zoo_name", "unknown model source"),
])
def test_import_errors_are_one_line_exit_2(source, message, models_dir, tmp_path, capsys, tf):
    out = tmp_path / "x.npz"
    assert _cli(["import", source, "--out", str(out)], models_dir) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("placetool: error:") and message in err[0], err
    assert not out.exists()


def test_cli_import_subprocess_one_line(models_dir, tmp_path):
    """The real console script: TF's startup logging stays off the user's stderr."""
    exe = Path(sys.executable).with_name("placetool")
    r = subprocess.run([str(exe), "import", "pt_test_models:mlp", "--out", str(tmp_path / "a.npz")],
                       cwd=models_dir, capture_output=True, text=True, timeout=240)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "placetool: error: pt_test_models:mlp: input 0 has a dynamic batch dimension; give --batch"]


def test_cli_import_json(models_dir, tmp_path, capsys, tf):
    import json

    from placetool.costmodel.graph import load

    out = tmp_path / "a.npz"
    assert _cli(["import", "pt_test_models:mlp", "--batch", "8", "--json", "--out", str(out)],
                models_dir) == 0
    s = json.loads(capsys.readouterr().out)
    g = load(out)
    assert s["ops"] == g.n_ops and s["total_flops"] == g.flops.sum() and s["mode"] == "train"
    assert g.meta["batch"] == 8


def test_tracing_the_same_source_twice_gives_the_same_op_names():
    # Keras numbers layers per process; profiles and placements are keyed by op name.
    from placetool.costmodel.tf.importer import trace

    a = trace("mlp", batch=8).graph
    b = trace("mlp", batch=8).graph
    assert a.names == b.names and any("dense" in n for n in a.names)



# ---------------------------------------------------------------- one module owns TensorFlow
def _clean_env():
    """The user's environment: no oneDNN or log-level presets (tests/conftest.py sets both)."""
    return {k: v for k, v in os.environ.items() if k not in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL")}


def test_local_devices_load_tensorflow_with_onednn_off():
    """`calibrate --local` / `verify --local` find the devices before anything else: that
    first import of TensorFlow must already have oneDNN's rewrites off."""
    code = ("import os\n"
            "from placetool.cli.hardware import planned_spec\n"
            "spec = planned_spec(None, 'cpu', None, True)\n"
            "from tensorflow.python.util import _pywrap_util_port as port\n"
            "print(spec.tf_devices[0], os.environ.get('TF_ENABLE_ONEDNN_OPTS'), port.IsMklEnabled())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=_clean_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/job:localhost/replica:0/task:0/device:CPU:0", "0", "False"]


HIDE_TF = textwrap.dedent('''
    import sys

    class HideTF:  # as if TensorFlow were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow" or name.startswith("tensorflow."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, HideTF())
    from placetool.cli.main import main
    main(sys.argv[1:])
''')


@pytest.mark.parametrize("args", [
    ["import", "mlp", "--out", "{tmp}/x.npz"],
    ["calibrate", "-g", "mlp", "--testbed", "2", "--out", "{tmp}/p.json"],
    ["verify", "-g", "mlp", "-p", "round-robin", "-c", "k80x2", "--testbed", "2"],
    ["testbed", "up", "--workers", "1", "--state", "{tmp}/tb.json"],
    ["search", "-g", "nmt", "-m", "single", "--verify-top", "1", "--testbed", "5"],
])
def test_commands_that_need_tensorflow_say_how_to_install_it(args, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = subprocess.run([sys.executable, "-c", HIDE_TF, *args], capture_output=True, text=True, timeout=120,
                       env=_clean_env())
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == ['placetool: error: TensorFlow is not installed: pip install "placetool[tf]"']
    assert not list(tmp_path.iterdir())  # nothing written, no testbed state


def test_import_tf_without_tensorflow_is_a_user_error():
    code = HIDE_TF.replace("from placetool.cli.main import main\nmain(sys.argv[1:])\n", textwrap.dedent('''
        from placetool.costmodel.errors import UserError
        from placetool.costmodel.tf.session import import_tf
        try:
            import_tf()
        except UserError as e:
            print(type(e).__name__, e)
    '''))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == 'TensorFlowMissing TensorFlow is not installed: pip install "placetool[tf]"'


def test_zoo_does_not_import_the_importer():
    code = ("import sys, placetool.costmodel.tf.zoo\n"
            "print(sorted(m for m in sys.modules if m.startswith('placetool.costmodel.tf.')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert eval(r.stdout) == ["placetool.costmodel.tf.zoo"]


# ---------------------------------------------------------------- tracing again
def test_graph_files_record_their_source_and_trace_again(tmp_path, monkeypatch, tf):
    from placetool.costmodel.graph import load
    from placetool.costmodel.tf.importer import retrace, trace, trace_source

    g = trace("mlp", batch=8, optimizer="adam", hidden=12).graph
    g.save(tmp_path / "m.npz")
    h = load(tmp_path / "m.npz")
    assert h.meta["trace"] == {"kind": "zoo", "source": "mlp", "args": {"hidden": 12}, "batch": 8,
                               "mode": "train", "optimizer": "adam"}
    again = retrace(h)
    assert again.graph.names == h.names and np.array_equal(again.graph.flops, h.flops)
    # a GraphDef file is recorded by absolute path, so it traces again from anywhere
    pb = tmp_path / "step.pb"
    pb.write_bytes(trace("mlp", batch=4, mode="infer").graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    pg = trace("step.pb").graph
    src = trace_source(pg)
    assert src["kind"] == "graph_def" and src["source"] == str(pb.resolve()) and src["mode"] == "as-is"
    # a file the graph names is loaded again only when the user says so
    from placetool.costmodel.tf.importer import ModelImportError

    with pytest.raises(ModelImportError, match="does not run or load a model a graph file names"):
        retrace(pg)
    said = []
    assert retrace(pg, trust=True, say=said.append).graph.names == pg.names
    assert said == [f"loading GraphDef {pb.resolve()} (recorded in graph 'step', --trust-graph-source)"]
    assert retrace(pg, model="step.pb").graph.names == pg.names
    # a Keras object handed to trace() has no source to trace again
    from placetool.costmodel.tf.zoo import build_mlp

    assert trace_source(trace(build_mlp().model, batch=2).graph) is None
