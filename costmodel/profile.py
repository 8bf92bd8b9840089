"""Op-cost tables: turn (graph, cluster, profile) into ``T[op, device]`` in microseconds.

Sources, best first: a measured profile (per-op medians, then per-op-type fits; see
:mod:`placetool.costmodel.calibration`), then the device's datasheet roofline::

    T = launch_overhead_us + max(flops / peak_flops_per_us,
                                 (in_bytes + out_bytes) / memory_bandwidth_bytes_per_us)

An op that may not run on a device's kind (a pinned op) gets ``inf`` there.
"""

from __future__ import annotations

import numpy as np


def roofline_times(graph, cluster) -> np.ndarray:
    """(ops x devices) op times from each device's datasheet roofline."""
    flops = graph.flops[:, None]
    moved = (graph.in_bytes + graph.out_bytes).astype(np.float64)[:, None]
    peak = np.array([d.peak_flops_per_us for d in cluster.devices])[None, :]
    bw = np.array([d.memory_bandwidth_bytes_per_us for d in cluster.devices])[None, :]
    launch = np.array([d.launch_overhead_us for d in cluster.devices])[None, :]
    return launch + np.maximum(flops / peak, moved / bw)


def kernel_mask(graph, cluster) -> np.ndarray:
    """(ops x devices) bool: True where the op has a kernel for the device's kind."""
    return (graph.allowed[:, None] & cluster.kind_mask[None, :]) != 0


def op_time_matrix(graph, cluster, profile=None) -> np.ndarray:
    """``T[op, device]`` in µs: measured, then fitted, then roofline; ``inf`` where no kernel.

    ``profile`` is anything with ``op_times(graph, cluster) -> (ops x devices)`` array
    holding NaN where it knows nothing (see :class:`placetool.costmodel.calibration.Profile`).
    """
    T = roofline_times(graph, cluster)
    if profile is not None:
        measured = np.asarray(profile.op_times(graph, cluster), np.float64)
        if measured.shape != T.shape:
            raise ValueError(f"profile gave op times of shape {measured.shape}, expected {T.shape}")
        known = np.isfinite(measured)
        T = np.where(known, measured, T)
    T = np.where(kernel_mask(graph, cluster), T, np.inf)
    return np.ascontiguousarray(T, np.float64)
