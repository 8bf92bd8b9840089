"""Import TensorFlow / Keras models into :class:`~placetool.costmodel.graph.OpGraph`.

Entry points: :func:`trace` (the traced TF graph plus everything needed to run it) and
:func:`import_graph` (just the OpGraph). TensorFlow is imported lazily, inside them.

Op names are kept one-to-one with what TensorFlow runs. We import the graph exactly as
traced (no Grappler pass) and set ``TF_ENABLE_ONEDNN_OPTS=0`` before TensorFlow loads, so
whoever runs ``Traced.graph_def`` must do the same: run it in a Session whose config has
Grappler off and oneDNN off (:mod:`placetool.costmodel.tf.session` does both); then no op
is renamed, fused or added, and every profiled op name is an OpGraph op name.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placetool.costmodel.errors import UserError
from placetool.costmodel.graph import ALL_KINDS, KIND_BITS, OpGraph

from .flops import own_flops, tf_registered_flops
from .session import import_keras, import_tf
from .zoo import ZOO, Built

MODES = ("train", "infer")

#: Ops that run on the host whatever kernels exist (tf.data, Python, summaries, I/O).
CPU_ONLY_PREFIXES = ("Iterator", "MakeIterator", "AnonymousIterator", "OptionalGetValue",
                     "PyFunc", "EagerPyFunc", "Write", "Summary", "ScalarSummary",
                     "HistogramSummary", "ImageSummary", "AudioSummary", "MergeSummary",
                     "Save", "Restore", "ReadFile", "WriteFile", "Print", "DecodeJpeg",
                     "DecodePng", "Decode", "Encode", "String", "Regex", "Substr")
#: Ops that are function calls or control flow: their bodies are opaque to the importer.
OPAQUE = frozenset("PartitionedCall StatefulPartitionedCall If StatelessIf While "
                   "StatelessWhile Case StatelessCase".split())


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


# ------------------------------------------------------------------ public API
def trace(source, mode: str = "train", batch: int | None = None, optimizer: str = "sgd",
          name: str | None = None, cwd: str | None = None, **kw) -> Traced:
    """Trace one step of SOURCE and import it.

    SOURCE: a zoo name (``placetool.costmodel.tf.zoo.ZOO``), ``module:function`` returning a Keras
    model (imported from folder ``cwd``, default the current directory), a SavedModel directory (infer mode
    only), or a GraphDef file (``.pb`` binary / ``.pbtxt`` text; imported as it is, so
    ``mode`` and ``optimizer`` do not apply). A Keras model object is accepted too.

    mode: ``train`` traces one whole training step (forward, loss, gradients, updates of
    ``optimizer``, any ``keras.optimizers.get`` name) with ``tf.function(jit_compile=False)``
    at a fixed batch; ``infer`` traces the forward pass. ``batch`` fixes the batch
    dimension; it is required where the model leaves it dynamic (a zoo entry has its own
    default). Extra keyword arguments go to the zoo builder (e.g. ``seq_len=20``).

    The graph's ``meta["trace"]`` records the source (kind, source, working directory,
    batch, mode, optimizer, builder options) so that :func:`retrace` can trace it again.

    Raises :class:`~placetool.costmodel.errors.UserError` (one line, naming SOURCE) for sources that
    cannot be imported.
    """
    if mode not in MODES:
        raise ModelImportError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    if batch is not None and (not isinstance(batch, (int, np.integer)) or batch < 1):
        raise ModelImportError(f"batch {batch!r}: expected a positive integer")
    if not isinstance(source, str):
        return _trace_keras(source, None, mode, batch, optimizer, name or "model")
    return _trace_source(source, mode, batch, optimizer, name, kw, cwd or os.getcwd())


def _trace_source(source, mode, batch, optimizer, name, kw, cwd) -> Traced:
    # Keras numbers layer names per process (dense, dense_1, ...): start each build from a
    # clean slate so that the same source always gives the same op names, which profiles
    # and placement files are keyed by.
    keras = import_keras()
    keras.backend.clear_session()
    # what it takes to trace this graph again (``search --verify-top`` runs it for real)
    src = {"source": source, "mode": mode, "batch": batch, "optimizer": optimizer}
    if source in ZOO:
        spec = ZOO[source]
        try:
            built = spec.build(**kw)
        except TypeError as e:
            raise ModelImportError(f"zoo model {source!r}: {e}") from None
        tr = _trace_keras(built, spec, mode, batch or spec.batch, optimizer, name or source)
        tr.graph.meta.update(zoo_doc=spec.doc, n_ops=tr.graph.n_ops)
        src.update(kind="zoo", args=dict(kw), batch=batch or spec.batch)
    else:
        if kw:
            raise ModelImportError(f"{source}: options {sorted(kw)} only apply to zoo models")
        p = Path(source)
        if p.is_dir():
            if not (p / "saved_model.pb").exists() and not (p / "saved_model.pbtxt").exists():
                raise ModelImportError(f"{source}: a directory but not a SavedModel (no saved_model.pb)")
            tr = _trace_saved_model(p, mode, batch, name or p.name)
            src.update(kind="saved_model", source=str(p.resolve()), mode="infer", optimizer=None)
        elif p.suffix in (".pb", ".pbtxt"):
            tr = _trace_graph_def_file(p, batch, name or p.stem)
            src.update(kind="graph_def", source=str(p.resolve()), mode="as-is", optimizer=None)
        elif ":" in source and not p.exists():
            model = _call_builder(source, cwd)
            tr = _trace_keras(model, None, mode, batch, optimizer, name or source)
            src.update(kind="module", cwd=str(Path(cwd).resolve()))
        elif p.exists():
            raise ModelImportError(f"{source}: unknown model file type (expected a SavedModel "
                                   "directory, .pb or .pbtxt)")
        else:
            raise ModelImportError(f"unknown model source {source!r}: not a zoo name "
                                   f"({', '.join(ZOO)}), module:function, SavedModel or GraphDef file")
    if src["kind"] != "zoo":
        src["batch"] = tr.graph.meta.get("batch", batch)
    tr.graph.meta["trace"] = src
    return tr


# ------------------------------------------------------------------ tracing again
def trace_source(graph) -> dict | None:
    """How ``graph`` was traced (``graph.meta["trace"]``), or None if placetool cannot
    trace it again (a synthetic graph, a Keras object passed to :func:`trace`).

    Graph files written before sources were recorded are still understood when they
    are bundled zoo graphs (name = zoo name, batch/mode/optimizer in their meta).
    """
    src = graph.meta.get("trace")
    if isinstance(src, dict) and src.get("kind") in ("zoo", "module", "saved_model", "graph_def"):
        return src
    if graph.name in ZOO and graph.meta.get("zoo_doc"):
        return {"kind": "zoo", "source": graph.name, "args": {}, "batch": graph.meta.get("batch"),
                "mode": graph.meta.get("mode", "train"), "optimizer": graph.meta.get("optimizer", "sgd")}
    return None


#: kinds of recorded source that run or load something the graph file names: a user's
#: module (Python code), a SavedModel or a GraphDef file (a path of the file's choosing)
USER_KINDS = ("module", "saved_model", "graph_def")
TRUST_FLAG = "--trust-graph-source"


def check_retraceable(graph, model: str | None = None, trust: bool = False) -> dict:
    """How ``graph`` will be traced again, checked cheaply (no TensorFlow, no model built,
    nothing imported): a one-line :class:`ModelImportError` naming what is missing otherwise.

    A graph file is data: the model source it records is run again only when it is a
    bundled zoo model, or when the user says so. ``model``: a source named on the command
    line (zoo name, ``module:function`` importable from the current directory, SavedModel
    or GraphDef file), traced with the recorded batch, mode and optimizer and checked
    against the graph by :func:`retrace`. ``trust``: run the source the file records
    (``--trust-graph-source``). Without either, a recorded user source is refused.
    """
    src = trace_source(graph)
    what = f"graph {graph.name!r}"
    if model is not None:
        return _named_source(graph, src, model)
    if src is None:
        raise ModelImportError(f"{what} records no model source to trace and run it again "
                               "(only graphs made by `placetool import` or bundled zoo graphs can be run; "
                               "or name the model with --model)")
    kind, source = src["kind"], str(src["source"])
    if kind == "zoo":
        if source not in ZOO:
            raise ModelImportError(f"{what} was traced from zoo model {source!r}, which this placetool lacks")
        return src
    where = f" in {src.get('cwd')}" if kind == "module" else ""
    if not trust:
        raise ModelImportError(
            f"{what} was traced from {source}{where}; placetool does not run or load a model a graph file "
            f"names: give --model {source if kind != 'module' else source + ' (from its folder)'} to run the "
            f"model you name (checked against the graph), or {TRUST_FLAG} if you trust this file's source")
    if kind in ("saved_model", "graph_def"):
        if not Path(source).exists():
            raise ModelImportError(f"{what} was traced from {source}, which no longer exists")
    else:
        cwd = src.get("cwd") or "."
        if not Path(cwd).is_dir():
            raise ModelImportError(f"{what} was traced from {source} in {cwd}, which no longer exists")
        mod = source.partition(":")[0].split(".")[0]
        if _module_origin(mod, cwd) is None:
            raise ModelImportError(f"{what} was traced from {source} in {cwd}, but module {mod!r} "
                                   "is not there any more")
    return src


def _named_source(graph, src, model: str) -> dict:
    """The recorded trace of ``graph`` with its source replaced by ``model`` (``--model``)."""
    model = str(model).strip()
    src = dict(src or {})
    base = {"mode": src.get("mode") or graph.meta.get("mode", "train"),
            "batch": src.get("batch", graph.meta.get("batch")),
            "optimizer": src.get("optimizer") or graph.meta.get("optimizer", "sgd")}
    if base["mode"] == "as-is":
        base["mode"] = "train"
    if model in ZOO:
        # builder options recorded for the same zoo model still apply
        args = dict(src.get("args") or {}) if src.get("kind") == "zoo" and src.get("source") == model else {}
        return {**base, "kind": "zoo", "source": model, "args": args, "named": True}
    p = Path(model)
    if p.is_dir() or p.suffix in (".pb", ".pbtxt"):
        if not p.exists():
            raise ModelImportError(f"--model {model}: no such file")
        kind = "saved_model" if p.is_dir() else "graph_def"
        return {**base, "kind": kind, "source": str(p.resolve()), "named": True}
    mod, sep, fn = model.partition(":")
    if not sep or not mod or not fn:
        raise ModelImportError(f"--model {model!r}: expected a zoo name ({', '.join(ZOO)}), module:function, "
                               "a SavedModel folder or a .pb/.pbtxt file")
    cwd = os.getcwd()
    if _module_origin(mod.split(".")[0], cwd) is None:
        raise ModelImportError(f"--model {model}: no module {mod.split('.')[0]!r} in {cwd} or installed")
    return {**base, "kind": "module", "source": model, "cwd": cwd, "named": True}


def _module_origin(mod: str, cwd: str) -> str | None:
    """The file (or package folder) that importing top-level module ``mod`` from ``cwd``
    would run, found without running it; None if there is none."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(mod, [str(Path(cwd).resolve())])
    if spec is None:
        try:
            spec = importlib.util.find_spec(mod)  # installed: a top-level name imports nothing to find
        except (ImportError, ValueError):
            spec = None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return spec.origin
    return (list(spec.submodule_search_locations or []) or [mod])[0]


