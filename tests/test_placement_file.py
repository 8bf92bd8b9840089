"""Placement files: round trips, TF device names, and one-line errors for bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from placetool.costmodel import CostModel, PlacementError, presets
from placetool.costmodel.placement import Placement, tf_device_names
from placetool.costmodel.tf.testbed import ClusterSpec


@pytest.fixture(scope="module")
def cm():
    return CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))


def test_tf_device_names_local_and_from_a_spec():
    cl = presets.load_cluster("k80x4")
    assert tf_device_names(cl) == ["/device:CPU:0", "/device:GPU:0", "/device:GPU:1", "/device:GPU:2",
                                   "/device:GPU:3"]
    spec = ClusterSpec.for_workers([f"h{k}:1" for k in range(5)])
    assert tf_device_names(cl, spec)[3] == "/job:worker/replica:0/task:3/device:CPU:0"
    with pytest.raises(ValueError, match="has 5 devices but the cluster spec names 2"):
        tf_device_names(cl, ["/device:CPU:0", "/device:GPU:0"])


def test_round_trip_through_a_file(tmp_path, cm):
    from placetool.cli.simulate import parse_placement

    p = parse_placement("random:4", cm)
    step = cm.simulate(p).step_time_us
    pl = Placement.from_array(cm.graph, cm.cluster, p, step, extra={"method": "random", "seed": 4})
    pl.save(tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    assert (d["format"], d["version"], d["graph"], d["cluster"], d["method"]) == (
        "placetool.placement", 1, "synthetic-1k", "k80x4", "random")
    op = cm.graph.names[7]
    assert d["tf_devices"][op] == tf_device_names(cm.cluster)[p[7]]
    back = Placement.load(tmp_path / "p.json")
    assert back == pl
    assert np.array_equal(back.to_array(cm.graph, cm.cluster), p)
    # the CostModel loader reads the same file
    assert np.array_equal(cm.load_placement(tmp_path / "p.json"), p)
    assert cm.simulate(cm.load_placement(tmp_path / "p.json")).step_time_us == step


def test_placement_to_json_names_the_spec_devices(cm):
    spec = ClusterSpec.for_workers([f"h{k}:1" for k in range(5)])
    d = cm.placement_to_json(cm.single_device("cpu:0"), spec=spec)
    assert set(d["tf_devices"].values()) == {"/job:worker/replica:0/task:0/device:CPU:0"}
    assert d["step_time_us"] is None


def test_infeasible_step_time_is_written_as_null(tmp_path, cm):
    pl = Placement.from_array(cm.graph, cm.cluster, cm.single_device(0), float("inf"))
    pl.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["step_time_us"] is None


def _doc(cm, **change):
    d = cm.placement_to_json(cm.single_device("cpu:0"), 1.0)
    d.update(change)
    return {k: v for k, v in d.items() if v is not ...}


@pytest.mark.parametrize("change,msg", [
    ({"format": "placetool.graph"}, "format: 'placetool.graph' is not a placetool placement"),
    ({"version": 2}, "version: 2 is not supported"),
    ({"devices": ...}, "missing 'devices'"),
    ({"devices": ["cpu:0"]}, "devices: expected a table of op name -> device, got list"),
    ({"step_time_us": "fast"}, "step_time_us: expected a number or null"),
    ({"graph": 3}, "graph: expected a string"),
    ({"tf_devices": {"nope": "/device:CPU:0"}}, "devices: no device for op 'nope' (tf_devices names it"),
])
def test_malformed_files_are_one_line_errors(tmp_path, cm, change, msg):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_doc(cm, **change)))
    with pytest.raises(PlacementError) as e:
        cm.load_placement(f)
    assert str(e.value).startswith(str(f)) and msg in str(e.value) and "\n" not in str(e.value)


def test_files_that_do_not_fit_the_graph(tmp_path, cm):
    f = tmp_path / "p.json"
    d = _doc(cm)
    op = cm.graph.names[3]
    for devices, msg in [
        ({**d["devices"], op: 1.0}, f"devices[{op!r}]: device must be a device name or index, got 1.0"),
        ({**d["devices"], op: 9}, f"devices[{op!r}]: unknown device 9"),
        ({**d["devices"], op: "tpu:0"}, f"devices[{op!r}]: unknown device 'tpu:0'"),
        ({k: v for k, v in d["devices"].items() if k != op}, f"names no device for op {op!r}"),
        ({**d["devices"], "extra/op": "cpu:0"}, "names op 'extra/op', which graph 'synthetic-1k' lacks"),
    ]:
        f.write_text(json.dumps({**d, "devices": devices, "tf_devices": {}}))
        with pytest.raises(PlacementError, match="^" + str(f)) as e:
            cm.load_placement(f)
        assert msg in str(e.value)


def test_legacy_file_without_format_still_loads(tmp_path, cm):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"devices": {op: "cpu:0" for op in cm.graph.names}}))
    assert (cm.load_placement(f) == 0).all()


@pytest.mark.parametrize("text,shown", [
    ("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e400", "1e400"),
    ("1" + "0" * 5000, "100000000000... (5001 characters)"), ("9223372036854775808", "9223372036854775808"),
])
def test_one_rule_for_every_number_in_a_placement_file(tmp_path, cm, text, shown):
    f = tmp_path / "p.json"
    d = _doc(cm)
    op = cm.graph.names[0]
    rule = "numbers in a placement file must be finite, and integers within int64"
    for field, doc in [("step_time_us", json.dumps({**d, "step_time_us": 0.5}).replace("0.5", text)),
                       (f"devices[{op!r}]", json.dumps({**d, "tf_devices": {}, "devices": {**d["devices"], op: 7}})
                        .replace(": 7", ": " + text)),
                       ("meta['seed']", json.dumps({**d, "meta": {"seed": 7}}).replace(": 7", ": " + text))]:
        f.write_text(doc)
        with pytest.raises(PlacementError) as e:
            cm.load_placement(f)
        assert str(e.value) == f"{f}: {field}: {shown}: {rule}"
    # the largest int64 and ordinary numbers are fine
    f.write_text(json.dumps({**d, "step_time_us": 1e300, "meta": {"seed": 2 ** 63 - 1}}))
    assert Placement.load(f).step_time_us == 1e300
