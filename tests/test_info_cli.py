"""``placetool info``: graph facts and the bundled list; never imports TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest

from placetool.costmodel.graph import OpGraph
from placetool.costmodel.presets import data_dir


def _run(args, capsys):
    from placetool.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.fixture
def small(tmp_path):
    """Hand-made graph: x -> mm -> {relu, str}; var + read in one group; str pinned to CPU."""
    g = nx.DiGraph()
    g.add_node("x", op_type="Placeholder", out_bytes=400)
    g.add_node("var", op_type="VarHandleOp", out_bytes=0, param_bytes=1200, group="v")
    g.add_node("read", op_type="ReadVariableOp", out_bytes=1200, group="v")
    g.add_node("mm", op_type="MatMul", out_bytes=800, flops=2 * 10 * 10 * 20)
    g.add_node("relu", op_type="Relu", out_bytes=800, flops=200)
    g.add_node("str", op_type="AsString", out_bytes=1600, kinds=["cpu"])
    g.add_edge("x", "mm")
    g.add_edge("var", "read")
    g.add_edge("read", "mm")
    g.add_edge("mm", "relu")
    g.add_edge("mm", "str")
    g.add_edge("x", "str", control=True)
    og = OpGraph.from_networkx(g, "small")
    p = tmp_path / "small.npz"
    og.save(p)
    return p


def test_info_json_known_answers(small, capsys):
    code, out, _ = _run(["info", "--graph", str(small), "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert d["ops"] == 6 and d["edges"] == 6 and d["control_edges"] == 1
    assert d["groups"] == 5 and d["multi_op_groups"] == 1 and d["largest_group_ops"] == 2
    assert d["pinned_ops"] == 1 and d["pinned"] == [{"op": "str", "op_type": "AsString", "kinds": ["cpu"]}]
    assert d["total_flops"] == 4200.0
    assert d["param_bytes"] == 1200
    # tensors exist where consumed: str's output has no consumer
    assert [(t["op"], t["bytes"]) for t in d["largest_tensors"]] == [("read", 1200), ("mm", 800), ("x", 400), ("var", 0)]


def test_info_text(small, capsys):
    code, out, _ = _run(["info", "--graph", str(small)], capsys)
    assert code == 0
    assert "6 ops, 6 edges (1 control)" in out
    assert "pinned ops: 1" in out and "str (AsString): cpu only" in out
    assert "parameter bytes: 1,200" in out


def test_info_list(capsys):
    code, out, _ = _run(["info", "--list", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    names = [g["name"] for g in d["graphs"]]
    bundled = sorted(p.stem for p in (data_dir() / "graphs").glob("*.npz"))
    assert set(bundled) <= set(names) and "synthetic-1k" in names
    assert {"k80x4", "k40x2"} <= {c["name"] for c in d["clusters"]}
    k80 = next(c for c in d["clusters"] if c["name"] == "k80x4")
    assert k80["devices"] == ["cpu:0", "gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    code, out, _ = _run(["info", "--list"], capsys)
    assert code == 0 and "clusters:" in out and "k80x4" in out


def test_info_errors_one_line(tmp_path, capsys):
    code, _, err = _run(["info", "--graph", str(tmp_path / "nope.npz")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nope.npz" in err
    code, _, err = _run(["info"], capsys)
    assert code == 2 and "--graph" in err


def test_info_does_not_import_tensorflow(small):
    code = ("import sys; from placetool.cli.main import main\n"
            "try:\n    main(['info', '--graph', sys.argv[1], '--json'])\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            "assert 'tensorflow' not in sys.modules, 'TF imported'\n"
            "import placetool.costmodel.tf.zoo\nassert 'tensorflow' not in sys.modules, 'zoo imports TF'\n")
    r = subprocess.run([sys.executable, "-c", code, str(small)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


ZOO_EXPECT = {  # name: (expert, at least this many ops)
    "inception_v3": ("single-gpu", 5000), "resnet50": ("single-gpu", 5000),
    "rnnlm": ("single-gpu", 1000), "nmt": ("layers", 3000), "gnmt4": ("layers", 10000),
    "gnmt8": ("layers", 50000), "transformer": ("layers", 5000), "wavenet": ("single-gpu", 3000),
    "nasnet_mobile": ("single-gpu", 15000), "densenet121": ("single-gpu", 10000),
    "mobilenet_v2": ("single-gpu", 4000), "xception": ("single-gpu", 4000),
}


@pytest.mark.parametrize("name", sorted(ZOO_EXPECT))
def test_bundled_zoo_graphs(name):
    from placetool.costmodel.presets import load_graph

    p = data_dir() / "graphs" / f"{name}.npz"
    if not p.exists():
        pytest.fail(f"{p} missing: run python -m placetool.costmodel.tf.zoo {name}")
    g = load_graph(name)
    expert, min_ops = ZOO_EXPECT[name]
    assert g.meta["expert"] == expert and g.meta["mode"] == "train"
    assert g.n_ops >= min_ops and g.meta["n_ops"] == g.n_ops
    assert (g.layer >= 0).all()
    assert g.flops.sum() > 1e10 and g.param_bytes.sum() > 1e6
    assert g.meta["n_opaque_ops"] == 0
    assert set(g.meta["unknown_shape_op_types"]) <= {"BroadcastGradientArgs"}
    assert any(t in g.op_types for t in ("AssignSubVariableOp", "ResourceApplyGradientDescent"))
    for ops in g.group_ops[:: max(1, g.n_groups // 500)]:  # one layer per group
        assert np.unique(g.layer[ops]).size == 1
    if expert == "layers":
        last = int(g.layer.max())
        assert last == g.meta["layers"] - 1
        checked = 0
        for i, n in enumerate(g.names):
            parts = n.removeprefix("gradient_tape/").split("/")
            # the model's own softmax / attention layers (not those inside a Transformer block)
            if len(parts) > 2 and parts[1].startswith(("softmax", "attention")):
                assert g.layer[i] == last, n
                checked += 1
        assert checked > 10
