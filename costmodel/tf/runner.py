"""Run an imported graph with a placement for real, in a TF1 Session, and time it.

The traced step (:class:`placetool.costmodel.tf.importer.Traced`) is rewritten before it runs:

- each captured variable placeholder becomes a ``VarHandleOp`` of the same name (so its
  consumers are untouched) plus an ``AssignVariableOp`` initialiser fed the variable's
  value once; captured constants and the step's own input placeholders become ``Const``
  nodes, so a step moves no data from the client and measures the graph alone;
- every node gets the TF device of its op's placement; soft placement is off, and
  Grappler is off so op names in the trace are graph op names;
- the step runs every fetch plus every sink op (as targets: nothing comes back to the
  client), so every op the simulator counts really runs.

Then: warm-up steps, the median of N timed steps (wall clock around ``Session.run``), and
optionally FULL_TRACE steps whose ``step_stats`` give per-op medians, the device each op
ran on and the transfers (``RecvTensor``) that happened.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from placetool.costmodel.errors import UserError
from placetool.costmodel.graph import KIND_BITS

from .session import import_tf, runnable_graph_def, session_config
from .testbed import ClusterSpec, TestbedError, port_open


class RunError(UserError):
    """A placement cannot run, or the run failed / timed out; the message says where."""


class WorkerLost(TestbedError):
    """A worker stopped listening while a step ran; the message names it."""


#: the thread a session call runs on while the caller watches the workers; one still
#: alive at exit is stuck in TensorFlow's C++ (its worker is gone), and the CLI then
#: leaves by ``os._exit`` rather than wait for it or tear the interpreter down under it
STEP_THREAD = "placetool-step"
#: seconds between liveness checks of the workers while a session call runs (the first
#: check waits as long, so a normal step is never disturbed by probes)
WATCH_S = 0.5


@dataclass
class Measurement:
    """One placement measured on real devices (µs)."""

    step_us: float
    steps_us: list[float]
    op_us: dict[str, float] = field(default_factory=dict)        # median per op (traced steps)
    op_device: dict[str, str] = field(default_factory=dict)      # TF device each op ran on
    op_start_us: dict[str, float] = field(default_factory=dict)  # start in the last traced step
    transfers: list[dict] = field(default_factory=list)          # last traced step's RecvTensor events
    setup_s: float = 0.0

    def devices_used(self) -> set[str]:
        return set(self.op_device.values())

    def to_dict(self) -> dict:
        return {"measured_us": self.step_us, "steps_us": self.steps_us, "n_traced_ops": len(self.op_us),
                "n_transfers": len(self.transfers), "setup_s": self.setup_s}


def local_spec() -> ClusterSpec:
    """This process's own devices: the CPU, then every visible GPU (``--local``)."""
    tf = import_tf()

    gpus = tf.config.list_physical_devices("GPU")
    base = "/job:localhost/replica:0/task:0/device:"
    return ClusterSpec(workers=[], tf_devices=[base + "CPU:0"] + [f"{base}GPU:{k}" for k in range(len(gpus))],
                       kinds=["cpu"] + ["gpu"] * len(gpus), job="localhost")


# ----------------------------------------------------------------- checks
def check_placement(graph, placement, spec: ClusterSpec) -> np.ndarray:
    """Per-op placement checked against the graph and the devices, before anything runs.

    Accepts a per-op array or a per-group assignment. Refuses devices the spec lacks,
    split groups and ops on a device kind they have no kernel for.
    """
    p = np.asarray(placement)
    if p.ndim != 1 or p.dtype.kind not in "iu":
        raise RunError(f"a placement is a 1-D integer array, got shape {p.shape} dtype {p.dtype}")
    if len(p) == graph.n_groups and len(p) != graph.n_ops:
        p = graph.to_placement(p)
    if len(p) != graph.n_ops:
        raise RunError(f"placement has {len(p)} entries; graph {graph.name!r} has {graph.n_ops} ops")
    D = len(spec.tf_devices)
    bad = np.flatnonzero((p < 0) | (p >= D))
    if bad.size:
        raise RunError(f"op {graph.names[bad[0]]!r}: device index {int(p[bad[0]])} is not one of the "
                       f"{D} devices being measured (0..{D - 1})")
    first = graph.group_first
    split = np.flatnonzero(p != p[first[graph.group]])
    if split.size:
        op = int(split[0])
        f = int(first[graph.group[op]])
        raise RunError(f"placement splits the group of op {graph.names[f]!r}: op {graph.names[op]!r} is on "
                       f"device {int(p[op])}, not {int(p[f])}")
    bits = np.array([KIND_BITS[k] for k in spec.kinds], np.uint8)
    nok = np.flatnonzero((graph.allowed & bits[p]) == 0)
    if nok.size:
        op = int(nok[0])
        raise RunError(f"op {graph.names[op]!r} ({graph.op_types[op]}) has no kernel on a "
                       f"{spec.kinds[p[op]]} device ({spec.tf_devices[p[op]]})")
    return np.ascontiguousarray(p, np.int32)


