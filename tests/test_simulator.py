"""The compiled simulator: hand-computed schedules, and the reference simulator as oracle."""

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from placetool.costmodel import Cluster, CostModel, OpGraph, presets, reference
from placetool.costmodel.incremental import IncrementalSimulator
from tests.helpers import assignments, cluster, cost_models, nxgraph


def model(nodes, edges, times, **cl):
    g = OpGraph.from_networkx(nxgraph(nodes, edges))
    c = cluster(**cl)
    return CostModel(g, c, op_times=np.asarray(times, float))


def run(cm, placement, trace=True):
    """The compiled simulation of ``placement``, checked against the reference and the
    incremental simulator (as a base run and as a move from another base)."""
    r = cm.simulate(np.asarray(placement), trace=trace)
    if r.reason is None or "memory" in r.reason:
        p = np.asarray(placement, np.int32)
        same_as_reference(cm, p, r)
        same_incrementally(cm, p, r)
    return r


def same_incrementally(cm, p, r):
    g = cm.graph
    a = p[[ops[0] for ops in g.group_ops]].astype(np.int32)
    other = np.argmax(cm.group_device_ok, axis=1).astype(np.int32)  # every group on its first allowed device
    for base, checkpoints in ((a, 64), (other, 1), (other, 64)):
        inc = IncrementalSimulator(cm, base, checkpoints=checkpoints)
        m = inc.evaluate(a)
        assert m.step_time_us == r.step_time_us
        assert np.array_equal(m.peak_memory_bytes, r.peak_memory_bytes) and m.feasible == r.feasible


def same_as_reference(cm, p, r):
    ref = reference.simulate(cm.graph, cm.T, p, cm.cluster)
    assert r.step_time_us == ref.step_time_us
    assert np.array_equal(r.busy_us, ref.busy_us)
    assert np.array_equal(r.peak_memory_bytes, ref.peak_memory_bytes)
    assert r.feasible == bool(np.all(ref.peak_memory_bytes <= cm.capacity))
    if r.trace is not None:
        assert np.array_equal(r.trace.op_start, ref.op_start)
        assert np.array_equal(r.trace.op_end, ref.op_end)
        got = list(zip(r.trace.x_tensor, r.trace.x_src, r.trace.x_dst, r.trace.x_start, r.trace.x_end))
        assert got == ref.transfers
        kinds = {"send": reference.SEND, "recv": reference.RECV}
        assert [(kinds[k], x, d, a, b) for k, x, d, a, b in r.trace.tasks()] == ref.tasks
    return ref


# ---------------------------------------------------------------- hand-computed
@pytest.mark.parametrize("queue, want", [("fifo", 37.0), ("none", 22.0)])
def test_two_transfers_on_one_link_queue_only_on_a_fifo_link(queue, want):
    """a (d0, 1 µs) sends 100 bytes to b and 50 to c (both d1, 1 µs each); links: 10 µs
    + bytes / 10 per µs. fifo: x0 runs 1-21, then x1 21-36; b 21-22, c 36-37: 37 µs.
    none: x0 runs 1-21 and x1 1-16 side by side; c 16-17, b 21-22: 22 µs."""
    cm = model({"a": 0, "b": 0, "c": 0},
               [("a", "b", {"output": 0, "bytes": 100}), ("a", "c", {"output": 1, "bytes": 50})],
               [[1, 1], [1, 1], [1, 1]], latency=10.0, bandwidth=10.0, link_queue=queue)
    r = run(cm, [0, 1, 1])
    assert r.step_time_us == want
    spans = sorted(zip(r.trace.x_start, r.trace.x_end))
    assert spans == ([(1.0, 21.0), (21.0, 36.0)] if queue == "fifo" else [(1.0, 16.0), (1.0, 21.0)])
    # a received copy is held from its transfer's start to its consumer's end: both at
    # once from 1 to 16 without a queue, from 21 to 22 (b still running) with one
    assert r.peak_memory_bytes[1] == 150


def test_link_queue_round_trips_and_is_checked(tmp_path):
    c = cluster(link_queue="none")
    assert c.link_queue == "none" and Cluster.from_dict(c.to_dict()).link_queue == "none"
    assert "queue" not in cluster().to_dict()["links"]  # the default is not written
    c.save(tmp_path / "c.toml")
    assert Cluster.load(tmp_path / "c.toml").link_queue == "none"
    with pytest.raises(Exception, match="links.queue must be one of 'fifo', 'none', got 'lifo'"):
        cluster(link_queue="lifo")


def test_link_send_round_trips_and_is_checked(tmp_path):
    c = cluster(link_send="idle")
    assert Cluster.from_dict(c.to_dict()).link_send == "idle"
    assert "send" not in cluster().to_dict()["links"]
    c.save(tmp_path / "c.toml")
    assert Cluster.load(tmp_path / "c.toml").link_send == "idle"
    with pytest.raises(Exception, match="links.send must be one of 'eager', 'idle', 'aside', 'workers', got 'late'"):
        cluster(link_send="late")