def describe_source(src: dict) -> str:
    """What retracing ``src`` will run or load, for the notice printed before it does:
    the module file it imports, the SavedModel or GraphDef it loads."""
    kind, source = src["kind"], str(src["source"])
    if kind == "module":
        mod = source.partition(":")[0]
        origin = _module_origin(mod.split(".")[0], src.get("cwd") or os.getcwd())
        return f"importing module {mod!r} from {origin} and calling {source.partition(':')[2]}()"
    if kind == "saved_model":
        return f"loading SavedModel {source}"
    if kind == "graph_def":
        return f"loading GraphDef {source}"
    return f"building zoo model {source!r}"


def graph_fingerprint(graph) -> str:
    """A digest of ``graph``'s ops (name and type of each, in name order): a model traced
    again must give the same fingerprint to run placements made for ``graph``."""
    import hashlib

    h = hashlib.sha256()
    for name, typ in sorted(zip(graph.names, graph.op_types)):
        h.update(f"{name}\0{typ}\n".encode())
    return h.hexdigest()[:16]


def retrace(graph, model: str | None = None, trust: bool = False, say=None) -> Traced:
    """Trace ``graph``'s model again (same batch, mode, optimizer, builder options), to run it
    on real devices: the bundled zoo model it records, the ``model`` the user names, or,
    with ``trust``, the user source it records (see :func:`check_retraceable`). ``say``:
    called with one line saying what is imported or loaded, before it is.

    Op names must come out the same. Keras sources do in any process (the session is
    cleared first); a SavedModel's inlined signature numbers some nodes by TF's
    per-process function counter, so it traces the same names only as the first trace
    of a fresh process, as ``placetool import`` and ``placetool search`` each are. A user
    source (named or recorded) must give the graph's own :func:`graph_fingerprint`."""
    src = check_retraceable(graph, model=model, trust=trust)
    if say is not None and (src["kind"] in USER_KINDS or src.get("named")):
        say(f"{describe_source(src)} (" + ("named by --model" if src.get("named") else
                                           f"recorded in graph {graph.name!r}, {TRUST_FLAG}") + ")")
    mode = src.get("mode") or "train"
    if mode == "as-is":
        mode = "train"
    if src["kind"] == "zoo":
        source = src["source"]
    elif src["kind"] == "module":
        source = src["source"]
        if ":" not in source or Path(source).exists():
            raise ModelImportError(f"graph {graph.name!r}: recorded module source {source!r} is not module:function")
    else:  # a path: its kind decides how it is read, whatever its name
        source = str(src["source"])
        if (src["kind"] == "saved_model") != Path(source).is_dir():
            raise ModelImportError(f"graph {graph.name!r}: {source} is not a {src['kind'].replace('_', ' ')}")
    tr = _trace_source(source, mode, src.get("batch"), src.get("optimizer") or "sgd", graph.name,
                       dict(src.get("args") or {}) if src["kind"] == "zoo" else {},
                       src.get("cwd") or os.getcwd())
    named = f"--model {model}" if model is not None else f"tracing {src['source']} again"
    missing = [n for n in graph.names if n not in tr.graph.index]
    if missing:
        raise ModelImportError(f"graph {graph.name!r}: {named} gives other op names "
                               f"(op {missing[0]!r} is gone): " + ("is it the model the graph was imported from?"
                                                                    if model is not None else
                                                                    "was the model changed since it was imported?"))
    if src["kind"] in USER_KINDS or src.get("named"):
        want, got = graph_fingerprint(graph), graph_fingerprint(tr.graph)
        if want != got:
            raise ModelImportError(f"graph {graph.name!r}: {named} gives a different graph (fingerprint {got}, "
                                   f"the graph's is {want}: {tr.graph.n_ops} ops against {graph.n_ops})")
    return tr


