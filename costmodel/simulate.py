"""CostModel: the Python face of the compiled simulator.

>>> from placetool.costmodel import CostModel, synthetic, presets
>>> cm = CostModel(synthetic.layered(200, seed=0), presets.load_cluster("k80x2"))
>>> r = cm.simulate(cm.single_device(1))
>>> r.feasible and r.step_time_us > 0
True
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np

from . import engine
from .cluster import check_device_count
from .engine import workers_kernel
from .placement import Placement, PlacementError
from .procs import run_shares
from .profile import op_time_matrix


@dataclass
class Trace:
    """Start/end of every op and transfer (µs) of one simulated placement.

    ``x_task[x]`` holds transfer x's send task (start, end) on its source and receive
    task (start, end) on its destination; NaN where that stage costs nothing.
    """

    placement: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    x_tensor: np.ndarray
    x_src: np.ndarray
    x_dst: np.ndarray
    x_start: np.ndarray
    x_end: np.ndarray
    x_task: np.ndarray
    #: the op its device started before each op, -1 for a device's first (the devices'
    #: orders, as the simulator ran them)
    op_prev: np.ndarray

    @property
    def n_transfers(self) -> int:
        return len(self.x_tensor)

    def tasks(self) -> list[tuple[str, int, int, float, float]]:
        """The send and receive tasks that ran: (kind "send" or "recv", transfer, device, start, end)."""
        out = []
        for x in range(self.n_transfers):
            for k, kind, dev in ((0, "send", self.x_src[x]), (2, "recv", self.x_dst[x])):
                if not np.isnan(self.x_task[x, k]):
                    out.append((kind, x, int(dev), float(self.x_task[x, k]), float(self.x_task[x, k + 1])))
        return out

    def to_chrome(self, graph, cluster) -> dict:
        """Chrome trace-event JSON (Perfetto, chrome://tracing); see :mod:`placetool.costmodel.trace`."""
        from .trace import chrome_trace

        return chrome_trace(self, graph, cluster)

    def plot(self, graph, cluster, path, title=None, lower_bound_us=None, fmt=None, dpi=200) -> None:
        """A Gantt chart (PNG, PDF or SVG); see :func:`placetool.costmodel.trace.gantt`."""
        from .trace import gantt

        gantt(self, graph, cluster, path, title=title, lower_bound_us=lower_bound_us, fmt=fmt, dpi=dpi)


@dataclass
class SimResult:
    """One simulated placement."""

    step_time_us: float
    feasible: bool
    reason: str | None
    busy_us: np.ndarray
    peak_memory_bytes: np.ndarray
    device_names: list[str] = field(default_factory=list)
    trace: Trace | None = None

    def to_dict(self) -> dict:
        return {
            "step_time_us": float(self.step_time_us),
            "feasible": bool(self.feasible),
            "reason": self.reason,
            "busy_us": {n: float(b) for n, b in zip(self.device_names, self.busy_us)},
            "peak_memory_bytes": {n: int(b) for n, b in zip(self.device_names, self.peak_memory_bytes)},
        }


@dataclass
class BatchResult:
    """Many simulated placements: arrays with one row per placement."""

    step_time_us: np.ndarray
    feasible: np.ndarray
    busy_us: np.ndarray
    peak_memory_bytes: np.ndarray


#: the least ops a thread's share of a batch simulates (rows x ops) for the batch to wake
#: it: waking a pool thread costs about 60-150 µs a call, as long as simulating ~1,000 ops
MIN_OPS_PER_THREAD = 4000


class CostModel:
    """A graph on a cluster with op times ``T[op, device]``: scores placements.

    ``op_times`` (an ops x devices array, µs) overrides the profile and roofline.
    """

    def __init__(self, graph, cluster, profile=None, op_times=None):
        check_device_count(cluster.n_devices, f"cluster {cluster.name!r}")
        self.graph = graph
        self.cluster = cluster
        if op_times is not None:
            T = np.array(op_times, dtype=np.float64)
            if T.shape != (graph.n_ops, cluster.n_devices):
                raise ValueError(f"op_times has shape {T.shape}, expected ({graph.n_ops}, {cluster.n_devices})")
            if np.any(np.isnan(T)) or np.any(T < 0):
                raise ValueError("op_times must be >= 0 (inf where an op has no kernel)")
            from .profile import kernel_mask

            T = np.where(kernel_mask(graph, cluster), T, np.inf)
        else:
            T = op_time_matrix(graph, cluster, profile)
        self.T = np.ascontiguousarray(T)
        self.capacity = cluster.memory_bytes
        self.net = engine.make_net(graph, cluster, self.T)
        #: links.send "workers": TensorFlow's run queue (engine/workers_kernel.py), not the event engine
        self.workers = cluster.link_send == "workers"
        if self.workers:
            from .workers import device_costs

            self._wk = workers_kernel.graph_arrays(graph)
            self._wk_links = (cluster.latency_us, cluster.bandwidth_bytes_per_us,
                              device_costs(cluster, cluster.n_devices))
        self._param_bytes = np.ascontiguousarray(graph.param_bytes, np.int64)
        self._local = threading.local()  # one engine workspace per thread
        # group -> device-kind mask, and which devices each group may use
        self.group_device_ok = (graph.group_allowed[:, None] & cluster.kind_mask[None, :]) != 0
        self._op_group_first = np.ascontiguousarray(graph.group_first[graph.group], np.intp)

    @property
    def n_devices(self) -> int:
        return self.cluster.n_devices

    def __getstate__(self):  # a thread-local workspace does not pickle; each process makes its own
        d = self.__dict__.copy()
        d.pop("_local", None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._local = threading.local()

    def work(self) -> engine.Work:
        """This thread's engine workspace (allocated on first use, then reused)."""
        w = getattr(self._local, "work", None)
        if w is None:
            w = self._local.work = engine.work_for(self.net)
        return w

    # ----------------------------------------------------------- placements
    def placement_array(self, placement) -> np.ndarray:
        """Per-op device indices from an op placement, a group assignment or a dict.

        A dict maps op names to device names or indices and must name every op.
        """
        g, cl = self.graph, self.cluster
        if isinstance(placement, dict):
            out = np.empty(g.n_ops, np.int32)
            for i, name in enumerate(g.names):
                if name not in placement:
                    raise PlacementError(f"placement names no device for op {name!r}")
                out[i] = cl.device_index(placement[name])
            extra = set(placement) - set(g.index)
            if extra:
                raise PlacementError(f"placement names op {sorted(extra)[0]!r}, which graph {g.name!r} lacks")
            return out
        p = np.asarray(placement)
        if p.ndim != 1 or p.dtype.kind not in "iu":
            raise PlacementError(f"a placement is a 1-D integer array, got shape {p.shape} dtype {p.dtype}")
        if len(p) == g.n_ops:
            out = np.ascontiguousarray(p, np.int32)
        elif len(p) == g.n_groups:
            out = g.to_placement(p)
        else:
            raise PlacementError(
                f"placement has {len(p)} entries; graph {g.name!r} has {g.n_ops} ops and {g.n_groups} groups"
            )
        bad = np.flatnonzero((out < 0) | (out >= cl.n_devices))
        if bad.size:
            raise PlacementError(
                f"op {g.names[bad[0]]!r}: device index {out[bad[0]]} not in cluster {cl.name!r} "
                f"(0..{cl.n_devices - 1})"
            )
        return out

    def single_device(self, device) -> np.ndarray:
        """Every op on one device (name or index), except groups without a kernel there.

        Those (strings, input pipelines...) go to the first device that can run them, the
        host CPU in the presets, as the CLI's ``single:DEVICE`` does; so the placement is
        always runnable.

        >>> from placetool.costmodel import CostModel, presets
        >>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))
        >>> cm.simulate(cm.single_device("gpu:0")).feasible
        True
        """
        d = self.cluster.device_index(device)
        ok = self.group_device_ok
        return self.graph.to_placement(np.where(ok[:, d], d, np.argmax(ok, axis=1)).astype(np.int32))

    def stranded(self) -> str | None:
        """Why no placement can run at all (a group no device of the cluster can run, e.g.
        ops only a CPU runs on a cluster without one), or None."""
        none = np.flatnonzero(~self.group_device_ok.any(axis=1))
        if not none.size:
            return None
        g = self.graph
        op = g.group_ops[int(none[0])][0]
        return f"group of op {g.names[op]!r} ({g.op_types[op]}) has no device in cluster {self.cluster.name!r} " \
               f"that can run it"

    def violation(self, p: np.ndarray) -> str | None:
        """Why a per-op placement is invalid (split group, op without kernel), or None."""
        g = self.graph
        split, nok = engine.placement_violation(p, self._op_group_first, self.T)
        if split >= 0:
            first = self._op_group_first[split]
            return (f"group of op {g.names[first]!r} is split: op {g.names[split]!r} is on "
                    f"{self.cluster.names[p[split]]}, not {self.cluster.names[p[first]]}")
        if nok >= 0:
            return f"op {g.names[nok]!r} ({g.op_types[nok]}) has no kernel on {self.cluster.names[p[nok]]}"
        return None

    # ----------------------------------------------------------- simulation
    def simulate(self, placement, trace: bool = False) -> SimResult:
        """Simulate one placement (see :meth:`placement_array` for accepted forms)."""
        p = self.placement_array(placement)
        g, D = self.graph, self.n_devices
        names = self.cluster.names
        reason = self.violation(p)
        if reason is not None:
            return SimResult(np.inf, False, reason, np.zeros(D), np.zeros(D, np.int64), names)
        if self.workers:
            return self._simulate_workers(p, trace)
        w = self.work()
        if trace:
            w.x_task[:] = np.nan  # stages that cost nothing stay NaN
        ms, nx = engine.simulate_full(self.net, w, p, bool(trace))
        busy = w.busy.copy()
        peak = engine.device_peak(w.livepeak, p, self._param_bytes)
        reason = self._memory_reason(peak)
        tr = None
        if trace:
            tr = Trace(p, w.op_start[: g.n_ops].copy(), w.op_end[: g.n_ops].copy(), w.x_tensor[:nx].astype(np.int64),
                       w.x_src[:nx].astype(np.int64), w.x_dst[:nx].astype(np.int64), w.x_start[:nx].copy(),
                       w.x_end[:nx].copy(), w.x_task[:nx].copy(), op_prev=w.op_prev[: g.n_ops].astype(np.int64))
        return SimResult(float(ms), reason is None, reason, busy, peak, names, tr)

    def simulate_batch(self, placements) -> BatchResult:
        """Simulate many per-op placements (or group assignments), in parallel across cores:
        rows are shared among up to ``numba.get_num_threads()`` threads, each with its own
        workspace, as long as each share simulates ``MIN_OPS_PER_THREAD`` ops or more.

        Invalid rows (split group, op without kernel) get ``inf`` and ``feasible=False``;
        rows over memory keep their simulated time and get ``feasible=False``.
        """
        P = np.asarray(placements)
        g, D = self.graph, self.n_devices
        if P.ndim != 2:
            raise PlacementError(f"simulate_batch expects a 2-D array, got shape {P.shape}")
        # group assignments (what search scores) are checked before they are spread over
        # the ops, and cannot split a group
        per_group = P.shape[1] == g.n_groups and P.shape[1] != g.n_ops
        if P.shape[1] != g.n_ops and not per_group:
            raise PlacementError(f"placements have {P.shape[1]} columns; graph has {g.n_ops} ops, {g.n_groups} groups")
        if P.size and (P.min() < 0 or P.max() >= D):
            raise PlacementError(f"placements hold device indices outside 0..{D - 1}")
        P = np.ascontiguousarray(P[:, g.group] if per_group else P, np.int32)
        B = P.shape[0]
        step = np.empty(B)
        busy = np.zeros((B, D))
        peak = np.zeros((B, D), np.int64)
        # as many threads as have a share worth waking them for
        k = min(B, numba.get_num_threads(), max(1, B * g.n_ops // MIN_OPS_PER_THREAD))
        if B and self.workers:
            def share(t):
                for r in range(t, B, k):
                    step[r], busy[r], peak[r] = self._run_workers(P[r])[1:4]
            run_shares(k, share)
        elif B:
            def share(t):  # rows t, t + k, ... on this thread's workspace
                engine.simulate_rows(self.net, self.work(), P, self._param_bytes, step, busy, peak, t, k)

            run_shares(k, share)
        if not per_group:
            step[np.any(P != P[:, self._op_group_first], axis=1)] = np.inf  # a split group
        feasible = np.isfinite(step) & np.all(peak <= self.capacity[None, :], axis=1)
        return BatchResult(step, feasible, busy, peak)

    def _run_workers(self, p):
        """The workers kernel on per-op placement ``p``: (its arrays, step, busy, peak)."""
        op_start, op_end, busy, live, *xs = workers_kernel.run_arrays(
            self._wk, self.T[np.arange(self.graph.n_ops), p], p, *self._wk_links)
        peak = live + np.bincount(p, weights=self._param_bytes, minlength=self.n_devices).astype(np.int64)
        return (op_start, op_end, *xs), float(op_end.max(initial=0.0)), busy, peak

    def _simulate_workers(self, p, trace: bool) -> SimResult:
        (op_start, op_end, x_prod, x_tensor, x_dst, _, x_resp, x_arr), ms, busy, peak = self._run_workers(p)
        reason = self._memory_reason(peak)
        tr = None
        if trace:
            data = x_tensor >= 0  # a control edge's empty message carries no tensor
            prev = np.full(len(p), -1, np.int64)
            for d in range(self.n_devices):
                on = np.flatnonzero(p == d)
                order = on[np.lexsort((op_end[on], op_start[on]))]
                prev[order[1:]] = order[:-1]
            nx = int(data.sum())
            tr = Trace(p, op_start, op_end, x_tensor[data], p[x_prod[data]].astype(np.int64), x_dst[data],
                       x_resp[data], x_arr[data], np.full((nx, 4), np.nan), op_prev=prev)
        return SimResult(ms, reason is None, reason, busy, peak, self.cluster.names, tr)

    def _memory_reason(self, peak) -> str | None:
        over = peak - self.capacity
        if np.any(over > 0):
            d = int(np.argmax(over))
            return (f"out of memory on {self.cluster.names[d]}: peak {int(peak[d]):,} bytes > "
                    f"capacity {int(self.capacity[d]):,} by {int(over[d]):,}")
        return None

    # ------------------------------------------------------------- bounds
    def lower_bound_us(self) -> float:
        """max(critical path on the fastest devices with free communication,
        total work on the fastest devices / number of devices)."""
        g = self.graph
        if g.n_ops == 0:
            return 0.0
        fastest = self.T.min(axis=1)
        cp = engine.critical_path(g.topo_order, fastest, *g.successors)
        return float(max(cp, fastest.sum() / self.n_devices))

    # ----------------------------------------------------------- files
    def placement_to_json(self, p, step_time_us=None, extra=None, spec=None) -> dict:
        """The placement file as a dict (see :class:`~placetool.costmodel.placement.Placement`)."""
        return Placement.from_array(self.graph, self.cluster, self.placement_array(p), step_time_us,
                                    spec=spec, extra=extra).to_dict()

    def load_placement(self, path) -> np.ndarray:
        """Read a placement JSON file and check it matches this graph and cluster."""
        return Placement.load(path).to_array(self.graph, self.cluster, source=str(Path(path)))