@pytest.mark.parametrize("send_us, send, want_b, want_task", [
    (0.0, "eager", 21.0, None), (0.0, "idle", 31.0, (20.0, 20.0)),
    (3.0, "eager", 24.0, (10.0, 13.0)), (3.0, "idle", 34.0, (20.0, 23.0))])
def test_an_idle_send_waits_until_the_sender_has_no_ready_op(send_us, send, want_b, want_task):
    """a (d0, 0..10) feeds b on d1 (100 bytes: link 1 + 100/10 = 11 µs) and the chain
    c (5 µs) -> e (5 µs) on d0. eager: the tensor leaves at 10 (after a send task of
    send_us, which goes before c: producer rank first), b starts at 21 (24 with the 3 µs
    task). idle: d0 runs c 10..15 and e 15..20 first, then the send task (of 0 or 3 µs),
    so the link runs 20..31 (23..34) and b starts there."""
    cm = model({"a": 100, "b": 1, "c": 1, "e": 1}, [("a", "b"), ("a", "c"), ("c", "e")],
               [[10, 10], [1, 1], [5, 5], [5, 5]], latency=1.0, bandwidth=10.0, link_send=send, send_us=send_us)
    r = run(cm, [0, 1, 0, 0])
    assert r.trace.op_start[1] == want_b and r.step_time_us == want_b + 1
    assert r.trace.tasks() == ([] if want_task is None else [("send", 0, 0, *want_task)])
    idle_first = send == "idle" or send_us == 0
    assert list(r.trace.op_start[2:]) == ([10.0, 15.0] if idle_first else [13.0, 18.0])


@pytest.mark.parametrize("send_us, send, want", [
    (3.0, "eager", dict(c=10.0, task=(15.0, 18.0), link=(18.0, 29.0), b=29.0)),
    (3.0, "idle", dict(c=10.0, task=(15.0, 18.0), link=(18.0, 29.0), b=29.0)),
    (3.0, "aside", dict(c=13.0, task=(10.0, 13.0), link=(10.0, 21.0), b=21.0)),
    (0.0, "aside", dict(c=10.0, task=None, link=(10.0, 21.0), b=21.0))])
def test_an_aside_send_runs_first_and_beside_the_wire(send_us, send, want):
    """a (d0, 0..10) feeds b on d1 (100 bytes: 1 + 100/10 = 11 µs on the link); c on d0
    was ready since 0. eager and idle: c (ready first) runs 10..15, then the send task,
    then the link; b starts at 29. aside: the link runs from 10, and the send task goes
    before c (10..13), so b starts at 21 and c at 13; with no send cost, no task and c at
    10. d0's busy time counts the send task either way."""
    cm = model({"a": 100, "b": 1, "c": 1}, [("a", "b")], [[10, 10], [1, 1], [5, 5]],
               latency=1.0, bandwidth=10.0, link_send=send, send_us=send_us)
    r = run(cm, [0, 1, 0])
    assert r.trace.op_start[2] == want["c"] and r.trace.op_start[1] == want["b"]
    assert (r.trace.x_start[0], r.trace.x_end[0]) == want["link"]
    assert r.trace.tasks() == ([] if want["task"] is None else [("send", 0, 0, *want["task"])])
    assert r.step_time_us == max(want["b"] + 1, want["c"] + 5)
    assert r.busy_us[0] == 15.0 + (send_us if want["task"] else 0.0)
    if send_us == 0.0:  # all-zero costs: today's eager schedule
        eager = run(model({"a": 100, "b": 1, "c": 1}, [("a", "b")], [[10, 10], [1, 1], [5, 5]],
                          latency=1.0, bandwidth=10.0), [0, 1, 0])
        assert list(eager.trace.op_start) == list(r.trace.op_start)


def test_chain_on_one_device_is_the_sum_of_its_ops():
    cm = model({"a": 4, "b": 4, "c": 4}, [("a", "b"), ("b", "c")], [[1, 1], [2, 2], [3, 3]])
    r = run(cm, [1, 1, 1])
    assert r.step_time_us == 6.0
    assert list(r.trace.op_start) == [0, 1, 3]
    assert list(r.busy_us) == [0, 6]
    assert r.trace.n_transfers == 0


def test_diamond_across_devices():
    # a, b, d on d0; c on d1; 100-byte tensors over a 1 µs + 10 B/µs link take 11 µs.
    cm = model({v: 100 for v in "abcd"}, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], [[10, 10]] * 4)
    r = run(cm, [0, 0, 1, 0])
    s, e = r.trace.op_start, r.trace.op_end
    assert list(s) == [0, 10, 21, 42] and list(e) == [10, 20, 31, 52]
    assert r.step_time_us == 52
    xs = sorted(zip(r.trace.x_start, r.trace.x_end))
    assert xs == [(10, 21), (31, 42)]


