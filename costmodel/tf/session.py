"""The one place placetool imports TensorFlow and prepares a traced step to run.

- :func:`import_tf` sets ``TF_ENABLE_ONEDNN_OPTS=0`` and quiet log levels *before*
  TensorFlow loads (oneDNN's graph rewrites rename and fuse ops, so profiled op names
  would no longer be graph op names), mutes TF's start-up chatter, and turns a missing
  TensorFlow into one clear line (:class:`TensorFlowMissing`, exit 2 from the CLI).
- :func:`session_config`: a TF1 Session config with soft placement and Grappler off, so
  every op runs where the placement says, under the name it was imported with.
- :func:`runnable_graph_def`: a traced step (:class:`~placetool.costmodel.tf.importer.Traced`)
  made runnable in a Session: captured variables become ``VarHandleOp`` nodes of the same
  name, captured constants (and, if asked, the step's input placeholders) ``Const`` nodes.

Every other module under ``costmodel/tf/`` gets TensorFlow from here.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

from placetool.costmodel.errors import UserError

#: The message for a command that needs TensorFlow where it is not installed.
TF_MISSING = 'TensorFlow is not installed: pip install "placetool[tf]"'


class TensorFlowMissing(UserError):
    """TensorFlow (the ``placetool[tf]`` extra) is not installed."""

    def __init__(self):
        super().__init__(TF_MISSING)


def require_tf() -> None:
    """Raise :class:`TensorFlowMissing` now, before any work, if TensorFlow is not installed
    (cheap: finds the package without importing it)."""
    if sys.modules.get("tensorflow") is not None:
        return
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TensorFlowMissing()


def import_tf():
    """TensorFlow, imported with oneDNN graph rewrites off and its start-up logs muted."""
    was = os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        if was != "0" and not getattr(import_tf, "warned", False):
            import warnings

            import_tf.warned = True
            warnings.warn("TensorFlow was imported before TF_ENABLE_ONEDNN_OPTS=0 was set: "
                          "oneDNN may rename/fuse ops at run time", stacklevel=2)
        return tf
    # TF's C++ runtime logs CUDA probing on stderr before any log level applies; keep a
    # user's terminal to our own one-line messages by muting fd 2 while TF starts.
    with _muted_stderr():
        try:
            import tensorflow as tf
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] == "tensorflow":
                raise TensorFlowMissing() from None
            raise
        tf.config.list_physical_devices()
    return tf


def import_keras():
    """Keras, after :func:`import_tf` (Keras loads TensorFlow as its backend)."""
    import_tf()
    import keras

    return keras


def onednn_setting() -> str:
    """What ``TF_ENABLE_ONEDNN_OPTS`` is in this process ('' if unset)."""
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "")


class _muted_stderr:
    def __enter__(self):
        try:
            sys.stderr.flush()
            self.saved = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        except OSError:
            self.saved = None
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            os.dup2(self.saved, 2)
            os.close(self.saved)
        return False


def session_config(timeout_s: float | None = None, threads: int | None = None, isolate: bool = False):
    """A ``tf.compat.v1.ConfigProto``: soft placement off, Grappler and graph rewrites off.

    ``timeout_s``: per-operation timeout; ``threads``: intra- and inter-op pool sizes;
    ``isolate``: fresh resources (variables) per session on the workers, so measuring one
    placement after another never shares state.
    """
    tf = import_tf()
    from tensorflow.core.protobuf import rewriter_config_pb2

    tf1 = tf.compat.v1
    cfg = tf1.ConfigProto(allow_soft_placement=False)
    if threads:
        cfg.intra_op_parallelism_threads = int(threads)
        cfg.inter_op_parallelism_threads = int(threads)
    if timeout_s is not None:
        cfg.operation_timeout_in_ms = int(timeout_s * 1000)
    if isolate:
        cfg.isolate_session_state = True
    rw = cfg.graph_options.rewrite_options
    rw.disable_meta_optimizer = True
    rw.remapping = rewriter_config_pb2.RewriterConfig.OFF
    oo = cfg.graph_options.optimizer_options
    oo.opt_level = tf1.OptimizerOptions.L0
    oo.do_constant_folding = False
    oo.do_common_subexpression_elimination = False
    oo.do_function_inlining = False
    return cfg


def runnable_graph_def(traced, feeds_as_const: bool = False):
    """``(graph_def, init_values)``: ``traced.graph_def`` made runnable in a TF1 Session.

    Every captured-variable ``Placeholder`` becomes a ``VarHandleOp`` of the same name
    (``shared_name`` = that name, the variable's dtype and shape); every captured constant
    becomes a ``Const`` holding its value; with ``feeds_as_const`` the step's own input
    placeholders (``traced.feeds``) become ``Const`` nodes of their sample values too, so a
    step moves no data from the client. Node names and order are unchanged, so
    ``traced.graph.names`` still match one-to-one. ``init_values``: {VarHandleOp name:
    numpy value} to assign before the first step. Call it eagerly (outside any
    ``tf.Graph`` context): it reads variable values.
    """
    tf = import_tf()
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(traced.graph_def)
    caps = dict(traced.captures)
    feeds = {_strip(k): v for k, v in (traced.feeds or {}).items()} if feeds_as_const else {}
    init = {}
    for nd in gd.node:
        if nd.name in caps:
            v = caps[nd.name]
            if isinstance(v, tf.Variable):
                _reset(nd)
                nd.op = "VarHandleOp"
                nd.attr["dtype"].type = v.dtype.as_datatype_enum
                nd.attr["shape"].shape.CopyFrom(tf.TensorShape(v.shape).as_proto())
                nd.attr["container"].s = b""
                nd.attr["shared_name"].s = nd.name.encode()
                init[nd.name] = v.numpy()
                continue
            if getattr(v, "dtype", None) == tf.resource:
                raise UserError(f"captured input {nd.name!r} is a {type(v).__name__} that cannot be "
                               "rebuilt in a Session")
            _to_const(tf, nd, np.asarray(v.numpy()) if hasattr(v, "numpy") else np.asarray(v))
        elif nd.name in feeds:
            _to_const(tf, nd, np.asarray(feeds[nd.name]))
    return gd, init


def _strip(name: str) -> str:
    return name.split(":")[0].lstrip("^")


def _reset(nd) -> None:
    name, device = nd.name, nd.device
    nd.Clear()
    nd.name, nd.device = name, device


def _to_const(tf, nd, arr: np.ndarray) -> None:
    _reset(nd)
    nd.op = "Const"
    nd.attr["dtype"].type = tf.as_dtype(arr.dtype).as_datatype_enum
    nd.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(arr))
