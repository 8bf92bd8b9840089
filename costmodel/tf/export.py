"""Hand a placement to TensorFlow: a placed GraphDef on disk, or a Keras training step run under it.

:func:`write_export` (``placetool export``) writes a folder:

- ``graph.pb``: the traced training step as a ``GraphDef`` whose every node has its
  ``device`` set (TF device strings, see :mod:`placetool.costmodel.placement`), with the
  variables as ``VarHandleOp`` plus initialisers that hold their starting values — the
  file runs on its own, no Python model needed;
- ``export.json``: which ops to run — ``init`` once, then ``step`` per training step
  (``fetches``: the loss) — and the TF devices and cluster job it expects;
- ``placement.json``: the placement, with ``tf_devices`` beside the short device names.

Run it with any TF1 ``Session`` whose target reaches those devices (soft placement off
keeps every op where the file says); :func:`run_export` does that and reports the device
each op ran on from a FULL_TRACE step. :func:`apply_placement` runs a Keras model's
training step under a placement directly, feeding real batches and copying the trained
weights back.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placetool.costmodel.errors import UserError, atomic_write, read_json
from placetool.costmodel.placement import Placement, tf_device_names

FORMAT = "placetool.export"
VERSION = 1


class ExportError(UserError):
    """An export folder is missing or malformed, or a placement does not fit the model."""


def _tf():
    from .session import import_tf

    return import_tf()


# ------------------------------------------------------------------ building
@dataclass
class PlacedGraph:
    """A traced step rewritten to run placed: the ``tf.Graph`` plus what to run."""

    graph: object
    step_ops: list[str]
    init_ops: list[str]
    init_feeds: dict
    fetches: list[str]
    variables: dict = field(default_factory=dict)  # VarHandleOp name -> the model's tf.Variable


def placed_graph(traced, placement, tf_devices) -> PlacedGraph:
    """Rewrite ``traced`` (an importer ``Traced``) with per-op ``placement`` on ``tf_devices``."""
    from .runner import build_step_graph, check_placement
    from .testbed import ClusterSpec

    kinds = ["gpu" if "GPU" in d.upper() else "cpu" for d in tf_devices]
    p = check_placement(traced.graph, placement, ClusterSpec([], list(tf_devices), kinds))
    g, targets, init_targets, init_feeds = build_step_graph(traced, p, list(tf_devices))
    tf = _tf()
    variables = {ph: obj for ph, obj in traced.captures if isinstance(obj, tf.Variable)}
    fetches = [f.split(":")[0] for f in traced.fetches]
    return PlacedGraph(g, targets, init_targets, init_feeds, fetches, variables)


def self_contained_graph_def(pg: PlacedGraph):
    """The placed ``GraphDef`` with each variable's initial value stored in it as a ``Const``."""
    tf = _tf()
    gd = pg.graph.as_graph_def()
    values = {k.split(":")[0]: v for k, v in pg.init_feeds.items()}
    for node in gd.node:
        v = values.get(node.name)
        if v is None:
            continue
        arr = np.asarray(v)
        node.op = "Const"
        node.ClearField("input")
        node.attr.clear()
        node.attr["dtype"].type = tf.as_dtype(arr.dtype).as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(arr))
    return gd