def test_fan_out_to_two_consumers_on_another_device_is_sent_once():
    cm = model({"a": 100, "b": 1, "c": 1}, [("a", "b"), ("a", "c")], [[10, 10]] * 3)
    r = run(cm, [0, 1, 1])
    assert r.trace.n_transfers == 1
    assert (r.trace.x_start[0], r.trace.x_end[0]) == (10, 21)
    # b and c both ready at 21; b first (topological rank), then c.
    assert list(r.trace.op_start[1:]) == [21, 31]
    assert r.step_time_us == 41


def test_two_transfers_on_one_link_are_serialised():
    # a has two outputs, each read on d1: the second transfer waits for the first.
    nodes = {"a": 200, "b": 1, "c": 1}
    edges = [("a", "b", {"bytes": 100, "output": 0}), ("a", "c", {"bytes": 100, "output": 1})]
    cm = model(nodes, edges, [[10, 10]] * 3)
    r = run(cm, [0, 1, 1])
    assert sorted(zip(r.trace.x_start, r.trace.x_end)) == [(10, 21), (21, 32)]
    assert list(r.trace.op_start[1:]) == [21, 32]
    assert r.step_time_us == 42


def test_transfers_on_different_links_overlap():
    nodes = {"a": 200, "b": 1, "c": 1}
    edges = [("a", "b", {"bytes": 100, "output": 0}), ("a", "c", {"bytes": 100, "output": 1})]
    cm = model(nodes, edges, [[10, 10, 10]] * 3, n_devices=3)
    r = run(cm, [0, 1, 2])
    assert sorted(zip(r.trace.x_start, r.trace.x_end)) == [(10, 21), (10, 21)]
    assert r.step_time_us == 31


def test_memory_peak_and_out_of_memory():
    # On one device: params 50; a's output (100) lives until b ends; b's (200) until c ends.
    nodes = {"a": {"out_bytes": 100, "param_bytes": 50}, "b": 200, "c": 300}
    edges = [("a", "b"), ("b", "c")]
    cm = model(nodes, edges, [[1, 1]] * 3)
    r = run(cm, [1, 1, 1])
    # a: 50+100=150; b starts: 350; b ends, a's output freed: 250; c starts: 550.
    assert r.peak_memory_bytes[1] == 550 and r.feasible
    tight = model(nodes, edges, [[1, 1]] * 3, memory=500)
    r = run(tight, [1, 1, 1])
    assert not r.feasible
    assert "out of memory on d1" in r.reason and "by 50" in r.reason
    assert r.step_time_us == 3.0  # the schedule is still reported


def test_received_copy_is_held_on_the_destination_until_its_consumers_finish():
    nodes = {"a": 100, "b": 10, "c": 10}
    cm = model(nodes, [("a", "b"), ("b", "c")], [[10, 10]] * 3)
    r = run(cm, [0, 1, 1])
    # d1: copy of a (100) from 10; b's output 10 from 21 -> 110; b ends at 31 freeing the
    # copy; c adds 10 -> 20.
    assert r.peak_memory_bytes[1] == 110
    assert r.peak_memory_bytes[0] == 100  # a's output held until its transfer is done


def test_op_without_kernel_makes_the_placement_infeasible():
    nodes = {"in": {"out_bytes": 8, "kinds": ["cpu"], "op_type": "IteratorGetNext"}, "b": 8}
    cm = model(nodes, [("in", "b")], [[1, 1], [1, 1]])
    assert np.isinf(cm.T[0, 1])
    r = run(cm, [1, 1])
    assert not r.feasible and r.step_time_us == np.inf
    assert "'in'" in r.reason and "no kernel on d1" in r.reason
    assert run(cm, [0, 1]).feasible


def test_split_group_is_infeasible():
    nodes = {"v": {"out_bytes": 8, "group": "var"}, "r": {"out_bytes": 8, "group": "var"}}
    cm = model(nodes, [("v", "r")], [[1, 1]] * 2)
    r = run(cm, [0, 1])
    assert not r.feasible and "split" in r.reason
    b = cm.simulate_batch(np.array([[0, 1], [1, 1]]))
    assert list(b.feasible) == [False, True]


def test_control_edge_orders_without_a_transfer():
    nodes = {"a": 100, "b": 100}
    cm = model(nodes, [("a", "b", {"control": True})], [[5, 5]] * 2)
    r = run(cm, [0, 1])
    assert r.trace.n_transfers == 0
    assert r.trace.op_start[1] == 5 and r.step_time_us == 10


