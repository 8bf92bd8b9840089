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
import time
from dataclasses import dataclass, field

import numpy as np

from placetool.costmodel.errors import UserError
from placetool.costmodel.graph import KIND_BITS

from .testbed import ClusterSpec, TestbedError


class RunError(UserError):
    """A placement cannot run, or the run failed / timed out; the message says where."""


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
    import tensorflow as tf

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
    first = np.array([ops[0] for ops in graph.group_ops], np.int64)
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
    bookkeeping nodes) go with their first placed input, else device 0.
    """
    import tensorflow as tf

    graph = traced.graph
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(traced.graph_def)
    dev_of = {graph.names[i]: tf_devices[int(d)] for i, d in enumerate(placement)}
    nodes = {n.name: n for n in gd.node}

    init_targets, init_feeds = [], {}
    captured = dict(traced.captures)
    for k, (ph, obj) in enumerate(traced.captures):
        node = nodes.get(ph)
        if node is None:
            raise RunError(f"captured placeholder {ph!r} is not a node of the traced graph")
        if isinstance(obj, tf.Variable):
            node.op = "VarHandleOp"
            node.ClearField("input")
            node.attr.clear()
            node.attr["dtype"].type = obj.dtype.as_datatype_enum
            node.attr["shape"].shape.CopyFrom(obj.shape.as_proto())
            node.attr["container"].s = b""
            node.attr["shared_name"].s = f"placetool/{k}/{ph}".encode()
            value = gd.node.add()
            value.name = f"placetool_init/{k}/value"
            value.op = "Placeholder"
            value.attr["dtype"].type = obj.dtype.as_datatype_enum
            value.attr["shape"].shape.CopyFrom(obj.shape.as_proto())
            assign = gd.node.add()
            assign.name = f"placetool_init/{k}/assign"
            assign.op = "AssignVariableOp"
            assign.input.extend([ph, value.name])
            assign.attr["dtype"].type = obj.dtype.as_datatype_enum
            dev_of[value.name] = dev_of[assign.name] = dev_of.get(ph, tf_devices[0])
            init_targets.append(assign.name)
            init_feeds[value.name + ":0"] = obj.numpy()
        else:
            arr = np.asarray(obj.numpy() if hasattr(obj, "numpy") else obj)
            if arr.dtype == object or getattr(obj, "dtype", None) == tf.resource:
                raise RunError(f"captured input {ph!r} is a {type(obj).__name__} that cannot be rebuilt in a Session")
            _to_const(tf, node, arr)
    for name, value in (traced.feeds or {}).items():
        name = _strip(name)
        node = nodes.get(name)
        if node is None:
            raise RunError(f"feed {name!r} is not a node of the traced graph")
        if name in captured:
            continue
        _to_const(tf, node, np.asarray(value))

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


def _to_const(tf, node, arr: np.ndarray) -> None:
    node.op = "Const"
    node.ClearField("input")
    node.attr.clear()
    node.attr["dtype"].type = tf.as_dtype(arr.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(arr))


def session_config(timeout_s: float, threads: int = 1):
    """Session options: soft placement off, Grappler off (names stay), op timeout."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    cfg = tf1.ConfigProto(
        allow_soft_placement=False,
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads,
        operation_timeout_in_ms=int(timeout_s * 1000),
        isolate_session_state=True,  # each placement gets fresh variables on the workers
    )
    from tensorflow.core.protobuf import rewriter_config_pb2

    rw = cfg.graph_options.rewrite_options
    rw.disable_meta_optimizer = True
    rw.remapping = rewriter_config_pb2.RewriterConfig.OFF
    oo = cfg.graph_options.optimizer_options
    oo.opt_level = tf1.OptimizerOptions.L0
    oo.do_constant_folding = False
    oo.do_common_subexpression_elimination = False
    oo.do_function_inlining = False
    return cfg


# ----------------------------------------------------------------- measuring
_RECV = re.compile(r"\[([^\]]*)\]\s*\[([^\]]*)\]\s*(\S+) from (\S+) to (\S+)")