def import_graph(source, mode: str = "train", batch: int | None = None,
                 optimizer: str = "sgd", **kw) -> OpGraph:
    """The OpGraph of :func:`trace` (same arguments)."""
    return trace(source, mode=mode, batch=batch, optimizer=optimizer, **kw).graph


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


# ------------------------------------------------------------------ conversion
def opgraph_from_tf(graph, gd, name, param_shapes=None, meta=None, tags=None) -> OpGraph:
    """An OpGraph of ``gd``'s nodes (same order), reading shapes from the tf ``graph``.

    ``param_shapes``: {resource placeholder name: (shape, dtype)} of captured variables.
    ``tags``: {op name: layer index} recorded while tracing (see :class:`_LayerTagger`).
    """
    tf = import_tf()
    from tensorflow.python.framework import kernels

    param_shapes = param_shapes or {}
    nodes = list(gd.node)
    n = len(nodes)
    index = {nd.name: i for i, nd in enumerate(nodes)}
    ops = {op.name: op for op in graph.get_operations()}
    op_types = [nd.op for nd in nodes]

    # tensors: one per output of each op, in op order
    t_first = np.zeros(n + 1, np.int64)
    out_shapes, out_dtypes = [], []
    unknown, unknown_types = 0, set()
    for i, nd in enumerate(nodes):
        op = ops[nd.name]
        shapes, dts = [], []
        for t in op.outputs:
            s = t.shape
            dims = s.as_list() if s.rank is not None else None
            if dims is None or any(d is None for d in dims):
                # data-dependent sizes (e.g. BroadcastGradientArgs' index vectors): count
                # unknown dims as 1, an unknown rank as 0 bytes, and say so in meta
                unknown += 1
                unknown_types.add(nd.op)
                dims = [1 if d is None else d for d in dims] if dims is not None else None
            shapes.append(dims)
            dts.append(t.dtype)
        out_shapes.append(shapes)
        out_dtypes.append(dts)
        t_first[i + 1] = t_first[i] + len(shapes)
    nt = int(t_first[-1])
    tensor_op = np.repeat(np.arange(n, dtype=np.int32), np.diff(t_first))
    tensor_bytes = np.zeros(nt, np.int64)
    for i in range(n):
        for k, (s, dt) in enumerate(zip(out_shapes[i], out_dtypes[i])):
            tensor_bytes[t_first[i] + k] = _tensor_bytes(s, dt)
    out_bytes = np.zeros(n, np.int64)
    np.add.at(out_bytes, tensor_op, tensor_bytes)

    # edges
    e_src, e_dst, e_t = [], [], []
    seen = set()
    uf = _UnionFind(n)
    for j, nd in enumerate(nodes):
        for inp in nd.input:
            if inp.startswith("^"):
                src = index[inp[1:]]
                key = (src, j, -1)
                t = -1
            else:
                nm, _, k = inp.partition(":")
                src = index[nm]
                t = int(t_first[src]) + (int(k) if k else 0)
                key = (src, j, t)
                if out_dtypes[src][t - int(t_first[src])] == tf.resource:
                    uf.union(src, j)  # TF places resource consumers with the resource
            if key in seen:
                continue
            seen.add(key)
            e_src.append(src)
            e_dst.append(j)
            e_t.append(t)
        cls = nd.attr["_class"].list.s if "_class" in nd.attr else []
        for c in cls:
            c = c.decode() if isinstance(c, bytes) else c
            if c.startswith("loc:@") and c[5:] in index:
                uf.union(index[c[5:]], j)

    # per-op facts
    gpu_ok: dict[str, bool] = {}
    flops = np.zeros(n, np.float64)
    param_bytes = np.zeros(n, np.int64)
    allowed = np.full(n, ALL_KINDS, np.uint8)
    opaque = []
    for i, nd in enumerate(nodes):
        op = ops[nd.name]
        in_shapes = [_shape_list(t) for t in op.inputs]
        attrs = {k: _attr_value(nd.attr[k]) for k in ("transpose_a", "transpose_b", "adj_x", "adj_y")
                 if k in nd.attr}
        f = own_flops(nd.op, out_shapes[i], in_shapes, attrs)
        if f is None:
            f = tf_registered_flops(graph, nd)
        flops[i] = max(0.0, f or 0.0)
        if nd.name in param_shapes:
            s, dt = param_shapes[nd.name]
            param_bytes[i] = _tensor_bytes(s, tf.as_dtype(dt))
        elif nd.op in ("VarHandleOp", "VariableV2", "Variable"):
            s = [d.size for d in nd.attr["shape"].shape.dim]
            param_bytes[i] = _tensor_bytes(s if all(d >= 0 for d in s) else None,
                                           tf.as_dtype(nd.attr["dtype"].type))
        if nd.op not in gpu_ok:
            kl = kernels.get_registered_kernels_for_op(nd.op).kernel
            gpu_ok[nd.op] = any(k.device_type in ("GPU", "DEFAULT") for k in kl) or not kl
        cpu_only = (not gpu_ok[nd.op] or nd.op.startswith(CPU_ONLY_PREFIXES)
                    or "Dataset" in nd.op
                    or any(dt == tf.string for dt in out_dtypes[i])
                    or any(t.dtype == tf.string for t in op.inputs))
        # sources and pass-throughs of strings have GPU kernels (host memory): not pinned
        if cpu_only and nd.op not in ("Placeholder", "Const", "Identity", "NoOp"):
            allowed[i] = KIND_BITS["cpu"]
        if nd.op in OPAQUE:
            opaque.append(nd.name)
    group = np.array([uf.find(i) for i in range(n)], np.int64)

    meta = dict(meta or {})
    meta.update({"unknown_shapes": unknown, "unknown_shape_op_types": sorted(unknown_types),
                 "opaque_ops": opaque[:50], "n_opaque_ops": len(opaque)})
    layer = None
    if tags is not None:
        layer = _layers_from_tags([nd.name for nd in nodes], tags, group,
                                  np.asarray(e_src, np.int64), np.asarray(e_dst, np.int64))
    g = OpGraph.from_arrays(
        name, [nd.name for nd in nodes], op_types, out_bytes,
        np.asarray(e_src, np.int32), np.asarray(e_dst, np.int32),
        edge_tensor=np.asarray(e_t, np.int32), tensor_op=tensor_op, tensor_bytes=tensor_bytes,
        param_bytes=param_bytes, flops=flops, group=group, allowed=allowed, layer=layer,
        meta=meta,
    )
    return g