def test_ready_ops_start_by_ready_time_then_topological_rank():
    # r1 and r2 both depend on a; x is a source on the same device. At time 0 only a and
    # x are ready: a first (rank 0). At 1 x starts; r1, r2 wait for the device.
    nodes = {"a": 1, "x": 1, "r1": 1, "r2": 1}
    cm = model(nodes, [("a", "r1"), ("a", "r2")], [[1, 1], [5, 5], [1, 1], [1, 1]])
    r = run(cm, [0, 0, 0, 0])
    assert list(r.trace.op_start) == [0, 1, 6, 7]


# ------------------------------------------------- device-side transfer costs
def two_op_chain(nbytes=100, **costs):
    """a (10 µs) on d0 sends ``nbytes`` to b (10 µs) on d1 over a 1 µs + 10 B/µs link."""
    return model({"a": nbytes, "b": 1}, [("a", "b")], [[10, 10]] * 2, **costs)


def test_send_task_delays_the_senders_next_op_by_send_us():
    # a -> b (remote) and a -> c (local). At 10 the send task (producer rank 0) goes
    # before c: send 10..13, c 13..18; link 13..24; b 24..34.
    nodes = {"a": 100, "b": 1, "c": 1}
    cm = model(nodes, [("a", "b"), ("a", "c")], [[10, 10], [10, 10], [5, 5]], send_us=3.0)
    r = run(cm, [0, 1, 0])
    assert list(r.trace.op_start) == [0, 24, 13]
    assert list(r.trace.op_end) == [10, 34, 18]
    assert (r.trace.x_start[0], r.trace.x_end[0]) == (13, 24)
    assert r.trace.tasks() == [("send", 0, 0, 10.0, 13.0)]
    assert list(r.busy_us) == [18, 10] and r.step_time_us == 34
    free = run(model(nodes, [("a", "b"), ("a", "c")], [[10, 10], [10, 10], [5, 5]]), [0, 1, 0])
    assert list(free.trace.op_start) == [0, 21, 10] and free.trace.tasks() == []


def test_send_task_queues_behind_an_op_that_was_ready_earlier():
    # p is ready at 0 but waits for a; at 10 p (ready 0) goes before the send (ready 10):
    # p 10..12, send 12..15, link 15..26, b 26..36.
    cm = model({"a": 100, "p": 1, "b": 1}, [("a", "b")], [[10, 10], [2, 2], [10, 10]], send_us=3.0)
    r = run(cm, [0, 0, 1])
    assert list(r.trace.op_start) == [0, 10, 26]
    assert r.trace.tasks() == [("send", 0, 0, 12.0, 15.0)]
    assert r.step_time_us == 36


def test_receive_task_delays_the_receivers_next_op_by_recv_us():
    # a 0..10 on d0, link 10..21. On d1: v 0..21, then w (ready 21) and the receive task
    # (ready 21, producer a has rank 0) compete: receive 21..25, w 25..30, b 30..35.
    nodes = {"a": 100, "b": 1, "v": 1, "w": 1}
    cm = model(nodes, [("a", "b"), ("v", "w")], [[10, 10], [5, 5], [21, 21], [5, 5]], recv_us=4.0)
    r = run(cm, [0, 1, 1, 1])
    assert list(r.trace.op_start) == [0, 30, 0, 25]
    assert r.trace.tasks() == [("recv", 0, 1, 21.0, 25.0)]
    assert list(r.busy_us) == [10, 35] and r.step_time_us == 35


def test_per_byte_send_and_receive_costs():
    # 128 bytes; link 1 + 128/16 = 9 µs. Send on d0: 1 + 128/16 = 9 µs; receive on d1:
    # 2 + 128/32 = 6 µs. a 0..10, send 10..19, link 19..28, receive 28..34, b 34..44.
    cm = model({"a": 128, "b": 1}, [("a", "b")], [[10, 10]] * 2, bandwidth=16.0,
               send_us=[1.0, 50.0], send_us_per_byte=[1 / 16, 1.0], recv_us=[50.0, 2.0], recv_us_per_byte=[1.0, 1 / 32])
    r = run(cm, [0, 1])
    assert r.trace.tasks() == [("send", 0, 0, 10.0, 19.0), ("recv", 0, 1, 28.0, 34.0)]
    assert (r.trace.x_start[0], r.trace.x_end[0]) == (19, 28)
    assert list(r.trace.op_start) == [0, 34] and r.step_time_us == 44
    assert list(r.busy_us) == [19, 16]
    # a's output (128) is held on d0 until its link transfer ends; the copy on d1 from
    # the link's start (19) until b ends, with b's own output (1) on top
    assert list(r.peak_memory_bytes) == [128, 129]