# ----------------------------------------------------------------- rewrite
def _strip(name: str) -> str:
    return name.split(":")[0].lstrip("^")


def build_step_graph(traced, placement, tf_devices):
    """(tf.Graph, step target names, init target names, init feeds {name: value}).

    ``placement`` is per op of ``traced.graph``; nodes the OpGraph does not know (rare:
    bookkeeping nodes) go with their first placed input, else device 0. Variables are
    initialised by ``init`` targets fed their values once (see :func:`runnable_graph_def`).
    """
    tf = import_tf()

    graph = traced.graph
    gd, init = runnable_graph_def(traced, feeds_as_const=True)
    dev_of = {graph.names[i]: tf_devices[int(d)] for i, d in enumerate(placement)}
    nodes = {n.name for n in gd.node}
    init_targets, init_feeds = [], {}
    for k, (name, value) in enumerate(init.items()):
        dtype = tf.as_dtype(value.dtype).as_datatype_enum
        ph = gd.node.add()
        ph.name = f"placetool_init/{k}/value"
        ph.op = "Placeholder"
        ph.attr["dtype"].type = dtype
        ph.attr["shape"].shape.CopyFrom(tf.TensorShape(value.shape).as_proto())
        assign = gd.node.add()
        assign.name = f"placetool_init/{k}/assign"
        assign.op = "AssignVariableOp"
        assign.input.extend([name, ph.name])
        assign.attr["dtype"].type = dtype
        dev_of[ph.name] = dev_of[assign.name] = dev_of.get(name, tf_devices[0])
        init_targets.append(assign.name)
        init_feeds[ph.name + ":0"] = value

    for node in gd.node:
        d = dev_of.get(node.name)
        if d is None:
            d = next((dev_of[_strip(i)] for i in node.input if _strip(i) in dev_of), tf_devices[0])
            dev_of[node.name] = d
        node.device = d

    # targets: the fetches plus every op nothing consumes, so all graph ops run
    consumed = {_strip(i) for n in gd.node for i in n.input}
    targets = [_strip(f) for f in traced.fetches]
    targets += [v for v in graph.names if v not in consumed and v in nodes and v not in targets]
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.import_graph_def(gd, name="")
    return g, targets, init_targets, init_feeds


# ----------------------------------------------------------------- measuring
_RECV = re.compile(r"\[([^\]]*)\]\s*\[([^\]]*)\]\s*(\S+) from (\S+) to (\S+)")


