"""Import TensorFlow / Keras models into :class:`~placetool.costmodel.graph.OpGraph`.

Entry points: :func:`trace` (the traced TF graph plus everything needed to run it) and
:func:`import_graph` (just the OpGraph). TensorFlow is imported lazily, inside them.

Op names are kept one-to-one with what TensorFlow runs. We import the graph exactly as
traced (no Grappler pass) and set ``TF_ENABLE_ONEDNN_OPTS=0`` before TensorFlow loads, so
whoever runs ``Traced.graph_def`` must do the same: run it in a Session whose config has
Grappler off and oneDNN off (:mod:`placetool.costmodel.tf.session` does both); then no op
is renamed, fused or added, and every profiled op name is an OpGraph op name.

The work is split by concern: :mod:`~placetool.costmodel.tf.tracing` traces Keras models,
SavedModels and GraphDef files into a :class:`Traced` step,
:mod:`~placetool.costmodel.tf.convert` turns a TF GraphDef into an OpGraph; this module
holds the entry points, the record of how a graph was traced and tracing it again.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

from placetool.costmodel.graph import OpGraph

from .convert import CPU_ONLY_PREFIXES, OPAQUE, opgraph_from_tf  # noqa: F401  (re-exported)
from .session import import_keras
from .tracing import (  # noqa: F401  (re-exported)
    ModelImportError,
    Traced,
    _call_builder,
    _first_line,
    _trace_graph_def_file,
    _trace_keras,
    _trace_saved_model,
)
from .zoo import ZOO

MODES = ("train", "infer")


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