def _shape_list(t):
    s = t.shape
    if s.rank is None:
        return None
    d = s.as_list()
    return None if any(x is None for x in d) else d


def _attr_value(a):
    which = a.WhichOneof("value")
    return getattr(a, which) if which else None


def _tensor_bytes(shape, dtype) -> int:
    """elements x dtype size; resource/variant handles count 0, strings 8 bytes each."""
    if shape is None:
        return 0
    name = dtype.name
    if name in ("resource", "variant"):
        return 0
    size = 8 if name == "string" else dtype.size
    return int(np.prod(shape, dtype=np.int64)) * int(size)


class _UnionFind:
    def __init__(self, n):
        self.p = list(range(n))

    def find(self, x):
        p = self.p
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return x

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)


def _layers_from_tags(names, tags, group, src, dst) -> np.ndarray:
    """Layer index per op: recorded forward tags, gradients by name, then neighbours.

    1. ops created inside a tagged layer's ``call`` carry its index;
    2. ``gradient_tape/X/...`` ops take the tag of the forward op ``X/...`` they
       differentiate (longest matching name prefix);
    3. a group takes the tag most common among its tagged ops (variables with their
       readers and updates);
    4. remaining ops take the most common tag among tagged neighbours, repeatedly.
    """
    n = len(names)
    layer = np.full(n, -1, np.int32)
    fwd = {}
    for i, nm in enumerate(names):
        if nm in tags:
            layer[i] = tags[nm]
            fwd[nm] = tags[nm]
    scope: dict[str, int] = {}
    for nm, t in fwd.items():
        parts = nm.split("/")
        for k in range(1, len(parts)):
            s = "/".join(parts[:k])
            if scope.get(s, t) != t:
                scope[s] = -2  # ambiguous scope (shared by several layers)
            else:
                scope[s] = t
    for i, nm in enumerate(names):
        if layer[i] >= 0 or not nm.startswith("gradient_tape/"):
            continue
        parts = nm[len("gradient_tape/"):].split("/")
        for k in range(len(parts), 0, -1):
            s = "/".join(parts[:k])
            t = fwd.get(s, scope.get(s, -1))
            if t >= 0:
                layer[i] = t
                break
            if t == -2:
                break
    _group_vote(layer, group, only_untagged=True)
    for _ in range(1000):
        if not _neighbour_vote(layer, src, dst):
            break
    _group_vote(layer, group, only_untagged=False)  # one tag per group
    if (layer >= 0).any():
        layer[layer < 0] = 0  # ops connected to nothing tagged (unused constants)
    return layer


def _majority(keys, labels):
    """For each distinct key, its most common label: (unique keys, labels)."""
    pairs, counts = np.unique(np.stack([keys, labels]), axis=1, return_counts=True)
    order = np.lexsort((-counts, pairs[0]))
    pk = pairs[0][order]
    first = np.r_[True, pk[1:] != pk[:-1]]
    return pk[first], pairs[1][order][first]


def _group_vote(layer, group, only_untagged):
    tagged = layer >= 0
    if not tagged.any():
        return
    g, best = _majority(group[tagged], layer[tagged])
    gl = np.full(int(group.max()) + 1, -1, np.int64)
    gl[g] = best
    fill = (gl[group] >= 0) & (~tagged if only_untagged else True)
    layer[fill] = gl[group[fill]]


def _neighbour_vote(layer, src, dst) -> bool:
    untagged = layer < 0
    if not untagged.any() or not (layer >= 0).any():
        return False
    a = np.concatenate([src, dst])
    b = np.concatenate([dst, src])
    m = untagged[a] & (layer[b] >= 0)
    if not m.any():
        return False
    ops, best = _majority(a[m], layer[b[m]])
    layer[ops] = best
    return True