def test_a_zero_byte_transfer_with_only_per_byte_costs_skips_both_tasks():
    cm = model({"a": 0, "b": 1}, [("a", "b")], [[10, 10]] * 2, send_us_per_byte=1.0, recv_us_per_byte=1.0)
    r = run(cm, [0, 1])
    assert r.trace.tasks() == [] and r.step_time_us == 10 + 1 + 10


def test_zero_transfer_costs_give_the_schedule_without_them():
    g = presets.load_graph("synthetic-1k")
    base = presets.load_cluster("k80x4")
    d = base.to_dict()
    for dev in d["devices"]:
        dev.update(send_us=0.0, send_us_per_byte=0.0, recv_us=0.0, recv_us_per_byte=0.0)
    zero = Cluster.from_dict(d)
    for dev in d["devices"]:
        dev.update(send_us=2.0, recv_us=1.0)
    costly = Cluster.from_dict(d)
    from placetool.search import Problem

    cm_base, cm_zero, cm_costly = (CostModel(g, c) for c in (base, zero, costly))
    rng = np.random.default_rng(5)
    for _ in range(3):
        p = g.to_placement(Problem(cm_base).random_assignment(rng))
        a, b, c = (cm.simulate(p, trace=True) for cm in (cm_base, cm_zero, cm_costly))
        assert a.step_time_us == b.step_time_us and np.array_equal(a.trace.op_start, b.trace.op_start)
        assert np.array_equal(a.busy_us, b.busy_us) and b.trace.tasks() == []
        assert np.array_equal(a.trace.x_end, b.trace.x_end)
        assert c.step_time_us > a.step_time_us and len(c.trace.tasks()) == 2 * c.trace.n_transfers


# ------------------------------------------------------------- oracle (hypothesis)
@st.composite
def problems(draw):
    cm = draw(cost_models())
    return cm, cm.graph.to_placement(np.array(draw(assignments(cm)), np.int32))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_compiled_equals_reference(args):
    cm, p = args
    r = cm.simulate(p, trace=True)
    same_as_reference(cm, p, r)
    same_incrementally(cm, p, r)
    # the batch kernel gives the same numbers
    b = cm.simulate_batch(np.stack([p, p]))
    assert list(b.step_time_us) == [r.step_time_us] * 2
    assert np.array_equal(b.peak_memory_bytes[1], r.peak_memory_bytes)
    assert np.array_equal(b.busy_us[0], r.busy_us)


@pytest.mark.parametrize("name", ["synthetic-1k"])
def test_compiled_equals_reference_on_a_synthetic_graph(name):
    g = presets.load_graph(name)
    cm = CostModel(g, presets.load_cluster("k80x4"))
    rng = np.random.default_rng(1)
    for _ in range(3):
        from placetool.search import Problem

        p = g.to_placement(Problem(cm).random_assignment(rng))
        r = cm.simulate(p)
        ref = reference.simulate(g, cm.T, p, cm.cluster)
        assert r.step_time_us == ref.step_time_us
        assert np.array_equal(r.peak_memory_bytes, ref.peak_memory_bytes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=6))
def test_a_reused_workspace_gives_the_reference_run_after_run(args, seeds):
    """One workspace serves every call of a cost model: what an earlier run left in it
    (its transfers, their copy table, the last transfer per device) never leaks into
    the next, traced or not."""
    cm, p = args
    from placetool.search import Problem

    pr = Problem(cm)
    placements = [p] + [cm.graph.to_placement(pr.random_assignment(np.random.default_rng(s))) for s in seeds]
    for i, q in enumerate(placements):
        same_as_reference(cm, q, cm.simulate(q, trace=i % 2 == 1))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.booleans()), min_size=1, max_size=40))
def test_the_event_queue_hands_events_out_by_time_then_key(ops):
    """Pushes (time, key) and pops in any interleaving: each pop is the least pending
    event, ties in time broken by the key, as a sorted list of the pending ones says."""
    from placetool.costmodel.kernels import evq_push

    b, k, ids = (np.zeros(len(ops) + 1, np.int64) for _ in range(3))
    n, pending = 0, []
    for i, (t, key, pop) in enumerate(ops):
        if pop and n:
            n -= 1
            least = min(pending)
            pending.remove(least)
            assert (b[n], k[n], ids[n]) == least
        elif (t, key) not in {(e[0], e[1]) for e in pending}:  # keys are unique per time in the loop
            n = evq_push(b, k, ids, n, np.int64(t), np.int64(key), np.int64(i))
            pending.append((t, key, i))
    assert sorted(zip(b[:n], k[:n], ids[:n]), reverse=True) == list(zip(b[:n], k[:n], ids[:n]))


