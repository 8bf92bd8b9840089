"""Host traces of a placed step: when each receiver asked for a tensor, when its sender's
``_Send`` ran, and when the tensor's arrival reached the receiver's executor.

A FULL_TRACE step (:mod:`.trace_capture`) holds the ops and one ``RecvTensor`` record per
tensor, whose start is the later of the receiver's call and the sender's response. The
receiver's own call, the CPU it spent making it, and the sender's ``_Send`` are not there.
TensorFlow's profiler has them. Each worker of a testbed started with ``profiler=True``
serves it, and at host tracer level 3 a worker's trace holds, per step:

- on the executor's thread (``tf_Compute``): every op, an ``ExecutorState::ProcessAsync::Start``
  per ``_Recv`` (the call issued; its length is the receiver's CPU for it) and an event per
  ``_Send`` (its ``key`` names the edge);
- on the gRPC worker queue's thread: an ``ExecutorState::ProcessAsync::Done`` per ``_Recv``
  (the tensor arrived and was handed to the executor).

The partitioner names a ``_Send`` and its ``_Recv`` ``X_S{n}`` and ``X_S{n+1}``; that pairs
them. :func:`capture` runs traced steps of a placement, :func:`read_xplane` turns one
worker's trace file into plain events and :func:`step_transfers` pairs them per step.

Times are µs, from the step's first ``RunGraph``. Each worker's profiler stamps its own
events, and in some traces two workers of one machine disagree by milliseconds (every
tensor of a step "arriving" about 3.5 ms before its ``_Send``; in others no pair is out of
order). :func:`clock_offsets` shifts each worker by the least that puts every paired tensor
after its ``_Send``; :func:`step_transfers` applies it.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..procs import fd_redirected

#: TensorFlow's profiler at this host tracer level records the executor's async starts and ends
HOST_TRACER_LEVEL = 3
_PAIRED = re.compile(r"^(.*)_S(\d+)$")
_NOT_OPS = ("ExecutorState", "Memory", "ThreadpoolListener", "RunGraph", "ExecutorDoneCallback")


class HostTraceError(UserError):
    """The profiler could not be reached or traced nothing usable."""


@dataclass
class Event:
    """One event of a worker's host trace."""

    thread: str          # the thread's name, without TensorFlow's numeric suffix
    start_us: float      # on the host's clock
    dur_us: float
    name: str            # "op:Type" for kernels, "ExecutorState::..." for the executor's own
    kind: str            # the op type ("_Send", "MatMul", ...), "" for the executor's own events
    stats: dict = field(default_factory=dict)


