"""Transfer costs read off traced timelines: what a transfer costs the cores at its two ends.

A whole step cannot tell wire latency from CPU work at either end; a traced split step can.
On each device it shows two kinds of time the device's own ops did not use:

- *op inflation*: its ops ran longer than the same ops on one device (the transfers'
  serialisation, copies and RPC threads shared the core with them);
- *ready gaps*: the device sat idle while its next op had every input (its local inputs
  done, each remote input arrived by the trace's ``RecvTensor`` record). TensorFlow logs
  almost no record for large tensors (75 of 3,911 over 100 KB on the testbed), so an op
  waiting on one is left out: when such a tensor arrived is not seen, and waiting for the sender to
  fall idle is the simulator's ``links.send`` rule, not CPU taken.

Their sum, per device and traced step, is the CPU time transfers took from that device.
:func:`fit_device_costs` regresses it on what the device sent and received (messages and
KiB, counted as the simulator counts transfers: one per tensor and destination), with
non-negative least squares, pooled over every recording given. The four coefficients are
the simulator's device-side transfer costs (``send_us``, ``send_us_per_byte``,
``recv_us``, ``recv_us_per_byte``: docs/simulator.md), and :func:`with_device_costs` puts
them on a cluster whose links keep their measured lone-transfer timings.

Example (a recording made by ``placetool explain --save``)::

    rec = timeline.load("split.timeline.json", graph)
    fit = fit_device_costs([rec])
    fit.params        # {"send_us": .., "send_us_per_byte": .., "recv_us": .., "recv_us_per_byte": ..}
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cluster import TRANSFER_COST_KEYS
from .timeline import TimelineError, input_times

_KB = 1024.0
#: the regressors, in the order of :data:`TRANSFER_COST_KEYS`' coefficients
FEATURES = ("sent", "sent_kb", "received", "received_kb")


@dataclass
class DeviceCostFit:
    """Device-side transfer costs fitted to traced steps (µs, µs per byte)."""

    params: dict
    rows: list = field(default_factory=list)   # per (recording, step, device): what was seen and predicted
    r2: float = float("nan")

    def summary(self) -> dict:
        seen = np.array([r["stolen_us"] for r in self.rows])
        pred = np.array([r["predicted_us"] for r in self.rows])
        res = np.abs(pred - seen) if len(seen) else np.array([np.nan])
        return {"params": dict(self.params), "r2": self.r2, "samples": len(self.rows),
                "median_abs_residual_us": float(np.median(res)),
                "median_stolen_us": float(np.median(seen)) if len(seen) else None}


def transfer_counts(graph, placement, n_devices: int) -> np.ndarray:
    """(D, 4) float64 per device: messages sent, KiB sent, messages received, KiB received,
    over the transfers the simulator makes (one per tensor and destination device)."""
    p = np.asarray(placement, np.int64)
    t = graph.edge_tensor
    cross = (t >= 0) & (p[graph.edge_src] != p[graph.edge_dst])
    out = np.zeros((n_devices, 4))
    if not cross.any():
        return out
    pairs = np.unique(np.stack([t[cross].astype(np.int64), p[graph.edge_dst[cross]]], axis=1), axis=0)
    kb = graph.tensor_bytes[pairs[:, 0]] / _KB
    src = p[graph.tensor_op[pairs[:, 0]]]
    np.add.at(out[:, 0], src, 1.0)
    np.add.at(out[:, 1], src, kb)
    np.add.at(out[:, 2], pairs[:, 1], 1.0)
    np.add.at(out[:, 3], pairs[:, 1], kb)
    return out


def stolen_cpu(rec, step: int, singles: dict) -> list[dict]:
    """Per device of one traced step: op inflation, ready gaps and their sum (µs).

    ``singles``: {device: per-op µs on that device alone} (NaN where unknown; ops without
    a figure count no inflation). The gap before an op with an input the trace has no
    record of (a local op not traced, a remote tensor without ``RecvTensor``) is not counted.
    """
    st = rec.steps[step]
    g, p = rec.graph, np.asarray(rec.placement)
    local, _, _ = input_times(st, g, p)
    arrived = _arrivals(st, g, p)
    out = []
    for d in range(rec.n_devices):
        ops = np.flatnonzero(st.traced & (p == d))
        one = singles.get(d)
        if one is None:
            raise TimelineError(f"no single-device op times for device {d}")
        known = np.isfinite(one[ops])
        inflation = float(np.sum(st.op_us[ops][known] - one[ops][known]))
        order = ops[np.argsort(st.op_start[ops], kind="stable")]
        gaps, free = 0.0, None
        for i in order:
            if free is not None and np.isfinite(arrived[i]) and np.isfinite(local[i]):  # inputs seen
                ready = max(free, local[i], arrived[i])
                gaps += max(float(st.op_start[i]) - ready, 0.0)
            free = st.op_end[i] if free is None else max(free, st.op_end[i])
        out.append({"device": d, "inflation_us": inflation, "gaps_us": gaps, "stolen_us": inflation + gaps})
    return out


def _arrivals(st, graph, p) -> np.ndarray:
    """Per op: when its last remote input was on its device (0 for none; NaN where a data
    input came without a ``RecvTensor`` record; a control edge is there at its producer's end)."""
    traced = {}
    for x in range(st.n_transfers):
        if st.x_producer[x] >= 0:
            key = (int(st.x_producer[x]), int(st.x_dst[x]))
            traced[key] = max(traced.get(key, -np.inf), float(st.x_end[x]))
    out = np.zeros(graph.n_ops)
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        if p[s] == p[d] or not np.isfinite(st.op_end[s]):
            continue
        a = traced.get((s, int(p[d])))
        if a is None:
            a = float(st.op_end[s]) if t < 0 else np.nan
        out[d] = max(out[d], a) if not (np.isnan(a) or np.isnan(out[d])) else np.nan
    return out


def fit_device_costs(recordings, singles=None, labels=None) -> DeviceCostFit:
    """Non-negative least squares of the CPU transfers took from each device
    (:func:`stolen_cpu`) on what it sent and received (:func:`transfer_counts`), pooled
    over every traced step of every recording that splits its graph.

    ``singles``: per recording, {device: per-op µs alone}; default each recording's own
    single-device trace for every device. ``labels``: a name per recording for the rows.
    """
    X, y, rows = [], [], []
    for k, rec in enumerate(recordings):
        one = singles[k] if singles is not None else _own_single(rec)
        counts = transfer_counts(rec.graph, rec.placement, rec.n_devices)
        if not counts.any():
            continue  # one device: nothing to learn about transfers
        for s in range(len(rec.steps)):
            for r in stolen_cpu(rec, s, one):
                c = counts[r["device"]]
                X.append(c)
                y.append(r["stolen_us"])
                rows.append({"graph": rec.graph.name, "label": labels[k] if labels else str(k), "step": s,
                             **r, **dict(zip(FEATURES, map(float, c)))})
    if not rows:
        raise TimelineError("no traced split steps to fit transfer costs to (every recording runs on one device)")
    X, y = np.array(X), np.array(y)
    params, pred = transfer_cost_regression(X, y)
    for r, v in zip(rows, pred):
        r["predicted_us"] = float(v)
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((pred - y) ** 2)) / ss if ss > 0 else float("nan")
    return DeviceCostFit(params, rows, r2)


