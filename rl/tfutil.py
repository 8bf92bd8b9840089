"""TensorFlow set-up shared by the RL modules: quiet logs, few threads, seeds."""

from __future__ import annotations

import os

_configured = False


def tf(threads: int | None = None):
    """Import TensorFlow (once), keep its logs quiet and its thread pools small.

    Thread counts must be set before TF runs any op; later calls leave them as they are.
    The default of one intra-op thread fits the small policy networks here best and
    leaves the other cores to the batched simulator.
    """
    global _configured
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from placetool.costmodel.tf.session import import_tf

    _tf = import_tf()

    if not _configured:
        n = threads or int(os.environ.get("PLACETOOL_TF_THREADS", "1"))
        try:
            _tf.config.threading.set_intra_op_parallelism_threads(n)
            _tf.config.threading.set_inter_op_parallelism_threads(n)
        except RuntimeError:  # TF already ran ops in this process: keep its settings
            pass
        _tf.get_logger().setLevel("ERROR")  # retracing notices for new graph sizes are expected
        _configured = True
    return _tf


def set_seed(seed: int) -> None:
    """Seed TF's global generator (policies draw samples from stateless seeds anyway)."""
    t = tf()
    t.random.set_seed(int(seed) & 0x7FFFFFFF)
