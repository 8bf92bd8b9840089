"""costmodel.tf.host_trace: a step's receives paired by hand, and a real profiled step on a
2-worker testbed."""

from __future__ import annotations

import numpy as np
import pytest

from placetool.costmodel.tf.host_trace import Event, HostTraceError, step_transfers


def _bounds(sid: int, start: float, end: float) -> list[Event]:
    return [Event("tf_Compute", start, 1.0, "RunGraph", "", {"id": sid}),
            Event("tf_Compute", end - 1.0, 1.0, "RunGraphDone", "", {"id": sid})]


def _run(sid, start, dur):
    """The executor's run of a step's ready ops, around the ops and _Sends it ran."""
    return Event("tf_Compute", start, dur, "ExecutorState::Process", "", {"id": sid})


def _recv(sid, name, start, dur, done):
    return [Event("tf_Compute", start, dur, "ExecutorState::ProcessAsync::Start", "",
                  {"name": name, "kernel_type": "_Recv", "step_id": sid}),
            Event("tf_GrpcWorkerEnvQueues", done, 2.0, "ExecutorState::ProcessAsync::Done", "",
                  {"name": name, "kernel_type": "_Recv", "step_id": sid})]


def test_a_receive_paired_with_its_send_by_hand():
    # step 7 runs 1000-1200 on both workers. Worker 0 asks for x (its _Recv x_S2) at 1010
    # for 20 µs, computes a MatMul 1040-1100, and the tensor's arrival is handled at 1060,
    # inside it. Worker 1's _Send x_S1 runs at 1030; y_S4 is asked for and never arrives.
    w0 = _bounds(7, 1000.0, 1200.0) + _recv(7, "x_S2", 1010.0, 20.0, 1060.0)
    w0 += [Event("tf_Compute", 1040.0, 60.0, "a:MatMul", "MatMul"), _run(7, 1035.0, 70.0)]
    w0 += [Event("tf_Compute", 1150.0, 3.0, "ExecutorState::ProcessAsync::Start", "",
                 {"name": "y_S4", "kernel_type": "_Recv", "step_id": 7})]
    w1 = _bounds(7, 1005.0, 1190.0) + [Event("tf_Compute", 1030.0, 1.0, "x_S1:_Send", "_Send"),
                                          _run(7, 1025.0, 10.0)]
    # an op outside any of the executor's runs of the step belongs to none
    w0 += [Event("tf_Compute", 1120.0, 5.0, "b:Add", "Add")]
    (s,) = step_transfers([w0, w1])
    assert s.step_id == 7 and s.end == pytest.approx(200.0)
    assert s.name == ["x_S2", "y_S4"] and s.receiver.tolist() == [0, 0]
    assert s.issue.tolist() == [10.0, 150.0] and s.issue_us.tolist() == [20.0, 3.0]
    assert s.send[0] == 30.0 and np.isnan(s.send[1])
    assert s.done[0] == 60.0 and np.isnan(s.done[1])
    assert s.done_in_op.tolist() == [True, False]
    assert s.ops[0].tolist() == [[40.0, 100.0]] and s.ops[1].shape == (0, 2)
    # a step one worker did not finish inside the trace is left out
    cut = [e for e in w1 if e.name != "RunGraphDone"]
    assert step_transfers([w0, cut]) == []


def test_a_worker_whose_clock_runs_ahead_is_shifted_back_by_the_least_causality_asks():
    from placetool.costmodel.tf.host_trace import clock_offsets

    # worker 1's stamps run 400 µs ahead. Its _Send x_S1 at 1430 (really 1030) reaches worker 0
    # at 1060; worker 0's _Send y_S3 at 1100 reaches worker 1 at 1600 (really 1200).
    w0 = _bounds(7, 1000.0, 1300.0) + _recv(7, "x_S2", 1010.0, 20.0, 1060.0)
    w0 += [Event("tf_Compute", 1100.0, 1.0, "y_S3:_Send", "_Send"), _run(7, 1095.0, 10.0)]
    w1 = _bounds(7, 1405.0, 1690.0) + _recv(7, "y_S4", 1420.0, 10.0, 1600.0)
    w1 += [Event("tf_Compute", 1430.0, 1.0, "x_S1:_Send", "_Send"), _run(7, 1425.0, 10.0)]
    # x bounds the shift from above (1060 - 1430), y from below (1100 - 1600): the least is -370
    assert clock_offsets([w0, w1]).tolist() == [0.0, -370.0]
    (s,) = step_transfers([w0, w1])
    # x_S2 (issued at 10) came from worker 1, y_S4 (issued at 1420 - 370 - 1000 = 50) from worker 0
    assert s.name == ["x_S2", "y_S4"] and s.sender.tolist() == [1, 0] and s.receiver.tolist() == [0, 1]
    assert s.issue.tolist() == [10.0, 50.0]
    assert (s.done >= s.send).all() and s.done[0] == s.send[0]
    # the same step stamped on one clock is left alone
    true = [Event(e.thread, e.start_us - 400.0, e.dur_us, e.name, e.kind, e.stats) for e in w1]
    assert clock_offsets([w0, true]).tolist() == [0.0, 0.0]


def test_a_testbed_without_profiler_servers_is_refused():
    from types import SimpleNamespace

    from placetool.costmodel.tf.host_trace import capture

    tb = SimpleNamespace(profiler_addresses=[], n_workers=2)
    with pytest.raises(HostTraceError, match="profiler=True"):
        capture(None, None, tb, "/nonexistent")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_profiled_split_step_on_a_testbed(tmp_path):
    from placetool.costmodel.tf.host_trace import capture
    from placetool.costmodel.tf.importer import trace
    from placetool.costmodel.tf.testbed import Testbed

    t = trace("mlp", batch=16)
    g = t.graph
    p = g.to_placement((np.arange(g.n_groups) % 2).astype(np.int32))
    with Testbed.start(2, timeout_s=120, profiler=True) as tb:
        workers = capture(t, p, tb, tmp_path, steps=3)
    steps = step_transfers(workers)
    assert steps, "no whole step in the trace"
    for s in steps:
        assert len(s.name) > 0 and set(s.receiver.tolist()) <= {0, 1}
        assert (s.issue_us > 0).all() and (s.issue >= 0).all()
        ok = np.isfinite(s.done)
        assert ok.all() and (s.done[ok] >= s.issue[ok]).all()
        paired = np.isfinite(s.send)
        assert paired.mean() > 0.5  # most receives find their _Send by name
        assert (s.done[paired] >= s.send[paired]).all()  # a tensor arrives after it was sent
