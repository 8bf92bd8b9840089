"""Identify a testbed's per-message costs from its own traced split steps.

Whole-step times cannot tell a link's latency from the CPU a message costs on either
end; a traced step can. Its ops ran for the times the trace records, so replaying it
with those times under :mod:`placetool.costmodel.workers` (TensorFlow's run queue, one
compute thread per worker) on the links that lone transfers measured leaves the
per-message costs as the only unknowns. :func:`fit_worker_costs` searches them (within
:data:`BOUNDS`, by differential evolution) for the least median |error| of the replayed
spans against the traced ones. The encoding and decoding costs per byte are one figure,
taken on both ends: the spans do not tell them apart.

These costs change from one testbed session to the next (benchmarks/README.md: 17% on
the same recording), so ``calibrate --link-send workers`` identifies them from traced
steps of its own session.

Example: four placements of a small layered graph, traced under known costs (30 µs per
request, 60 per handler, 10 per arrival, 300 µs per MB), are replayed to within 0.1%
by the costs found. The spans alone need not pin down each cost: here they do the arrival
and the per-byte costs, and trade the request against the handler.

>>> import numpy as np
>>> from placetool.costmodel.synthetic import layered
>>> g, rng = layered(60, width=4, seed=0), np.random.default_rng(0)
>>> lat, bw = np.array([[0.0, 80.0], [80.0, 0.0]]), np.full((2, 2), 1500.0)
>>> true = WorkerCosts(request_us=30, handler_us=60, send_us_per_byte=3e-4, arrive_us=10, recv_us_per_byte=3e-4)
>>> op_us = rng.uniform(20, 400, g.n_ops)
>>> steps = [traced_like(g, op_us, (rng.random(g.n_ops) < f).astype(int), lat, bw, true) for f in (0.2, 0.3, 0.4, 0.5)]
>>> fit = fit_worker_costs(steps, lat, bw)
>>> fit.summary()["median_abs_error_pct"] < 0.1, round(fit.costs.arrive_us), round(fit.costs.send_us_per_byte * 1e6)
(True, 10, 275)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .engine import workers_kernel as K
from .workers import WorkerCosts, device_costs

#: the box searched: request, handler, arrival (µs per message), and µs per MB on each end
BOUNDS = {"request_us": (0.0, 150.0), "handler_us": (0.0, 300.0), "arrive_us": (0.0, 150.0),
          "us_per_mb": (0.0, 1000.0)}


@dataclass
class ReplayStep:
    """One traced step, ready to replay: the graph's kernel arrays, each op's traced time
    (0 where it was not traced), the placement, which ops were traced, the traced span."""

    arrays: tuple
    op_us: np.ndarray
    placement: np.ndarray
    traced: np.ndarray
    span_us: float
    label: str = ""
    graph: object = None


def steps_of(rec, steps=None, label: str = "") -> list[ReplayStep]:
    """The traced steps of a :class:`~placetool.costmodel.timeline.Recording` (all, or the
    indices ``steps``) as :class:`ReplayStep`, on its graph as the executor ordered it
    (:meth:`~placetool.costmodel.timeline.Recording.executed_graph`)."""
    g = rec.executed_graph()
    arrays = K.graph_arrays(g)
    p = np.ascontiguousarray(rec.placement, np.int64)
    out = []
    for k in range(len(rec.steps)) if steps is None else steps:
        st = rec.steps[k]
        tr = st.traced
        out.append(ReplayStep(arrays, np.ascontiguousarray(np.where(tr, st.op_us, 0.0)), p, tr, st.span_us,
                              label, g))
    return out


def traced_like(graph, op_us, placement, latency_us, bandwidth, costs: WorkerCosts, label: str = "") -> ReplayStep:
    """A step as a trace of the workers model itself would record it (every op traced):
    known answers for the fit."""
    arrays = K.graph_arrays(graph)
    p = np.ascontiguousarray(placement, np.int64)
    op_us = np.ascontiguousarray(op_us, np.float64)
    tr = np.ones(graph.n_ops, bool)
    start, end = K.run_arrays(arrays, op_us, p, latency_us, bandwidth, device_costs(costs, len(latency_us)))[:2]
    return ReplayStep(arrays, op_us, p, tr, float(end.max() - start.min()), label, graph)


def replay_errors(steps: list[ReplayStep], latency_us, bandwidth, costs: WorkerCosts) -> np.ndarray:
    """Per step, (replayed span - traced span) / traced span, %."""
    c = device_costs(costs, len(latency_us))
    out = np.empty(len(steps))
    for i, s in enumerate(steps):
        start, end = K.run_arrays(s.arrays, s.op_us, s.placement, latency_us, bandwidth, c)[:2]
        out[i] = 100.0 * (float(end[s.traced].max() - start[s.traced].min()) - s.span_us) / s.span_us
    return out


def op_inflation(steps: list[ReplayStep], op_times, dispatch_us=None) -> float:
    """How much longer ``steps``' traced ops ran than ``op_times`` (ops x devices, e.g. a
    profiled CostModel's ``T``) say, time-weighted: sum of traced times over the sum of
    theirs on the devices they ran on, less ``dispatch_us`` (per device: what a profile
    adds to every op for the executor's gaps, which a trace does not record)."""
    T = np.asarray(op_times, np.float64)
    extra = np.zeros(T.shape[1]) if dispatch_us is None else np.asarray(dispatch_us, np.float64)
    traced = profiled = 0.0
    for s in steps:
        i = np.flatnonzero(s.traced)
        d = s.placement[i]
        traced += float(s.op_us[i].sum())
        profiled += float(np.maximum(T[i, d] - extra[d], 0.0).sum())
    return traced / profiled if profiled > 0 else float("nan")


def message_inflation(steps: list[ReplayStep], profiled_us: list, n_devices: int) -> dict:
    """The CPU a message takes from the ops beside it, per device, as op inflation: each
    device's traced op time in each step less its ops' ``profiled_us`` (per step, per op,
    the profile's time on the device it ran on, without the dispatch cost a trace does
    not record), regressed with non-negative least squares on the messages and KiB it
    sent and received (:func:`placetool.costmodel.commfit.transfer_counts`). Returns
    ``{"send_us", "send_us_per_byte", "recv_us", "recv_us_per_byte"}``.

    A replay runs on the traced op times, so the costs it identifies leave out what the
    message work took from inside the ops; a prediction on profiled op times needs both."""
    from .cluster import TRANSFER_COST_KEYS
    from .commfit import transfer_cost_regression, transfer_counts

    X, y = [], []
    for s, prof in zip(steps, profiled_us):
        c = transfer_counts(s.graph, s.placement, n_devices)
        for d in range(n_devices):
            ops = np.flatnonzero(s.traced & (s.placement == d))
            if ops.size:
                X.append(c[d])
                y.append(float(np.sum(s.op_us[ops] - np.asarray(prof)[ops])))
    if not X or not np.any(X):
        return dict.fromkeys(TRANSFER_COST_KEYS, 0.0)
    return transfer_cost_regression(X, y)[0]


def with_inflation(costs: WorkerCosts, inflation: dict) -> WorkerCosts:
    """``costs`` with :func:`message_inflation`'s per-message CPU added: the sender's to
    the handler and its encoding, the receiver's to the arrival and its decoding."""
    return WorkerCosts(request_us=costs.request_us, handler_us=costs.handler_us + inflation["send_us"],
                       send_us_per_byte=costs.send_us_per_byte + inflation["send_us_per_byte"],
                       arrive_us=costs.arrive_us + inflation["recv_us"],
                       recv_us_per_byte=costs.recv_us_per_byte + inflation["recv_us_per_byte"])


@dataclass
class WorkerFit:
    """The identified costs and the replay's error on each step (%)."""

    costs: WorkerCosts
    errors_pct: np.ndarray
    evaluations: int
    labels: list

    def summary(self) -> dict:
        a = np.abs(self.errors_pct)
        return {"costs": asdict(self.costs), "n_steps": int(len(a)), "evaluations": self.evaluations,
                "median_error_pct": float(np.median(self.errors_pct)),
                "median_abs_error_pct": float(np.median(a)), "max_abs_error_pct": float(a.max())}


def _costs(x) -> WorkerCosts:
    r, h, a, k = (max(float(v), 0.0) for v in x)
    return WorkerCosts(request_us=r, handler_us=h, send_us_per_byte=k * 1e-6, arrive_us=a,
                       recv_us_per_byte=k * 1e-6)


def _score(e: np.ndarray) -> float:
    # the median decides; the mean breaks its ties (few steps leave plateaus)
    a = np.abs(e)
    return float(np.median(a) + 1e-3 * a.mean())


def fit_worker_costs(steps: list[ReplayStep], latency_us, bandwidth, bounds: dict | None = None,
                     max_evaluations: int = 1000, seed: int = 0) -> WorkerFit:
    """The per-message costs under which ``steps``, replayed on links of ``latency_us`` +
    bytes / ``bandwidth`` (D x D), match their traced spans best (least median |error|),
    within ``bounds`` (default :data:`BOUNDS`).

    The error is not smooth in the costs (a cost that reorders two tasks moves the span by
    a step), and a local search stops far from the answer; differential evolution over the
    whole box, about ``max_evaluations`` cost points (deterministic for a ``seed``), finds
    costs that replay them: on steps the model itself traced, within a fraction of a %
    (median), though costs that trade against each other (request and handler) may
    land apart from the true ones."""
    from scipy.optimize import differential_evolution

    if not steps:
        raise ValueError("no traced steps to fit the worker costs to")
    lat = np.ascontiguousarray(latency_us, np.float64)
    bw = np.ascontiguousarray(bandwidth, np.float64)
    b = {**BOUNDS, **(bounds or {})}
    box = [tuple(map(float, b[k])) for k in ("request_us", "handler_us", "arrive_us", "us_per_mb")]
    free = [i for i, (lo, hi) in enumerate(box) if hi > lo]
    x = np.array([lo for lo, _ in box])  # pinned costs stay at their bound
    count = [0]

    def score(v) -> float:
        count[0] += 1
        x[free] = v
        return _score(replay_errors(steps, lat, bw, _costs(x)))

    if free:
        popsize = 8  # x the free costs: the cost points per generation
        r = differential_evolution(score, [box[i] for i in free], seed=seed, popsize=popsize,
                                   maxiter=max(max_evaluations // (popsize * len(free)) - 1, 1),
                                   tol=1e-9, polish=False, init="latinhypercube")
        x[free] = r.x
    costs = _costs(np.round(x, 3))
    return WorkerFit(costs, replay_errors(steps, lat, bw, costs), count[0], [s.label for s in steps])