def drive_sorted_queue(items, steps, push, entry, room_free, tidy=lambda base, size: None):
    """Queue ``items`` as the loop queues them (each once, the epoch never going back)
    and pop as it pops them (the slice's start moves on), by ``steps`` of (pop?, next
    epoch?): each pop must be the least pending entry, the slice sorted, and the room
    of one entry per item never outgrown (``room_free()``: the entry past it untouched).
    ``push(base, size, epoch, item)`` returns the entry it queued; ``entry(j)`` reads
    position j; ``tidy(base, size)`` runs before each pop and check, as the loop sorts
    a slice a push left unsorted before reading it."""
    base, size, epoch, pending, todo = 0, 0, 0, [], list(items)
    for pop, next_epoch in steps:
        epoch += next_epoch
        tidy(base, size)
        if pop and size:
            least = min(pending)
            pending.remove(least)
            assert entry(base) == least
            base, size = base + 1, size - 1
        elif todo:
            pending.append(push(base, size, epoch, todo.pop()))
            size += 1
        assert base + size <= len(items) and room_free()
        tidy(base, size)
        assert [entry(j) for j in range(base, base + size)] == sorted(pending)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=300), st.integers(0, 3))
@example(list(range(70, 0, -1)), 2)  # three merge passes: the result lands in the scratch buffer
def test_readyq_sort_sorts_the_slice_and_nothing_else(keys, base):
    from placetool.costmodel.kernels import readyq_sort

    rq = np.array([-5] * base + keys + [-7], np.int64)
    readyq_sort(rq, base, len(keys))
    assert rq.tolist() == [-5] * base + sorted(keys) + [-7]


@settings(max_examples=100, deadline=None)
@given(st.permutations(range(24)),
       st.lists(st.tuples(st.sampled_from([False] * 3 + [True]), st.sampled_from([False] * 4 + [True])),
                min_size=1, max_size=60))
@example(list(range(24)), [(False, False)] * 24 + [(True, False)] * 24)  # 24 keys of one instant, falling
def test_a_ready_queue_hands_ops_out_by_epoch_then_rank(ranks, steps):
    """A device's ready queue (``readyq_push``; ``readyq_sort`` when a push passed more
    than ``READY_SCAN`` keys and left it unsorted; the loop's pop) hands ops out by
    (epoch, rank) and stays within one entry per op."""
    from placetool.costmodel.kernels import readyq_push, readyq_sort

    rq = np.full(len(ranks) + 1, -1, np.int64)  # the last entry stands for the next device's slice
    unsorted = [False]

    def push(base, size, epoch, rank):
        if not readyq_push(rq, base, size, np.int64((epoch << 32) | rank)):
            unsorted[0] = True
        return (epoch << 32) | rank

    def tidy(base, size):
        if unsorted[0]:
            readyq_sort(rq, base, size)
            unsorted[0] = False

    drive_sorted_queue(ranks, steps, push, lambda j: rq[j], lambda: rq[-1] == -1, tidy)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_wide_fan_out_listed_in_falling_rank_runs_as_the_reference(devices):
    """One op feeding 60 consumers whose edges are listed in falling rank: at its end the
    ready queues take many keys in falling order (pushes past READY_SCAN leave them
    unsorted, to be sorted before the next pop), and the run is still the reference's,
    op by op; the incremental simulator agrees with it too."""
    n = 60
    g = OpGraph.from_arrays("fan", [f"op{i}" for i in range(n + 1)], ["MatMul"] * (n + 1), np.full(n + 1, 64),
                            np.zeros(n, np.int32), np.arange(n, 0, -1), flops=np.arange(1, n + 2) * 1e5)
    cm = CostModel(g, presets.load_cluster("k80x2"))
    p = np.ones(n + 1, np.int32)
    p[1::2] = devices  # devices 1 (and 2)
    same_as_reference(cm, p, cm.simulate(p, trace=True))
    inc = IncrementalSimulator(cm, p)
    q = p.copy()
    q[5] = 3 - p[5] if devices == 2 else 2
    r, full = inc.evaluate_move(5, int(q[5])), cm.simulate(q)
    assert r.step_time_us == full.step_time_us
    assert np.array_equal(r.peak_memory_bytes, full.peak_memory_bytes)


@settings(max_examples=100, deadline=None)
@given(st.permutations([(r, k) for r in range(3) for k in range(4)]),
       st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40))