# ------------------------------------------------------------------ files
def write_export(traced, placement: Placement, cluster, out_dir, spec=None, source: str | None = None) -> dict:
    """Write ``graph.pb``, ``placement.json`` and ``export.json`` into ``out_dir``; returns the manifest.

    ``placement`` must name every op of ``traced.graph``; ``spec``: where the devices are
    (see :func:`~placetool.costmodel.placement.tf_device_names`).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out}: exists and is not a folder")
    p = placement.to_array(traced.graph, cluster, source="placement")
    tf_devices = tf_device_names(cluster, spec)
    pg = placed_graph(traced, p, tf_devices)
    gd = self_contained_graph_def(pg)
    data = gd.SerializeToString()
    pl = placement.with_tf_devices(cluster, spec)
    used = sorted({tf_devices[i] for i in np.unique(p)})
    jobs = sorted({d.split("/job:")[1].split("/")[0] for d in used if "/job:" in d})
    manifest = {
        "format": FORMAT, "version": VERSION, "graph": traced.graph.name, "source": source,
        "cluster": cluster.name, "n_ops": traced.graph.n_ops, "graph_def": "graph.pb", "placement": "placement.json",
        "init": pg.init_ops, "step": pg.step_ops, "fetches": pg.fetches,
        "inputs": sorted(k.split(":")[0] for k in (traced.feeds or {})),
        "tf_devices": tf_devices, "devices_used": used, "jobs": jobs,
        "note": "run in a TF1 Session with allow_soft_placement=False; run 'init' once, then 'step' per "
                "training step ('inputs' are Consts holding a sample batch: feed them to train on data)",
    }
    atomic_write(out / "graph.pb", data)
    pl.save(out / "placement.json")
    atomic_write(out / "export.json", json.dumps(manifest, indent=1) + "\n")  # last: marks a complete export
    return manifest


def load_export(path):
    """(tf.Graph, manifest) of an export folder written by :func:`write_export`."""
    path = Path(path)
    m = read_json(path / "export.json", "export manifest", ExportError)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ExportError(f"{path / 'export.json'}: format: not a placetool export")
    if m.get("version") != VERSION:
        raise ExportError(f"{path / 'export.json'}: version: {m.get('version')!r} is not supported")
    for key in ("graph_def", "init", "step", "fetches"):
        if key not in m:
            raise ExportError(f"{path / 'export.json'}: missing {key!r}")
    tf = _tf()
    try:
        gd = tf.compat.v1.GraphDef.FromString((path / m["graph_def"]).read_bytes())
    except FileNotFoundError:
        raise ExportError(f"{path / m['graph_def']}: no such file") from None
    except Exception as e:  # protobuf's DecodeError
        raise ExportError(f"{path / m['graph_def']}: not a GraphDef ({e})") from None
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.import_graph_def(gd, name="")
    return g, m


def run_export(path, target: str = "", steps: int = 3, warmup: int = 1, trace: bool = True,
               timeout_s: float = 120.0) -> dict:
    """Run an export folder's step on ``target`` (``grpc://host:port``, or "" in-process).

    Returns ``steps_us`` (wall clock per step), ``step_us`` (their median), ``loss`` and,
    with ``trace``, ``op_device``: the device each graph op ran on in one FULL_TRACE step.
    """
    from .runner import RunError, session_config

    tf = _tf()
    tf1 = tf.compat.v1
    g, m = load_export(path)
    op = g.get_operation_by_name
    step = [op(n) for n in m["step"]]
    loss = [g.get_tensor_by_name(f + ":0") for f in m["fetches"] if op(f).outputs][:1]
    threads = 2 if not target else 1
    try:
        with tf1.Session(target, graph=g, config=session_config(timeout_s, threads)) as sess:
            sess.run([op(n) for n in m["init"]])
            for _ in range(warmup):
                sess.run(step)
            times, value = [], None
            for _ in range(max(steps, 1)):
                t0 = time.perf_counter()
                value = sess.run(loss + step)[0] if loss else sess.run(step)
                times.append((time.perf_counter() - t0) * 1e6)
            out = {"steps_us": times, "step_us": float(statistics.median(times)),
                   "loss": float(np.mean(value)) if loss else None}
            if trace:
                md = tf1.RunMetadata()
                sess.run(step, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=md)
                out["op_device"] = {ns.node_name: ds.device for ds in md.step_stats.dev_stats
                                    for ns in ds.node_stats if ns.node_name in {o.name for o in g.get_operations()}}
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.UnavailableError,
            tf.errors.DeadlineExceededError, tf.errors.FailedPreconditionError) as e:
        raise RunError(f"TensorFlow could not run {path}: {e.message.splitlines()[0]}") from None
    return out


# ------------------------------------------------------------------ Keras
class PlacedStep:
    """A Keras model's training step running under a placement (see :func:`apply_placement`).

    ``run(x, y)`` runs one step on a batch (numpy arrays of the traced batch size; omit
    them to reuse the sample batch) and returns the loss; ``step_us`` holds each step's
    wall time; ``sync_to_model()`` copies the trained weights back into the Keras
    variables; ``device_of(op name)`` is the TF device an op was given.
    """

    def __init__(self, traced, pg: PlacedGraph, tf_devices, target, timeout_s):
        from .runner import session_config

        tf = _tf()
        self.traced, self.tf_devices, self.target = traced, list(tf_devices), target
        self._g = pg.graph
        self._pg = pg
        op = self._g.get_operation_by_name
        self._step = [op(n) for n in pg.step_ops]
        self._loss = [self._g.get_tensor_by_name(f + ":0") for f in pg.fetches if op(f).outputs][:1]
        self._inputs = [self._g.get_tensor_by_name(n.split(":")[0] + ":0") for n in traced.feeds or {}]
        with self._g.as_default():
            self._reads = {}
            for name, var in pg.variables.items():
                h = self._g.get_tensor_by_name(name + ":0")
                with tf.device(h.op.device):
                    self._reads[name] = tf.raw_ops.ReadVariableOp(resource=h, dtype=var.dtype)
        self.session = tf.compat.v1.Session(target, graph=self._g,
                                            config=session_config(timeout_s, 1 if target else 2))
        self.session.run([op(n) for n in pg.init_ops], feed_dict=pg.init_feeds)
        self.step_us: list[float] = []

    def device_of(self, op_name: str) -> str:
        return self._g.get_operation_by_name(op_name).device

    def run(self, *batch) -> float:
        """One training step; ``batch``: the model's inputs then its targets, as traced."""
        feeds = {}
        if batch:
            if len(batch) != len(self._inputs):
                raise UserError(f"the step takes {len(self._inputs)} arrays (inputs, then targets), got {len(batch)}")
            for t, v in zip(self._inputs, batch):
                v = np.asarray(v)
                if tuple(v.shape) != tuple(t.shape):
                    raise UserError(f"{t.op.name}: batch of shape {v.shape}, the step was traced for {tuple(t.shape)}")
                feeds[t] = v
        t0 = time.perf_counter()
        out = self.session.run(self._loss + self._step, feed_dict=feeds)
        self.step_us.append((time.perf_counter() - t0) * 1e6)
        return float(np.mean(out[0])) if self._loss else float("nan")

    def sync_to_model(self) -> None:
        """Copy the session's variable values into the model's own variables."""
        values = self.session.run(self._reads)
        for name, var in self._pg.variables.items():
            var.assign(values[name])

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "PlacedStep":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def apply_placement(model, placement, cluster=None, spec=None, target: str | None = None,
                    timeout_s: float = 120.0, **trace_kw) -> PlacedStep:
    """Run ``model``'s training step under ``placement``; use as a context manager.

    ``model``: a ``keras.Model`` or a source ``placetool.costmodel.tf.importer.trace``
    takes (zoo name, ``module:function``); ``trace_kw`` go to it (``batch``, ``optimizer``,
    ``mode``). ``placement``: a :class:`Placement`, a placement file, or a per-op array.
    ``cluster``: the cluster its device names belong to (object, preset name or TOML
    path; default: the one the file names). ``spec``: where the devices are — a
    ``ClusterSpec`` or testbed (its target is used), a list of TF device strings, or
    None for this process's own devices (see ``tf_device_names``).
    """
    from placetool.costmodel import presets

    from .importer import trace

    if isinstance(placement, (str, Path)):
        placement = Placement.load(placement)
    if cluster is None:
        if not isinstance(placement, Placement) or not placement.cluster:
            raise UserError("apply_placement needs a cluster (the placement does not name one)")
        cluster = placement.cluster
    if isinstance(cluster, (str, Path)):
        cluster = presets.load_cluster(str(cluster))
    spec = getattr(spec, "spec", spec)  # a Testbed -> its ClusterSpec
    tf_devices = tf_device_names(cluster, spec)
    traced = trace(model, **trace_kw)
    if isinstance(placement, Placement):
        p = placement.to_array(traced.graph, cluster)
    else:
        p = np.asarray(placement)
    if target is None:
        target = getattr(spec, "target", "")
    pg = placed_graph(traced, p, tf_devices)
    return PlacedStep(traced, pg, tf_devices, target, timeout_s)
