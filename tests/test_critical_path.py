"""Where a simulated critical path spends the step: ``path_breakdown`` and
``placetool simulate --critical-path``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from placetool.cli.main import main
from placetool.costmodel import CostModel, OpGraph
from placetool.search.critical import path_breakdown
from tests.helpers import cluster, nxgraph


def _split_chain():
    """a -> b -> c, 2 / 3 / 4 µs, 100-byte tensors; a and c on d1, b on d2; links of
    1 µs + 10 bytes/µs: a 0..2, transfer 2..13, b 13..16, transfer 16..27, c 27..31."""
    g = OpGraph.from_networkx(nxgraph({"a": 100, "b": 100, "c": 0}, [("a", "b"), ("b", "c")]))
    cm = CostModel(g, cluster(3, latency=1.0, bandwidth=10.0), op_times=np.array([[2.0] * 3, [3.0] * 3, [4.0] * 3]))
    return cm, np.array([1, 2, 1], np.int32)


def test_a_split_chain_spends_22_of_31_us_waiting_at_its_two_transfers():
    cm, p = _split_chain()
    b = path_breakdown(cm, p)
    assert b["step_time_us"] == 31.0 and b["path_ops"] == 3 and b["start_us"] == 0.0
    assert b["compute_us"] == 9.0 and b["device_changes"] == 2 and b["transfer_wait_us"] == 22.0
    assert b["other_gap_us"] == 0.0
    assert b["compute_by_device_us"] == {"d1": 6.0, "d2": 3.0}
    assert [(w["from_op"], w["to_op"], w["from_device"], w["to_device"], w["bytes"], w["wait_us"], w["at_us"])
            for w in b["waits"]] == [("a", "b", "d1", "d2", 100, 11.0, 2.0), ("b", "c", "d2", "d1", 100, 11.0, 16.0)]
    assert len(path_breakdown(cm, p, top=1)["waits"]) == 1
    one = path_breakdown(cm, np.array([1, 1, 1], np.int32))
    assert (one["step_time_us"], one["compute_us"], one["device_changes"], one["waits"]) == (9.0, 9.0, 0, [])


def test_simulate_prints_the_breakdown_and_its_parts_add_up_to_the_step(capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "-g", "synthetic-1k", "-c", "k80x4", "--critical-path", "--json"])
    assert e.value.code == 0
    out = json.loads(capsys.readouterr().out)
    b = out["critical_path"]
    parts = b["start_us"] + b["compute_us"] + b["transfer_wait_us"] + b["other_gap_us"]
    assert parts == pytest.approx(out["step_time_us"]) and b["step_time_us"] == out["step_time_us"]
    assert b["device_changes"] > 0 and len(b["waits"]) == min(10, b["device_changes"])
    assert [w["wait_us"] for w in b["waits"]] == sorted((w["wait_us"] for w in b["waits"]), reverse=True)
    with pytest.raises(SystemExit):
        main(["simulate", "-g", "synthetic-1k", "-c", "k80x4", "--critical-path"])
    text = capsys.readouterr().out
    assert "critical path" in text and f"{b['device_changes']:,} device changes" in text
    assert "longest waits" in text and b["waits"][0]["to_op"] in text