def test_a_task_queue_hands_tasks_out_by_epoch_producer_then_tensor(tasks, steps):
    """As the ready queue, with the loop's two keys per task: (epoch << 32 | producer
    rank) first, then (tensor, destination, kind); the task's id travels with them."""
    from placetool.costmodel.kernels import taskq_push

    k1, k2, ids = (np.full(len(tasks) + 1, -1, np.int64) for _ in range(3))

    def push(base, size, epoch, task):
        a, b = (epoch << 32) | task[0], task[1]
        taskq_push(k1, k2, ids, base, size, np.int64(a), np.int64(b), np.int64(7 * a + b))
        return a, b, 7 * a + b

    drive_sorted_queue(tasks, steps, push, lambda j: (k1[j], k2[j], ids[j]), lambda: k1[-1] == -1)



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_trace_chains_each_devices_ops_in_the_order_they_ran(args):
    """``op_prev`` links each op to the one its device ran before it: one chain per
    device, through all of its ops, each ending before the next starts."""
    cm, p = args
    r = cm.simulate(p, trace=True)
    if r.trace is None:
        return
    tr = r.trace
    prev = tr.op_prev
    has = prev >= 0
    assert np.all(tr.placement[prev[has]] == tr.placement[has])
    assert np.all(tr.op_end[prev[has]] <= tr.op_start[has])
    assert len(set(prev[has].tolist())) == int(has.sum())  # no op is followed twice
    for d in np.unique(tr.placement):  # one first op per device, the earliest to start
        first = np.flatnonzero((tr.placement == d) & ~has)
        assert len(first) == 1 and tr.op_start[first[0]] == tr.op_start[tr.placement == d].min()


def test_the_trace_order_is_the_start_order_where_starts_differ():
    g = presets.load_graph("synthetic-1k")
    cm = CostModel(g, presets.load_cluster("k80x4"))
    from placetool.search import Problem

    a = Problem(cm).random_assignment(np.random.default_rng(0))
    tr = cm.simulate(a, trace=True).trace
    o = np.lexsort((tr.op_end, tr.op_start, tr.placement))
    prev = np.full(g.n_ops, -1)
    same = tr.placement[o[1:]] == tr.placement[o[:-1]]
    prev[o[1:][same]] = o[:-1][same]
    assert np.array_equal(tr.op_prev, prev)

def test_batch_matches_single_and_handles_group_assignments():
    g = presets.load_graph("synthetic-1k")
    cm = CostModel(g, presets.load_cluster("k80x2"))
    from placetool.search import Problem

    pr = Problem(cm)
    rng = np.random.default_rng(0)
    A = np.stack([pr.random_assignment(rng) for _ in range(8)])
    b = cm.simulate_batch(A)
    for i in range(8):
        r = cm.simulate(A[i])
        assert b.step_time_us[i] == r.step_time_us and b.feasible[i] == r.feasible


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 5])
def test_batch_rows_shared_between_threads_match_one_by_one(threads, rows, monkeypatch):
    # rows t, t + k, ... go to thread t of k: an odd batch leaves the threads unequal shares
    from placetool.costmodel import simulate
    from placetool.search import Problem

    monkeypatch.setattr(simulate, "MIN_OPS_PER_THREAD", 1)  # a thread for every row of this small graph
    cm = CostModel(presets.load_graph("synthetic-300"), presets.load_cluster("k80x2"))
    rng = np.random.default_rng(rows)
    A = np.stack([Problem(cm).random_assignment(rng) for _ in range(rows)])
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        b = cm.simulate_batch(A)
    finally:
        numba.set_num_threads(before)
    for i in range(rows):
        r = cm.simulate(A[i])
        assert b.step_time_us[i] == r.step_time_us
        assert np.array_equal(b.busy_us[i], r.busy_us) and np.array_equal(b.peak_memory_bytes[i], r.peak_memory_bytes)


def test_the_shared_thread_pool_is_made_once_for_up_to_a_thread_per_core():
    # asking for more threads later (numba.set_num_threads) keeps the same executor, whose
    # threads would otherwise idle on beside a new one's
    import os

    from placetool.costmodel.procs import thread_pool

    pool = thread_pool(1)
    assert thread_pool(os.cpu_count()) is pool and thread_pool(1) is pool


def test_batches_from_several_threads_and_a_forked_child_give_the_same_answers(monkeypatch):
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    from placetool.costmodel import simulate
    from placetool.search import Problem

    monkeypatch.setattr(simulate, "MIN_OPS_PER_THREAD", 1)
    cm = CostModel(presets.load_graph("synthetic-300"), presets.load_cluster("k80x2"))
    rng = np.random.default_rng(0)
    A = np.stack([Problem(cm).random_assignment(rng) for _ in range(6)])
    want = cm.simulate_batch(A).step_time_us
    with ThreadPoolExecutor(3) as ex:  # each caller and each batch thread has its own workspace
        for got in ex.map(lambda _: cm.simulate_batch(A).step_time_us, range(12)):
            assert np.array_equal(got, want)
    # a forked child has none of the parent's batch threads: it makes its own (no hang)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_batch_steps, (cm, A)).get(timeout=120)
    assert np.array_equal(got, want)


def _batch_steps(cm, A):
    return cm.simulate_batch(A).step_time_us