def measure(traced, placement, spec: ClusterSpec, warmup: int = 2, steps: int = 5,
            trace_steps: int = 0, timeout_s: float = 120.0) -> Measurement:
    """Run ``traced`` with ``placement`` on ``spec``'s devices; median step time in µs.

    ``trace_steps`` > 0 adds that many FULL_TRACE steps for the per-op profile (their
    times are not part of the step median: tracing slows a step down).
    """
    import tensorflow as tf

    tf1 = tf.compat.v1
    p = check_placement(traced.graph, placement, spec)
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    t0 = time.perf_counter()
    g, targets, init_targets, init_feeds = build_step_graph(traced, p, spec.tf_devices)
    target = spec.target
    try:
        # workers run one op at a time on their own pools; in-process (--local) devices
        # share this process's pools, so give each device a thread
        threads = 1 if spec.workers else max(2, len(spec.tf_devices))
        with tf1.Session(target, graph=g, config=session_config(timeout_s, threads)) as sess:
            if init_targets:
                sess.run([g.get_operation_by_name(n) for n in init_targets], feed_dict=init_feeds)
            ops = [g.get_operation_by_name(n) for n in targets]
            for _ in range(warmup):
                sess.run(ops)
            setup_s = time.perf_counter() - t0
            times = []
            for _ in range(max(steps, 1)):
                s = time.perf_counter()
                sess.run(ops)
                times.append((time.perf_counter() - s) * 1e6)
            m = Measurement(float(statistics.median(times)), times, setup_s=setup_s)
            if trace_steps > 0:
                _trace(tf1, sess, ops, trace_steps, traced.graph, m)
    except tf.errors.DeadlineExceededError as e:
        raise RunError(f"a step did not finish within {timeout_s:g} s (operation_timeout): {e.message.splitlines()[0]}") from None
    except tf.errors.UnavailableError as e:
        raise TestbedError(f"a worker became unreachable: {e.message.splitlines()[0]}") from None
    except (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError, tf.errors.NotFoundError,
            tf.errors.FailedPreconditionError, tf.errors.UnimplementedError) as e:
        raise RunError(f"TensorFlow refused the placed graph: {e.message.splitlines()[0]}") from None
    return m


def _trace(tf1, sess, ops, n, graph, m: Measurement) -> None:
    per_op: dict[str, list[float]] = {}
    for _ in range(n):
        opts = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
        md = tf1.RunMetadata()
        sess.run(ops, options=opts, run_metadata=md)
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


# ----------------------------------------------------------------- many placements
def measure_many(traced, placements, spec: ClusterSpec, warmup: int = 2, steps: int = 5,
                 timeout_s: float = 120.0, progress=None) -> list[Measurement]:
    """Measure several placements one after another (each in its own session)."""
    out = []
    for i, p in enumerate(placements):
        out.append(measure(traced, p, spec, warmup=warmup, steps=steps, timeout_s=timeout_s))
        if progress:
            progress(i + 1)
    return out


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


def verify_top(source, cluster, placements, k: int = 3, predicted=None, profile=None,
               spec: ClusterSpec | None = None, testbed: int = 0, testbed_device: str = "cpu",
               graph=None, trace_kw=None, warmup: int = 2, steps: int = 5,
               timeout_s: float = 120.0) -> list[dict]:
    """Measure the ``k`` best of ``placements`` on real devices (``placetool search --verify-top K``).

    ``source``: a :class:`Traced`, or anything ``importer.trace`` takes (with ``trace_kw``).
    ``placements``: per-op (or per-group) arrays for ``graph`` (default: the traced graph),
    best first, or paired with ``predicted`` µs (then sorted by it). Devices: ``spec``, or a
    fresh ``testbed``-worker testbed started and stopped around the measurements.
    Returns one dict per measured placement, best measured first: ``rank`` (by prediction),
    ``predicted_us``, ``measured_us``, ``error_pct`` and ``placement`` (per-op ints).
    """
    traced = source
    if not hasattr(source, "graph_def"):
        from .importer import trace

        traced = trace(source, **(trace_kw or {}))
    graph = graph or traced.graph
    P = [np.asarray(p) for p in placements]
    if predicted is None:
        from placetool.costmodel.simulate import CostModel

        cm = CostModel(traced.graph, cluster, profile=profile)
        predicted = []
        for p in P:
            q = remap_placement(graph, p, traced.graph)
            n_used = len(np.unique(q))
            predicted.append(cm.simulate(q).step_time_us + (profile.step_overhead(n_used) if profile else 0.0))
    order = np.argsort(np.asarray(predicted, np.float64), kind="stable")[:k]
    chosen = [(int(r), remap_placement(graph, P[i], traced.graph), float(predicted[i]))
              for r, i in enumerate(order)]
    if spec is None and not testbed:
        raise RunError("verify_top needs a cluster spec or a testbed size")

    def run_all(sp):
        for p in [c[1] for c in chosen]:
            check_placement(traced.graph, p, sp)  # refuse bad ones before anything runs
        rows = []
        for rank, p, pred in chosen:
            m = measure(traced, p, sp, warmup=warmup, steps=steps, timeout_s=timeout_s)
            rows.append({"rank": rank, "predicted_us": pred, "measured_us": m.step_us,
                         "error_pct": 100.0 * (pred - m.step_us) / m.step_us, "placement": p})
        return sorted(rows, key=lambda r: r["measured_us"])

    if spec is not None:
        return run_all(spec)
    from .testbed import Testbed

    with Testbed.start(testbed, device=testbed_device) as tb:
        return run_all(tb.spec)