def read_xplane(path) -> list[Event]:
    """Every event of one worker's ``*.xplane.pb`` (its host plane), in file order."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    host = [p for p in space.planes if p.name.startswith("/host")]
    if not host:
        raise HostTraceError(f"{path}: no host plane in the profile")
    plane = host[0]
    md, sm = plane.event_metadata, plane.stat_metadata
    out = []
    for line in plane.lines:
        thread = line.name.split("/")[0]
        for e in line.events:
            stats = {}
            for s in e.stats:
                kind = s.WhichOneof("value")
                v = getattr(s, kind) if kind else None
                stats[sm[s.metadata_id].name] = sm[v].name if kind == "ref_value" else v
            out.append(Event(thread, (line.timestamp_ns * 1000 + e.offset_ps) / 1e6, e.duration_ps / 1e6,
                             md[e.metadata_id].name, md[e.metadata_id].display_name, stats))
    return out


@dataclass
class StepTransfers:
    """One step's ``_Recv``s on every worker (µs from the step's first event), in issue order."""

    step_id: int
    receiver: np.ndarray     # worker index
    sender: np.ndarray       # worker index of the paired _Send (-1: none)
    name: list[str]          # the _Recv node's name
    issue: np.ndarray        # the call issued: ProcessAsync::Start
    issue_us: np.ndarray     # the receiver's executor time spent issuing it
    send: np.ndarray         # the sender's _Send started (NaN: no pair found)
    done: np.ndarray         # the arrival handed to the receiver's executor (NaN: not in the trace)
    done_in_op: np.ndarray   # bool: the receiver's executor was inside an op then
    ops: list[np.ndarray]    # per worker: (start, end) of its ops, sorted by start
    end: float               # the step's last event


def _is_op(e: Event) -> bool:
    return e.thread == "tf_Compute" and bool(e.kind) and e.kind != "_Send" and not e.name.startswith(_NOT_OPS)


def clock_offsets(workers: list[list[Event]]) -> np.ndarray:
    """Per worker, µs to add to its times (worker 0: 0): the smallest shift, against worker
    0, under which every tensor passed between the two arrives after its ``_Send`` started.
    Where the pairs leave no such shift, 0."""
    raw = step_transfers(workers, offsets=np.zeros(len(workers)))
    out = np.zeros(len(workers))
    for w in range(1, len(workers)):
        # with worker w shifted by d: a tensor 0 -> w bounds d from below, one w -> 0 from above
        lo, hi = -np.inf, np.inf
        for s in raw:
            ok = np.isfinite(s.send) & np.isfinite(s.done)
            to_w = ok & (s.sender == 0) & (s.receiver == w)
            to_0 = ok & (s.sender == w) & (s.receiver == 0)
            if to_w.any():
                lo = max(lo, float((s.send[to_w] - s.done[to_w]).max()))
            if to_0.any():
                hi = min(hi, float((s.done[to_0] - s.send[to_0]).min()))
        if lo <= hi:
            out[w] = min(max(0.0, lo), hi)
    return out


def step_transfers(workers: list[list[Event]], offsets=None) -> list[StepTransfers]:
    """Pair each step's ``_Recv`` issues with their senders' ``_Send``s and their arrivals.

    Only steps every worker ran to the end inside the trace (``RunGraph`` ... ``RunGraphDone``)
    are kept. ``workers`` holds each worker's events (:func:`read_xplane`), in testbed order;
    ``offsets`` (µs per worker) are added to their times, :func:`clock_offsets` by default.
    """
    off = clock_offsets(workers) if offsets is None else np.asarray(offsets, float)
    bounds: dict[int, np.ndarray] = {}  # step id -> per worker (RunGraph start, RunGraphDone end)
    for w, evs in enumerate(workers):
        for e in evs:
            if e.name in ("RunGraph", "RunGraphDone") and "id" in e.stats:
                b = bounds.setdefault(int(e.stats["id"]), np.array([[np.inf, -np.inf]] * len(workers)))
                if e.name == "RunGraph":
                    b[w, 0] = min(b[w, 0], e.start_us + off[w])
                else:
                    b[w, 1] = max(b[w, 1], e.start_us + e.dur_us + off[w])
    whole = sorted((b[:, 0].min(), b[:, 1].max(), sid) for sid, b in bounds.items() if np.isfinite(b).all())
    tagged = [list(zip(_step_ids(evs), evs)) for evs in workers]
    return [_one_step(tagged, sid, t0, t1, off) for t0, t1, sid in whole]


def _step_ids(evs: list[Event]) -> list:
    """Each event's step id, None where it has none. The executor's async events carry it;
    an op or a ``_Send`` takes it from the ``ExecutorState::Process`` run around it on its
    thread. (By time alone they cannot be placed: a worker's _Send of one step can come
    after another worker has started the next.)"""
    runs = sorted((e.start_us, e.start_us + e.dur_us, int(e.stats["id"])) for e in evs
                  if e.thread == "tf_Compute" and e.name == "ExecutorState::Process" and "id" in e.stats)
    starts = np.array([r[0] for r in runs])
    out = []
    for e in evs:
        sid = e.stats.get("step_id")
        if sid is None and (e.kind == "_Send" and e.thread == "tf_Compute" or _is_op(e)) and len(runs):
            k = int(np.searchsorted(starts, e.start_us, side="right")) - 1
            if k >= 0 and runs[k][1] >= e.start_us:
                sid = runs[k][2]
        out.append(sid)
    return out


def _one_step(tagged, sid: int, t0: float, t1: float, off: np.ndarray) -> StepTransfers:
    issues, dones, sends = {}, {}, {}
    ops = []
    for w, evs in enumerate(tagged):
        mine = []
        for esid, e in evs:
            if esid != sid:
                continue
            t = e.start_us + off[w] - t0
            if e.name.endswith("ProcessAsync::Start") and e.stats.get("kernel_type") == "_Recv":
                issues[e.stats["name"]] = (w, t, e.dur_us)
            elif e.name.endswith("ProcessAsync::Done") and e.stats.get("kernel_type") == "_Recv":
                dones[e.stats["name"]] = t
            elif e.kind == "_Send":
                m = _PAIRED.match(e.name.split(":")[0])
                if m:
                    sends[f"{m.group(1)}_S{int(m.group(2)) + 1}"] = (w, t)
            elif _is_op(e):
                mine.append((t, t + e.dur_us))
        ops.append(np.array(sorted(mine), float).reshape(-1, 2))
    names = sorted(issues, key=lambda n: issues[n][1])
    rec = np.array([issues[n][0] for n in names], np.int64)
    done = np.array([dones.get(n, np.nan) for n in names])
    in_op = np.zeros(len(names), bool)
    for j, (w, t) in enumerate(zip(rec, done)):
        o = ops[w]
        k = np.searchsorted(o[:, 0], t, side="right") - 1 if len(o) and np.isfinite(t) else -1
        in_op[j] = k >= 0 and o[k, 1] > t
    return StepTransfers(
        step_id=sid, receiver=rec, sender=np.array([sends.get(n, (-1,))[0] for n in names], np.int64),
        name=names, issue=np.array([issues[n][1] for n in names]),
        issue_us=np.array([issues[n][2] for n in names]),
        send=np.array([sends.get(n, (-1, np.nan))[1] for n in names]), done=done, done_in_op=in_op,
        ops=ops, end=t1 - t0,
    )


def _wait_for(addresses, timeout_s: float) -> None:
    from .testbed import port_open

    deadline = time.monotonic() + timeout_s
    for a in addresses:
        while not port_open(a, 0.2):
            if time.monotonic() > deadline:
                raise HostTraceError(f"the profiler server at {a} does not answer after {timeout_s:g} s")
            time.sleep(0.1)


def capture(traced, placement, testbed, logdir, steps: int = 5, warmup: int = 3,
            timeout_s: float = 120.0) -> list[list[Event]]:
    """Run ``steps`` steps of ``placement`` on ``testbed`` (started with ``profiler=True``)
    while TensorFlow's profiler traces every worker; return each worker's events.

    The trace covers the steps with a second to spare on each side; :func:`step_transfers`
    keeps the steps it holds whole. Files are left under ``logdir``.
    """
    from .runner import PlacedStep
    from .session import import_tf

    if len(testbed.profiler_addresses) != testbed.n_workers:
        raise HostTraceError("the testbed serves no profiler: start it with Testbed.start(..., profiler=True)")
    _wait_for(testbed.profiler_addresses, 30.0)
    tf = import_tf()
    logdir = Path(logdir)
    before = set(logdir.glob("plugins/profile/*/*.xplane.pb"))
    with PlacedStep(traced, placement, testbed.spec, timeout_s) as st:
        step_us = statistics.median(st.step() for _ in range(max(1, warmup)))
        duration_ms = int(2000 + 1.5 * steps * step_us / 1e3)
        opts = tf.profiler.experimental.ProfilerOptions(host_tracer_level=HOST_TRACER_LEVEL,
                                                        python_tracer_level=0, device_tracer_level=0)
        failed = []

        def trace():
            try:
                tf.profiler.experimental.client.trace(
                    ",".join(f"grpc://{a}" for a in testbed.profiler_addresses), str(logdir), duration_ms,
                    options=opts)
            except Exception as e:  # reported below, in the caller's thread
                failed.append(e)

        with fd_redirected(1, to=2):  # the profiler client prints its progress on stdout
            th = threading.Thread(target=trace, daemon=True)
            th.start()
            time.sleep(1.0)
            for _ in range(steps):
                st.step()
            th.join(duration_ms / 1e3 + timeout_s)
    if failed:
        raise HostTraceError(f"the profiler traced nothing: {failed[0]}")
    files = sorted(set(logdir.glob("plugins/profile/*/*.xplane.pb")) - before)
    by_port = {f.name.split(".")[0].rsplit("_", 1)[-1]: f for f in files}
    missing = [a for a in testbed.profiler_addresses if a.rsplit(":", 1)[1] not in by_port]
    if missing:
        raise HostTraceError(f"no trace file from the profiler at {', '.join(missing)} under {logdir}")
    return [read_xplane(by_port[a.rsplit(":", 1)[1]]) for a in testbed.profiler_addresses]