class PlacedStep:
    """One placement of a traced step, opened in its own Session and ready to time.

    ``with PlacedStep(traced, p, spec) as st: st.step()`` -> µs of one step. Several may be
    open at once on the same devices (each has its own variables), which is how
    :func:`measure_interleaved` alternates placements step by step.

    Every session call runs on a thread of its own while this one checks that the
    workers still listen (:meth:`run`): a worker that dies mid-step is a
    :class:`WorkerLost` within a second or two, not after gRPC's deadlines (a killed
    task 0 left the client waiting 30-55 s), and a call that outlives ``timeout_s`` is
    given up on even if TensorFlow does not give up itself.
    """

    def __init__(self, traced, placement, spec: ClusterSpec, timeout_s: float = 120.0):
        self.traced, self.spec, self.timeout_s = traced, spec, timeout_s
        self.placement = check_placement(traced.graph, placement, spec)
        self.sess = None
        self.abandoned = False  # a worker is gone or a call was given up on: closing is not waited for
        self.failed = False  # a call failed: closing is waited for a little only

    def __enter__(self):
        tf = import_tf()
        t0 = time.perf_counter()
        g, targets, init_targets, init_feeds = self._graph()
        # workers run one op at a time on their own pools; in-process (--local) devices
        # share this process's pools, so give each device a thread
        threads = 1 if self.spec.workers else max(2, len(self.spec.tf_devices))
        with _tf_errors(self.timeout_s):
            self.sess = tf.compat.v1.Session(self.spec.target, graph=g,
                                             config=session_config(self.timeout_s, threads, isolate=True))
            try:
                if init_targets:
                    self.run([g.get_operation_by_name(n) for n in init_targets], feed_dict=init_feeds)
                self.ops = [g.get_operation_by_name(n) for n in targets]
                self.run(self.ops)  # the first step pays for graph registration
            except BaseException:
                self.close()
                raise
        self.setup_s = time.perf_counter() - t0
        return self

    def _graph(self):
        """(tf.Graph, target op names, initialiser op names, initialiser feeds) to run."""
        return build_step_graph(self.traced, self.placement, self.spec.tf_devices)

    def step(self) -> float:
        """Run one step; its wall time in µs."""
        sess, ops = self.sess, self.ops

        def timed():
            s = time.perf_counter()
            sess.run(ops)
            return (time.perf_counter() - s) * 1e6

        with _tf_errors(self.timeout_s):
            return self.call(timed)

    def run(self, fetches, **kw):
        """``Session.run`` watched as :meth:`call` watches it."""
        sess = self.sess
        return self.call(lambda: sess.run(fetches, **kw))

    def call(self, fn):
        """``fn()`` (a session call) on a thread of its own, while this thread checks every
        :data:`WATCH_S` that every worker still listens. A worker that does not, twice in a
        row, is a :class:`WorkerLost`; a call still running ``timeout_s`` (+2 s for
        TensorFlow's own error to come first) after it began is a :class:`RunError`. Either
        way the call is left running (it is stuck in TensorFlow) and the session abandoned."""
        if not self.spec.workers:  # this process's own devices: nothing to lose
            return fn()
        out: dict = {}
        done = threading.Event()

        def target():
            try:
                out["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                out["error"] = e
            finally:
                done.set()

        threading.Thread(target=target, name=STEP_THREAD, daemon=True).start()
        deadline = time.monotonic() + self.timeout_s + 2.0
        silent = set()
        try:
            while not done.wait(WATCH_S):
                now_silent = {k for k, a in enumerate(self.spec.workers) if not port_open(a, WATCH_S)}
                lost = sorted(silent & now_silent)
                if lost:
                    self.abandoned = True
                    raise WorkerLost(
                        "worker " + ", ".join(f"/job:{self.spec.job}/task:{k} at {self.spec.workers[k]}"
                                              for k in lost)
                        + " stopped answering during the measurement (it no longer accepts connections)")
                silent = now_silent
                if time.monotonic() > deadline:
                    self.abandoned = True
                    raise RunError(f"a step did not finish within {self.timeout_s:g} s (--timeout)")
        except (KeyboardInterrupt, SystemExit):
            # Ctrl-C or SIGTERM: let the step end (as it would have in C++) before the
            # session closes under it, unless it is stuck
            if not done.wait(self.timeout_s):
                self.abandoned = True
            raise
        if "error" in out:
            if any_silent(self.spec):
                self.abandoned = True  # e.g. task 1 gone: the step fails at once, closing would wait 20 s+
            else:
                self.failed = True
            raise out["error"]
        return out["value"]

    def close(self) -> None:
        if self.sess is not None:
            sess, self.sess = self.sess, None
            if self.abandoned or self.failed:
                # closing talks to workers that may be gone: TF would wait for them
                t = threading.Thread(target=_close_quietly, args=(sess,), name="SessionCloseThread", daemon=True)
                t.start()
                t.join(0 if self.abandoned else 2.0)
            else:
                sess.close()

    def __exit__(self, *exc):
        self.close()
        return False


def any_silent(spec: ClusterSpec) -> bool:
    """Whether some worker of ``spec`` does not accept connections now."""
    return any(not port_open(a, WATCH_S) for a in spec.workers)


def _close_quietly(sess) -> None:
    try:
        sess.close()
    except Exception:  # noqa: BLE001 - a session whose worker is gone fails to close; nothing to do
        pass


class _tf_errors:
    """TensorFlow's run-time errors as one-line placetool errors."""

    def __init__(self, timeout_s):
        self.timeout_s = timeout_s

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if typ is None:
            return False
        tf = import_tf()
        if not isinstance(e, tf.errors.OpError):
            return False
        first = (e.message or "").strip().splitlines()[0] if e.message else type(e).__name__
        if isinstance(e, tf.errors.DeadlineExceededError):
            raise RunError(f"a step did not finish within {self.timeout_s:g} s (operation_timeout): {first}") from None
        if isinstance(e, tf.errors.UnavailableError):
            raise TestbedError(f"a worker became unreachable: {first}") from None
        raise RunError(f"TensorFlow refused the placed graph: {first}") from None


def measure(traced, placement, spec: ClusterSpec, warmup: int = 2, steps: int = 5,
            trace_steps: int = 0, timeout_s: float = 120.0) -> Measurement:
    """Run ``traced`` with ``placement`` on ``spec``'s devices; median step time in µs.

    ``trace_steps`` > 0 adds that many FULL_TRACE steps for the per-op profile (their
    times are not part of the step median: tracing slows a step down).
    """
    tf1 = import_tf().compat.v1
    p = check_placement(traced.graph, placement, spec)
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    with PlacedStep(traced, p, spec, timeout_s) as st:
        for _ in range(max(warmup - 1, 0)):
            st.step()
        times = [st.step() for _ in range(max(steps, 1))]
        m = Measurement(float(statistics.median(times)), times, setup_s=st.setup_s)
        if trace_steps > 0:
            with _tf_errors(timeout_s):
                _trace(tf1, st, trace_steps, traced.graph, m)
    return m


@dataclass
class Repeated:
    """One placement measured in ``rounds`` interleaved with others (µs)."""

    step_us: float              # median of every timed step
    round_us: list[float]       # median step of each round
    steps_us: list[float]

    @property
    def spread_pct(self) -> float:
        """Half the range of the round medians, % of the median: the noise floor of this
        placement (how far apart repeated measurements of the same placement land)."""
        if len(self.round_us) < 2 or self.step_us <= 0:
            return 0.0
        return 100.0 * (max(self.round_us) - min(self.round_us)) / 2.0 / self.step_us

    def to_dict(self) -> dict:
        return {"measured_us": self.step_us, "round_us": self.round_us, "spread_pct": self.spread_pct}


def measure_interleaved(traced, placements, spec: ClusterSpec, rounds: int = 3, steps: int = 3,
                        warmup: int = 2, timeout_s: float = 120.0, log=None, monitor=None) -> list[Repeated]:
    """Measure several placements of one traced step side by side.

    All placements are opened at once; then ``rounds`` times, each placement runs
    ``steps`` timed steps in turn (the order rotates every round), so load that drifts
    over the run hits every placement alike. Identical placements are measured once.
    ``monitor`` (e.g. :class:`placetool.costmodel.tf.sentinel.Monitor`) is started once
    the placements are open, and asked after each round whether to run it again.
    Returns one :class:`Repeated` per placement, in the order given.
    """
    P = [check_placement(traced.graph, p, spec) for p in placements]  # all refused before any runs
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    keys, uniq = [], {}
    for p in P:
        k = p.tobytes()
        keys.append(uniq.setdefault(k, len(uniq)))
    first = {j: P[i] for i, j in reversed(list(enumerate(keys)))}
    opened: list[PlacedStep] = []
    try:
        for j in range(len(uniq)):
            opened.append(PlacedStep(traced, first[j], spec, timeout_s).__enter__())
            for _ in range(max(warmup - 1, 0)):
                opened[-1].step()
        times = [[[] for _ in range(max(rounds, 1))] for _ in opened]
        if monitor is not None:
            monitor.start()
        r = 0
        while r < max(rounds, 1):
            order = list(range(len(opened)))
            order = order[r % len(order):] + order[:r % len(order)]
            for j in order:
                times[j][r] = [opened[j].step() for _ in range(max(steps, 1))]
            if monitor is not None and monitor.again(r, log):
                continue
            if log:
                log(f"  round {r + 1}/{rounds} done")
            r += 1
    except BaseException:
        lost = any(st.abandoned for st in opened) or any_silent(spec)
        for st in opened:  # every session talks to a lost worker: none is waited for
            st.abandoned = st.abandoned or lost
            st.failed = True
        raise
    finally:
        for st in opened:
            st.close()
    out = []
    for j in keys:
        rs = times[j]
        flat = [t for rr in rs for t in rr]
        out.append(Repeated(float(statistics.median(flat)), [float(statistics.median(rr)) for rr in rs], flat))
    return out


def _trace(tf1, st: PlacedStep, n, graph, m: Measurement) -> None:
    per_op: dict[str, list[float]] = {}
    for _ in range(n):
        opts = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
        md = tf1.RunMetadata()
        st.run(st.ops, options=opts, run_metadata=md)
        this: dict[str, float] = {}
        starts, devs, transfers = {}, {}, []
        t_min = min((ns.all_start_micros for ds in md.step_stats.dev_stats for ns in ds.node_stats), default=0)
        for ds in md.step_stats.dev_stats:
            for ns in ds.node_stats:
                if ns.all_end_rel_nanos:
                    dur = ns.all_end_rel_nanos / 1e3
                else:
                    dur = float(ns.all_end_rel_micros)
                if ns.node_name == "RecvTensor":
                    r = _RECV.search(ns.timeline_label)
                    transfers.append({
                        "tensor": r.group(3) if r else ns.timeline_label, "size": r.group(1) if r else "",
                        "src": r.group(4) if r else "", "dst": r.group(5) if r else ds.device,
                        "start_us": float(ns.all_start_micros - t_min), "dur_us": dur,
                    })
                    continue
                if ns.node_name not in graph.index:
                    continue
                this[ns.node_name] = this.get(ns.node_name, 0.0) + dur
                starts.setdefault(ns.node_name, float(ns.all_start_micros - t_min))
                devs[ns.node_name] = ds.device
        for k, v in this.items():
            per_op.setdefault(k, []).append(v)
        m.op_start_us, m.op_device, m.transfers = starts, devs, transfers
    m.op_us = {k: float(statistics.median(v)) for k, v in per_op.items()}


def remap_placement(src_graph, placement, dst_graph) -> np.ndarray:
    """A per-op placement of ``src_graph`` as one of ``dst_graph``, matched by op name."""
    p = np.asarray(placement)
    if len(p) == src_graph.n_groups and len(p) != src_graph.n_ops:
        p = src_graph.to_placement(p)
    if src_graph is dst_graph:
        return np.ascontiguousarray(p, np.int32)
    out = np.empty(dst_graph.n_ops, np.int32)
    for i, name in enumerate(dst_graph.names):
        j = src_graph.index.get(name)
        if j is None:
            raise RunError(f"op {name!r} of the traced graph is not in graph {src_graph.name!r}: "
                           "trace the same model, batch and mode that the search used")
        out[i] = p[j]
    return out


def verify_top(traced, candidates, spec: ClusterSpec | None = None, testbed: int = 0,
               testbed_device: str = "cpu", rounds: int = 3, steps: int = 3, warmup: int = 2,
               timeout_s: float = 120.0, log=None, confirm_rounds: int = 5, trace=(), trace_steps: int = 2) -> dict:
    """Measure search candidates beside the baselines and pick what hardware says is fastest.

    ``candidates``: dicts with ``label``, ``source`` (``"search"`` for a placement the
    search found, anything else for a baseline: ``"single"``, ``"baseline"``),
    ``placement`` (per op of ``traced.graph``) and ``predicted_us``. All are measured in
    one run, interleaved, with the sentinel between rounds
    (:func:`~placetool.costmodel.tf.sentinel.measure_with_sentinel`) on ``spec``'s
    devices or on a fresh ``testbed``-worker testbed; :func:`judge` picks from it. A
    search placement picked so is then measured again against the best baseline and one
    device in a fresh run of ``confirm_rounds`` paired rounds, which took no part in
    choosing it (the fastest of several noisy measurements is biased low), and is
    recommended only if that run confirms it (:func:`confirm`); a baseline other than one
    device that ends up recommended is confirmed against one device the same way
    (``baseline_confirmation``), else one device is. ``confirm_rounds=0`` skips both.
    Returns :func:`judge`'s account plus ``sentinel`` and the confirmations; with
    ``trace`` (placements per op of ``traced.graph``, measured or not), ``traces`` too:
    for each, ``trace_steps`` FULL_TRACE steps on the same devices after the
    measurements, as a timeline dict (:func:`~placetool.costmodel.tf.trace_capture.capture`).
    """
    from .sentinel import measure_with_sentinel

    if spec is None and not testbed:
        raise RunError("verify_top needs a cluster spec or a testbed size")
    P = [c["placement"] for c in candidates]
    for p in [*P, *trace]:
        check_placement(traced.graph, p, spec or ClusterSpec.for_workers(["localhost:0"] * testbed,
                                                                          testbed_device))
    ref = next((i for i, c in enumerate(candidates) if c["source"] == "single"), 0)

    def measure(sp, placements, n_rounds, reference):
        return measure_with_sentinel(traced, placements, sp, rounds=n_rounds, steps=steps, warmup=warmup,
                                     reference=reference, timeout_s=timeout_s, log=log)

    def run(sp):
        reps, sent = measure(sp, P, rounds, ref)
        rows, first = [], {}
        for i, (c, m) in enumerate(zip(candidates, reps)):
            row = {k: v for k, v in c.items() if k != "placement"}
            j = first.setdefault(np.asarray(P[i], np.int32).tobytes(), i)
            if j != i:
                row["same_as"] = candidates[j]["label"]  # measured once, reported for both
            row.update(m.to_dict())
            row["error_pct"] = 100.0 * (c["predicted_us"] - m.step_us) / m.step_us
            row["ratio_to_single"] = sent["paired"][i]["ratio"]
            rows.append(row)
        out = judge(rows, sentinel_floor_pct=sent["noise_floor_pct"])
        out["sentinel"] = {k: v for k, v in sent.items() if k != "paired"}
        s = out["recommended"]
        if confirm_rounds and out["confirmed"]:
            b = out["best_baseline"]
            c = out["confirmation"] = fresh(sp, rows, s, b)
            # a search placement must beat one device in the fresh run too, not only the baseline
            # that looked best in the run that chose it
            one = c["against_single"] = (confirm(c["round_us"][s], c["round_us"][ref], c["noise_floor_pct"],
                                                 keep=c["kept"])
                                         if candidates[ref]["source"] == "single" and ref not in (s, b) else None)
            if not c["confirmed"] or (one and not one["confirmed"]):
                failed, vs = (c, b) if not c["confirmed"] else (one, ref)
                out["confirmed"] = False
                out["recommended"] = out["fallback"]
                out["message"] = (f"NOT confirmed: {rows[s]['label']} measured {out['gain_pct']:.1f}% faster than "
                                  f"{rows[b]['label']} in the run that chose it, but {failed['gain_pct']:+.1f}% "
                                  f"against {rows[vs]['label']} in a fresh run of {confirm_rounds} paired rounds "
                                  f"({_tally(failed)}, noise floor {failed['noise_floor_pct']:.1f}%); recommending "
                                  f"{rows[out['fallback']]['label']}")
            else:
                out["message"] += (f"; confirmed by a fresh run of {confirm_rounds} paired rounds: "
                                   f"{c['gain_pct']:+.1f}% ({_tally(c)})"
                                   + (f", {one['gain_pct']:+.1f}% against {rows[ref]['label']}" if one else ""))
        r = out["recommended"]
        if confirm_rounds and rows[r]["source"] not in ("search", "single") and candidates[ref]["source"] == "single":
            # a baseline replaces one device only when a fresh run agrees, as a search placement does
            c = out["baseline_confirmation"] = fresh(sp, rows, r, ref)
            verdict = "confirmed" if c["confirmed"] else "NOT confirmed"
            out["message"] += (f"; {rows[r]['label']} {verdict} against {rows[ref]['label']} by a fresh run of "
                               f"{confirm_rounds} paired rounds: {c['gain_pct']:+.1f}% ({_tally(c)})")
            if not c["confirmed"]:
                out["recommended"] = ref
                out["message"] += f"; recommending {rows[ref]['label']}"
        if trace:  # after every measurement, which the tracer's load must not touch
            from .trace_capture import capture

            if log:
                log(f"tracing {trace_steps} steps of each of {len(trace)} placements ...")
            out["traces"] = [capture(traced, p, sp, steps=trace_steps, warmup=2, single_device=None,
                                     timeout_s=timeout_s) for p in trace]
        return out

    def fresh(sp, rows, win, against) -> dict:
        """``win`` against ``against`` (and one device) in a fresh run of paired rounds."""
        if log:
            log(f"confirming {rows[win]['label']} against {rows[against]['label']} and one device in a fresh run "
                f"of {confirm_rounds} paired rounds ...")
        idx = list(dict.fromkeys([ref, against, win]))
        reps2, sent2 = measure(sp, [P[i] for i in idx], confirm_rounds, 0)
        # every round flagged keeps none: a run the sentinel saw disturbed throughout confirms nothing
        c = confirm(reps2[idx.index(win)].round_us, reps2[idx.index(against)].round_us, sent2["noise_floor_pct"],
                    keep=sent2["kept_rounds"])
        c["ratio_to_single"] = {rows[i]["label"]: sent2["paired"][k]["ratio"] for k, i in enumerate(idx)}
        c["round_us"] = {i: list(reps2[k].round_us) for k, i in enumerate(idx)}  # by row
        c["kept"] = list(sent2["kept_rounds"])
        c["sentinel"] = {k: v for k, v in sent2.items() if k != "paired"}
        return c

    if spec is not None:
        out = run(spec)
    else:
        from .testbed import Testbed

        with Testbed.start(testbed, device=testbed_device, timeout_s=timeout_s) as tb:
            out = run(tb.spec)
    out["placements"] = P
    return out


def confirm(search_round_us, baseline_round_us, noise_floor_pct: float, keep=None, share: float = 0.8,
            min_rounds: int = 3) -> dict:
    """Does a fresh run confirm that a placement beats the baseline? Round by round, its
    median step over the baseline's (paired, so load that hits a round cancels): confirmed
    when the median of those ratios is faster by more than the noise floor and the
    placement was faster in at least ``share`` of the rounds (``keep``: the rounds to use,
    those the sentinel did not flag; None for all). Fewer than ``min_rounds`` rounds kept
    (or than were run, if fewer) confirm nothing: one steady round cannot tell a gain from
    the noise. With none kept the gain is still reported, from every round.

    >>> confirm([90, 95, 92, 91, 99], [100, 100, 101, 99, 98], noise_floor_pct=2.0)["confirmed"]
    True
    >>> confirm([90, 105, 92, 104, 99], [100, 100, 101, 99, 98], noise_floor_pct=2.0)["confirmed"]
    False
    >>> confirm([90, 95, 92, 91, 99], [100, 100, 101, 99, 98], noise_floor_pct=2.0, keep=[2])["confirmed"]
    False
    >>> confirm([90, 95, 92, 91, 99], [100, 100, 101, 99, 98], noise_floor_pct=2.0, keep=[])["confirmed"]
    False
    """
    s, b = np.asarray(search_round_us, np.float64), np.asarray(baseline_round_us, np.float64)
    rounds = np.arange(s.size) if keep is None else np.asarray(list(keep), np.int64)
    q = (s[rounds] / b[rounds]) if rounds.size else (s / b)
    gain = 100.0 * (1.0 - float(np.median(q)))
    faster = int(np.count_nonzero(q < 1.0))
    enough = rounds.size > 0 and rounds.size >= min(min_rounds, s.size)
    ok = enough and gain > noise_floor_pct and faster >= int(np.ceil(share * q.size))
    return {"confirmed": bool(ok), "gain_pct": gain, "ratios": [float(x) for x in q], "rounds": int(rounds.size),
            "rounds_run": int(s.size), "rounds_faster": faster, "noise_floor_pct": float(noise_floor_pct)}


def _tally(c: dict) -> str:
    """'faster in 4 of 5', and how many rounds the sentinel kept where it flagged some."""
    if c["rounds"] == 0:
        return f"faster in {c['rounds_faster']} of {c['rounds_run']}, every one flagged by the sentinel"
    kept = "" if c["rounds"] == c.get("rounds_run", c["rounds"]) else \
        f", the {c['rounds']} of {c['rounds_run']} the sentinel kept"
    return f"faster in {c['rounds_faster']} of {c['rounds']}{kept}"


def judge(rows: list[dict], sentinel_floor_pct: float = 0.0) -> dict:
    """Which measured placement to recommend, and whether the search's gain is real.

    ``rows``: ``source``, ``label``, ``predicted_us``, ``measured_us``, ``spread_pct``.
    The recommendation is the measured best, except when that is a search placement
    whose lead over the best baseline is within the noise floor (the larger spread of
    the two): then the baseline is recommended, since hardware does not confirm the
    simulated gain. A baseline other than one device replaces one device only by a
    lead beyond the noise floor too (``fallback``): one noisy run does not recommend
    a split that is no faster. ``confirmed`` says whether a search placement is measurably faster
    than every baseline. ``sentinel_floor_pct``: the sentinel's noise floor of the same
    run, which the floor is never below. Returns {rows, recommended (index), confirmed,
    gain_pct (measured gain of the best search placement over the best baseline, % of
    the baseline), best_baseline (index), noise_floor_pct (median spread, at least the
    sentinel's), message}.
    """
    if not rows:
        raise ValueError("nothing was measured")
    meas = np.array([r["measured_us"] for r in rows])
    is_search = np.array([r["source"] == "search" for r in rows])
    best = int(np.argmin(meas))
    noise = max(float(np.median([r["spread_pct"] for r in rows])), sentinel_floor_pct)
    out = {"rows": rows, "recommended": best, "confirmed": False, "gain_pct": None,
           "noise_floor_pct": noise, "best_baseline": None}
    if not is_search.any() or is_search.all():
        out["message"] = f"measured best: {rows[best]['label']}"
        return out
    s = int(np.flatnonzero(is_search)[np.argmin(meas[is_search])])
    b = int(np.flatnonzero(~is_search)[np.argmin(meas[~is_search])])
    gain = 100.0 * (meas[b] - meas[s]) / meas[b]
    floor = max(rows[s]["spread_pct"], rows[b]["spread_pct"], sentinel_floor_pct)
    out["gain_pct"] = float(gain)
    out["best_baseline"] = b
    fallback, why = b, ""
    one = next((i for i, r in enumerate(rows) if r["source"] == "single"), None)
    if one is not None and b != one:
        lead = 100.0 * (meas[one] - meas[b]) / meas[one]
        if lead <= max(rows[one]["spread_pct"], rows[b]["spread_pct"], sentinel_floor_pct):
            fallback = one
            why = f" ({rows[b]['label']} measured only {lead:.1f}% faster than {rows[one]['label']}, within the noise)"
    out["fallback"] = fallback
    best_pred = int(np.flatnonzero(is_search)[np.argmin([rows[i]["predicted_us"] for i in np.flatnonzero(is_search)])])
    sim_gain = 100.0 * (rows[b]["predicted_us"] - rows[best_pred]["predicted_us"]) / rows[b]["predicted_us"]
    same = rows[s].get("same_as") == rows[b]["label"] or rows[b].get("same_as") == rows[s]["label"]
    if same:
        out["recommended"] = fallback
        out["message"] = (f"the search's best measured placement is the {rows[b]['label']} placement itself; "
                          f"recommending {rows[fallback]['label']}{why}")
    elif gain > floor:
        out["confirmed"] = True
        out["recommended"] = s
        out["message"] = (f"confirmed on hardware: {rows[s]['label']} measured {gain:.1f}% faster than "
                          f"{rows[b]['label']} (noise floor {floor:.1f}%)")
    else:
        out["recommended"] = fallback
        what = "slower than" if gain < -floor else "no faster than"
        out["message"] = (f"NOT confirmed on hardware: predicted {sim_gain:.1f}% faster than "
                          f"{rows[b]['label']}, the search's best placement measured {what} it "
                          f"(gain {gain:+.1f}%, noise floor {floor:.1f}%); recommending {rows[fallback]['label']}{why}")
    return out