def test_lower_bound_is_below_every_simulated_step():
    g = presets.load_graph("synthetic-1k")
    cm = CostModel(g, presets.load_cluster("k80x4"))
    from placetool.search import Problem

    pr = Problem(cm)
    rng = np.random.default_rng(0)
    steps = cm.simulate_batch(np.stack([pr.random_assignment(rng) for _ in range(32)])).step_time_us
    lb = cm.lower_bound_us()
    assert 0 < lb <= steps.min()


def test_lower_bound_of_a_chain_is_its_length():
    cm = model({"a": 4, "b": 4, "c": 4}, [("a", "b"), ("b", "c")], [[1, 2], [2, 1], [3, 3]])
    assert cm.lower_bound_us() == 1 + 1 + 3


def test_trace_exports_chrome_json_and_a_gantt_png(tmp_path):
    import json

    cm = model({v: 100 for v in "abcd"}, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], [[10, 10]] * 4)
    r = run(cm, [0, 0, 1, 0])
    ev = r.trace.to_chrome(cm.graph, cm.cluster)["traceEvents"]
    ops = [e for e in ev if e.get("ph") == "X" and e["cat"] != "transfer"]
    xfers = [e for e in ev if e.get("ph") == "X" and e["cat"] == "transfer"]
    assert {e["name"]: (e["ts"], e["dur"]) for e in ops}["c"] == (21.0, 10.0)
    assert len(xfers) == 2 and xfers[0]["args"]["bytes"] == 100
    json.dumps(ev)
    png = tmp_path / "g.png"
    r.trace.plot(cm.graph, cm.cluster, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_shows_send_and_receive_tasks_on_their_devices(tmp_path):
    cm = model({"a": 128, "b": 1}, [("a", "b")], [[10, 10]] * 2, bandwidth=16.0, send_us=[1.0, 0.0],
               send_us_per_byte=[1 / 16, 0.0], recv_us=[0.0, 2.0], recv_us_per_byte=[0.0, 1 / 32])
    r = run(cm, [0, 1])
    ev = [e for e in r.trace.to_chrome(cm.graph, cm.cluster)["traceEvents"] if e.get("ph") == "X"]
    # one trace process per device (pid = device + 1)
    tasks = {e["cat"]: (e["pid"], e["ts"], e["dur"]) for e in ev if e["cat"] in ("send", "recv")}
    assert tasks == {"send": (1, 10.0, 9.0), "recv": (2, 28.0, 6.0)}
    r.trace.plot(cm.graph, cm.cluster, tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 0


def test_a_cost_model_pickles_and_simulates_the_same_afterwards():
    import copy
    import pickle

    cm = model({v: 100 for v in "abcd"}, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], [[10, 10]] * 4,
               send_us=2.0)
    p = np.array([0, 0, 1, 0])
    want = cm.simulate(p).step_time_us
    for other in (pickle.loads(pickle.dumps(cm)), copy.deepcopy(cm)):
        assert other.simulate(p).step_time_us == want


def test_placement_forms_agree():
    cm = model({v: 100 for v in "abcd"}, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], [[10, 10]] * 4)
    as_array = cm.simulate(np.array([0, 0, 1, 0])).step_time_us
    as_dict = cm.simulate({"a": "d0", "b": 0, "c": "d1", "d": "d0"}).step_time_us
    assert as_array == as_dict == 52
    from placetool.costmodel import PlacementError

    with pytest.raises(PlacementError, match="op 'd'"):
        cm.simulate({"a": 0, "b": 0, "c": 1})
    with pytest.raises(PlacementError, match="3 entries"):
        cm.simulate(np.array([0, 0, 1]))
    with pytest.raises(PlacementError, match="device index 7"):
        cm.simulate(np.array([0, 0, 7, 0]))


@pytest.mark.parametrize("n,seed", [(12, 0), (16, 1), (24, 2)])
def test_the_simulated_run_is_the_one_schedule_the_rules_allow(n, seed):
    # tests/cp_schedule.py states DESIGN.md's rules (non-delay list scheduling by ready
    # time then rank, first-come-first-served links, one copy per tensor and device) as
    # CP-SAT constraints, sharing no code with the simulator or the reference; for each
    # random placement the least and the largest sum of op starts over every schedule
    # obeying them must both be the simulated run
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.cp_schedule import problem

    pytest.importorskip("ortools")
    out = subprocess.run([sys.executable, "-m", "tests.cp_schedule", str(n), str(seed), "4"], check=True,
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1]).stdout
    got = json.loads(out)
    cm = problem(n, seed).cost_model
    for row in got["rows"]:
        r = cm.simulate(np.array(row["placement"], np.int32), trace=True)
        starts = np.asarray(r.trace.op_start) * got["scale"]
        assert row["least"] == row["largest"], "the rules leave more than one schedule"
        assert np.array_equal(starts, row["least"])