def transfer_cost_regression(X, y) -> tuple[dict, np.ndarray]:
    """Non-negative least squares of per-device CPU time ``y`` (µs) on the rows ``X`` of
    :func:`transfer_counts` (messages and KiB sent, messages and KiB received): the
    per-message and per-byte costs as ``{"send_us", "send_us_per_byte", "recv_us",
    "recv_us_per_byte"}``, and the fitted values."""
    from scipy.optimize import nnls

    X = np.asarray(X, np.float64).reshape(-1, len(FEATURES))
    coef = nnls(X, np.asarray(y, np.float64))[0]
    params = {"send_us": float(coef[0]), "send_us_per_byte": float(coef[1] / _KB),
              "recv_us": float(coef[2]), "recv_us_per_byte": float(coef[3] / _KB)}
    assert tuple(params) == TRANSFER_COST_KEYS
    return params, X @ coef


def _own_single(rec) -> dict:
    if rec.single_op_us is None:
        raise TimelineError(f"a recording of {rec.graph.name!r} has no single-device trace to measure "
                            "op inflation against (record it with the single-device steps)")
    return {d: rec.single_op_us for d in range(rec.n_devices)}


def with_device_costs(cluster, params: dict, kinds=("cpu",)):
    """``cluster`` (links as lone transfers measured them, no device-side costs) with the
    device-side transfer costs ``params`` on every device of ``kinds``.

    A lone transfer's measured time already holds the CPU at both its ends, so what moves
    onto the devices is taken off the links, per message from the latency and per byte
    from the bandwidth (each never below 10% of what it was): a lone transfer still takes
    what was measured.
    """
    from .calibration import with_transfer_params

    on = np.array([d.kind in kinds for d in cluster.devices])
    off = ~np.eye(cluster.n_devices, dtype=bool)
    lat0 = np.asarray(cluster.latency_us, np.float64)
    per_msg = np.where(on, params["send_us"], 0.0)[:, None] + np.where(on, params["recv_us"], 0.0)[None, :]
    lat = np.where(off, np.maximum(lat0 - per_msg, 0.1 * lat0), 0.0)
    # the per-byte costs come off the bandwidth as they do for a whole-step fit
    return with_transfer_params(cluster, {**params, "latency_us": lat}, kinds)
