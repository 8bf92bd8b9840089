"""Trace a Keras model, a SavedModel signature or a GraphDef file into a :class:`Traced`
step (the GraphDef, its captures, sample feeds and fetches) and convert it with
:func:`~placetool.costmodel.tf.convert.opgraph_from_tf`. The public entry points
(:func:`~placetool.costmodel.tf.importer.trace` and friends) are in
:mod:`placetool.costmodel.tf.importer`. TensorFlow is imported lazily.
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placetool.costmodel.errors import UserError
from placetool.costmodel.graph import OpGraph

from .convert import opgraph_from_tf
from .session import import_keras, import_tf
from .zoo import Built


class ModelImportError(UserError):
    """A model source that cannot be imported; the message names the source."""


@dataclass
class Traced:
    """One traced TensorFlow step and its OpGraph.

    - ``graph``: the OpGraph; ``graph.names[i]`` is the name of ``graph_def.node[i]``
      (same order, one-to-one; no op is added or dropped).
    - ``graph_def``: the traced step as a ``tf.compat.v1.GraphDef``. In train mode it is
      forward + loss + gradients + optimizer updates (+ the optimizer's iteration
      counter); in infer mode the forward pass. It has no function library calls for the
      zoo and Keras models (LSTMs are unrolled); ``graph.meta["opaque_ops"]`` lists any
      call/control-flow ops that were left in.
    - ``captures``: ``(placeholder node name, value)`` for every value the traced
      function captured: a ``tf.Variable`` (resource ``Placeholder``; create a
      ``VarHandleOp`` of the variable's shape/dtype in its place and initialise it from
      ``value.numpy()``, read eagerly, outside any ``tf.Graph`` context) or an
      ``EagerTensor`` (a captured constant; feed it or replace it by a ``Const``).
      Placeholders for variables have dtype ``resource``.
      :func:`placetool.costmodel.tf.session.runnable_graph_def` does the replacement in
      place (same node names) and returns the initial values;
      ``tests/test_tf_import.py::_run_step`` runs a step with it. (If you instead create
      stand-ins and ``input_map`` them, put them under a fresh top-level scope: a new op
      named ``X/Y/...`` makes TF rename an imported ``X/Y`` to ``X/Y_1``.)
    - ``feeds``: sample values for the step's own input placeholders (inputs and
      targets), keyed by placeholder node name, at the traced fixed batch size.
    - ``fetches``: node names to run for one step (the function's outputs, e.g. the loss,
      and its control outputs, e.g. the variable updates). Running them all in one
      ``session.run`` executes exactly one step.

    To run: ``TF_ENABLE_ONEDNN_OPTS=0`` in the environment before TensorFlow is imported
    (:func:`~placetool.costmodel.tf.session.import_tf` does that), and a Session with
    :func:`~placetool.costmodel.tf.session.session_config` (Grappler off), so that op
    names stay those of ``graph``.
    """

    graph: OpGraph
    graph_def: object
    captures: list = field(default_factory=list)
    feeds: dict = field(default_factory=dict)
    fetches: list = field(default_factory=list)


# ------------------------------------------------------------------ sources
def _call_builder(source: str, cwd: str):
    """Import ``module:function`` from folder ``cwd`` and call it."""
    mod_name, _, fn_name = source.partition(":")
    if not mod_name or not fn_name:
        raise ModelImportError(f"{source!r}: expected module:function")
    cwd = str(Path(cwd).resolve())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    import_tf()
    try:
        mod = importlib.import_module(mod_name)
    except (Exception, SystemExit) as e:  # a module that calls sys.exit() is a broken module too
        raise ModelImportError(f"{source}: cannot import module {mod_name!r} "
                           f"({type(e).__name__}: {_first_line(e)})") from None
    fn = getattr(mod, fn_name, None)
    if fn is None or not callable(fn):
        raise ModelImportError(f"{source}: module {mod_name!r} has no function {fn_name!r}")
    try:
        model = fn()
    except (Exception, SystemExit) as e:
        raise ModelImportError(f"{source}: building the model failed "
                           f"({type(e).__name__}: {_first_line(e)})") from None
    if not isinstance(model, import_keras().Model):
        raise ModelImportError(f"{source}: returned {type(model).__name__}, not a keras.Model")
    return model


def _first_line(e) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


# ------------------------------------------------------------------ Keras tracing
def _trace_keras(built, spec, mode, batch, optimizer, name) -> Traced:
    """Trace a Keras model (or a zoo ``Built``) into a Traced step."""
    tf = import_tf()
    keras = import_keras()

    if not isinstance(built, Built):
        built = Built(model=built)
    model = built.model
    try:
        inputs = list(model.inputs)
    except Exception:
        inputs = []
    if not inputs:
        raise ModelImportError(f"{name}: the model has no defined inputs (build it with keras.Input)")
    in_specs, feeds = [], {}
    rng = np.random.default_rng(0)
    for i, t in enumerate(inputs):
        shape = _fix_batch(name, f"input {i}", t.shape, batch)
        pname = _placeholder_name(getattr(t, "name", None) or f"input_{i}", i, "input")
        dtype = tf.as_dtype(t.dtype)
        in_specs.append(tf.TensorSpec(shape, dtype, name=pname))
        feeds[pname] = _sample(rng, shape, dtype)
    out_list = model.outputs if isinstance(model.outputs, (list, tuple)) else [model.outputs]
    tgt_specs, losses = [], []
    if mode == "train":
        loss_name = built.loss or (model.loss if getattr(model, "loss", None) else "mse")
        try:
            loss_fn = keras.losses.get(loss_name)
        except Exception as e:
            raise ModelImportError(f"{name}: unknown loss {loss_name!r} ({_first_line(e)})") from None
        sparse = "sparse" in str(loss_name if isinstance(loss_name, str) else type(loss_fn).__name__).lower()
        for j, o in enumerate(out_list):
            oshape = _fix_batch(name, f"output {j}", o.shape, batch)
            tshape = oshape[:-1] if sparse else oshape
            tdtype = tf.int32 if sparse else tf.as_dtype(o.dtype)
            pname = f"target_{j}" if len(out_list) > 1 else "target"
            tgt_specs.append(tf.TensorSpec(tshape, tdtype, name=pname))
            feeds[pname] = (rng.integers(0, 2, size=tshape).astype(np.int32) if sparse
                            else _sample(rng, tshape, tdtype))
            losses.append(loss_fn)
        try:
            opt = keras.optimizers.get(optimizer)
        except Exception as e:
            raise ModelImportError(f"optimizer {optimizer!r}: {_first_line(e)}") from None
        opt.build(model.trainable_variables)
    n_in = len(in_specs)

    if mode == "train":
        def step(*args):
            xs, ys = args[:n_in], args[n_in:]
            with tf.GradientTape() as tape:
                preds = model(list(xs) if n_in > 1 else xs[0], training=True)
                preds = preds if isinstance(preds, (list, tuple)) else [preds]
                loss = tf.add_n([f(y, p) for f, y, p in zip(losses, ys, preds)])
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
    else:
        def step(*args):
            return model(list(args) if n_in > 1 else args[0], training=False)

    tagger = _LayerTagger(built.layer_of)
    t0 = time.perf_counter()
    try:
        with tagger:
            fn = tf.function(step, jit_compile=False, autograph=False)
            cf = fn.get_concrete_function(*in_specs, *tgt_specs)
    except ModelImportError:
        raise
    except Exception as e:
        raise ModelImportError(f"{name}: tracing the {mode} step failed "
                           f"({type(e).__name__}: {_first_line(e)})") from None
    variables = list(model.variables) + (list(opt.variables) if mode == "train" else [])
    meta = {"source": "keras", "mode": mode, "batch": int(in_specs[0].shape[0]),
            "tf_version": tf.__version__, "keras_version": keras.__version__}
    if mode == "train":
        meta["optimizer"] = type(opt).__name__.lower()
    meta.update(built.meta)
    meta["trace_seconds"] = round(time.perf_counter() - t0, 3)
    return _finish(cf, variables, feeds, name, meta, tagger)


def _fix_batch(name, what, shape, batch):
    shape = list(shape)
    if not shape:
        return shape
    if shape[0] is None:
        if batch is None:
            raise ModelImportError(f"{name}: {what} has a dynamic batch dimension; give --batch")
        shape[0] = int(batch)
    elif batch is not None and shape[0] != batch:
        raise ModelImportError(f"{name}: {what} has a fixed batch of {shape[0]}, not {batch}")
    if any(d is None for d in shape):
        raise ModelImportError(f"{name}: {what} has a dynamic dimension in shape {shape}; "
                           "build the model with fixed shapes")
    return shape


def _placeholder_name(raw, i, kind):
    import re

    s = re.sub(r"[^A-Za-z0-9_.\-]", "_", str(raw).split(":")[0]) or f"{kind}_{i}"
    return s if s[0].isalpha() else f"{kind}_{s}"


def _sample(rng, shape, dtype):
    if dtype.is_integer:
        return rng.integers(0, 2, size=shape).astype(dtype.as_numpy_dtype)
    if dtype.is_bool:
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.standard_normal(size=shape).astype(dtype.as_numpy_dtype)


class _LayerTagger:
    """Record which graph ops each tagged Keras layer's ``call`` creates while tracing.

    ``layer_of``: {keras layer object: layer index}. Inner (nested) layers win.
    """

    def __init__(self, layer_of):
        self.layer_of = dict(layer_of or {})
        self.tags: dict[str, int] = {}
        self._saved = []

    def __enter__(self):
        tf = import_tf()
        for layer, idx in self.layer_of.items():
            orig = layer.call

            def wrapped(*a, __orig=orig, __idx=idx, **k):
                g = tf.compat.v1.get_default_graph()
                before = len(g.get_operations())
                out = __orig(*a, **k)
                for op in g.get_operations()[before:]:
                    self.tags.setdefault(op.name, __idx)
                return out

            object.__setattr__(layer, "call", wrapped)
            self._saved.append(layer)
        return self

    def __exit__(self, *exc):
        for layer in self._saved:
            try:
                object.__delattr__(layer, "call")
            except AttributeError:
                pass
        self._saved = []
        return False


def _finish(cf, variables, feeds, name, meta, tagger=None) -> Traced:
    """Turn a ConcreteFunction into a Traced step."""
    graph = cf.graph
    gd = graph.as_graph_def()
    by_handle = {}
    for v in list(variables) + list(getattr(graph, "variables", [])):
        tv = getattr(v, "value", v)  # keras.Variable -> tf.Variable
        if callable(tv):  # a plain tf.Variable, whose .value is a method
            tv = v
        h = getattr(tv, "handle", None)
        if h is not None:
            by_handle[id(h)] = tv
    captures = []
    param_shapes = {}
    for ext, internal in graph.captures:
        pname = internal.op.name
        val = by_handle.get(id(ext), ext)
        captures.append((pname, val))
        if val is not ext:
            param_shapes[pname] = (list(val.shape), val.dtype)
        elif getattr(ext, "dtype", None) is not None and ext.dtype.name != "resource":
            param_shapes[pname] = (list(ext.shape), ext.dtype)
    fetches = [t.op.name for t in graph.outputs]
    fetches += [op.name for op in graph.control_outputs if op.name not in fetches]
    t0 = time.perf_counter()
    meta = dict(meta)
    meta["convert_seconds"] = 0.0
    g = opgraph_from_tf(graph, gd, name, param_shapes, meta,
                        tags=tagger.tags if tagger and tagger.layer_of else None)
    g.meta["convert_seconds"] = round(time.perf_counter() - t0, 3)
    return Traced(graph=g, graph_def=gd, captures=captures, feeds=feeds, fetches=fetches)


# ------------------------------------------------------------------ other sources
def _trace_saved_model(path: Path, mode, batch, name) -> Traced:
    tf = import_tf()
    if mode != "infer":
        raise ModelImportError(f"{path}: a SavedModel holds no training step; use --mode infer "
                           "(or import the Keras model with module:function)")
    try:
        loaded = tf.saved_model.load(str(path))
        sig = loaded.signatures["serving_default"]
    except Exception as e:
        raise ModelImportError(f"{path}: cannot load SavedModel ({type(e).__name__}: {_first_line(e)})") from None
    specs, feeds = [], {}
    rng = np.random.default_rng(0)
    _, kwspecs = sig.structured_input_signature
    for i, (k, s) in enumerate(sorted(kwspecs.items())):
        shape = _fix_batch(str(path), f"input {k!r}", s.shape.as_list(), batch)
        specs.append((k, tf.TensorSpec(shape, s.dtype, name=_placeholder_name(k, i, "input"))))
        feeds[specs[-1][1].name] = _sample(rng, shape, s.dtype)

    # Trace a wrapper so shapes are static, then inline the signature's call.
    def fwd(*args):
        return sig(**{k: a for (k, _), a in zip(specs, args)})

    cf = tf.function(fwd, autograph=False).get_concrete_function(*[s for _, s in specs])
    from tensorflow.python.framework.convert_to_constants import _run_inline_graph_optimization

    gd = _run_inline_graph_optimization(cf, lower_control_flow=False, aggressive_inlining=True)
    return _from_graph_def(gd, name, {"source": "saved_model", "mode": "infer",
                                       "tf_version": tf.__version__}, feeds,
                           captured=cf.graph.captures, variables=list(loaded.variables))


def _trace_graph_def_file(path: Path, batch, name) -> Traced:
    tf = import_tf()
    from google.protobuf import text_format

    gd = tf.compat.v1.GraphDef()
    try:
        if path.suffix == ".pbtxt":
            text_format.Parse(path.read_text(), gd)
        else:
            gd.ParseFromString(path.read_bytes())
    except FileNotFoundError:
        raise ModelImportError(f"{path}: no such file") from None
    except Exception as e:
        raise ModelImportError(f"{path}: not a GraphDef ({type(e).__name__}: {_first_line(e)})") from None
    feeds = {}
    rng = np.random.default_rng(0)
    for n in gd.node:
        if n.op == "Placeholder" and n.attr["dtype"].type != tf.resource.as_datatype_enum:
            dims = [d.size for d in n.attr["shape"].shape.dim]
            if n.attr["shape"].shape.unknown_rank:
                raise ModelImportError(f"{path}: placeholder {n.name!r} has an unknown rank")
            fixed = _fix_batch(str(path), f"placeholder {n.name!r}",
                               [None if d < 0 else d for d in dims], batch)
            for d, v in zip(n.attr["shape"].shape.dim, fixed):
                d.size = v
            feeds[n.name] = _sample(rng, fixed, tf.as_dtype(n.attr["dtype"].type))
    return _from_graph_def(gd, name, {"source": "graph_def", "mode": "as-is",
                                       "tf_version": tf.__version__}, feeds)


def _from_graph_def(gd, name, meta, feeds, captured=(), variables=()) -> Traced:
    tf = import_tf()
    names = {n.name for n in gd.node}
    by_handle = {id(getattr(v, "handle", None)): v for v in variables}
    captures, param_shapes = [], {}
    for ext, internal in captured:
        pname = internal.op.name
        if pname not in names:
            continue
        val = by_handle.get(id(ext), ext)
        captures.append((pname, val))
        if val is not ext or ext.dtype != tf.resource:
            param_shapes[pname] = (list(val.shape), val.dtype)
    g = tf.Graph()
    try:
        with g.as_default():
            # A GraphDef carries no shapes for resource handles: stand in typed handles for
            # the captured variables (under a scope of their own, so no imported node is
            # renamed) so that shape inference reaches every variable read.
            input_map = {}
            for pname, (shape, dt) in param_shapes.items():
                stand_in = f"placetool_capture/{pname}"
                dtype = tf.as_dtype(dt)
                is_var = isinstance(dict(captures)[pname], tf.Variable)
                input_map[pname + ":0"] = (
                    tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, shared_name=stand_in, name=stand_in)
                    if is_var else tf.compat.v1.placeholder(dtype, shape, name=stand_in))
            tf.graph_util.import_graph_def(gd, input_map=input_map or None, name="")
    except Exception as e:
        raise ModelImportError(f"{name}: TensorFlow rejects the graph ({type(e).__name__}: {_first_line(e)})") from None
    consumed = {i.lstrip("^").split(":")[0] for n in gd.node for i in n.input}
    fetches = [n.name for n in gd.node if n.name not in consumed and n.op not in ("Const", "NoOp")
               and n.name not in feeds and n.name not in param_shapes]
    og = opgraph_from_tf(g, gd, name, param_shapes, meta)
    return Traced(graph=og, graph_def=gd, captures=captures, feeds=feeds, fetches=fetches)
