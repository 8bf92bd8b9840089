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

from . import kernels
from .errors import UserError, read_json
from .profile import op_time_matrix


class PlacementError(UserError):
    """A placement does not fit the graph or cluster; the message names the op or device."""


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
        """Chrome trace-event JSON (opens in Perfetto or chrome://tracing); one row per
        device, one per used link."""
        ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{graph.name} on {cluster.name}"}}]
        for d, name in enumerate(cluster.names):
            ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": d, "args": {"name": name}})
        for op in np.argsort(self.op_start, kind="stable"):
            ev.append({
                "name": graph.names[op], "cat": graph.op_types[op], "ph": "X", "pid": 0,
                "tid": int(self.placement[op]), "ts": float(self.op_start[op]),
                "dur": float(self.op_end[op] - self.op_start[op]),
                "args": {"op_type": graph.op_types[op]},
            })
        for kind, x, dev, t0, t1 in self.tasks():
            t = int(self.x_tensor[x])
            ev.append({
                "name": f"{kind} {graph.names[graph.tensor_op[t]]}:{int(graph.tensor_output_index[t])}",
                "cat": kind, "ph": "X", "pid": 0, "tid": dev, "ts": t0, "dur": t1 - t0,
                "args": {"bytes": int(graph.tensor_bytes[t]), "src": cluster.names[self.x_src[x]],
                         "dst": cluster.names[self.x_dst[x]]},
            })
        D = cluster.n_devices
        links = sorted({(int(s), int(d)) for s, d in zip(self.x_src, self.x_dst)})
        for s, d in links:
            ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": D + s * D + d,
                       "args": {"name": f"{cluster.names[s]} -> {cluster.names[d]}"}})
        for x in range(self.n_transfers):
            t = int(self.x_tensor[x])
            s, d = int(self.x_src[x]), int(self.x_dst[x])
            ev.append({
                "name": f"{graph.names[graph.tensor_op[t]]}:{int(graph.tensor_output_index[t])}",
                "cat": "transfer", "ph": "X", "pid": 0, "tid": D + s * D + d,
                "ts": float(self.x_start[x]), "dur": float(self.x_end[x] - self.x_start[x]),
                "args": {"bytes": int(graph.tensor_bytes[t])},
            })
        return {"traceEvents": ev, "displayTimeUnit": "ms"}

    def plot(self, graph, cluster, path, title=None) -> None:
        """A per-device Gantt chart (PNG) with transfers on their links."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        D = cluster.n_devices
        links = sorted({(int(s), int(d)) for s, d in zip(self.x_src, self.x_dst)})
        rows = list(cluster.names) + [f"{cluster.names[s]}→{cluster.names[d]}" for s, d in links]
        fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.5))
        cmap = plt.get_cmap("tab20")
        types = sorted(set(graph.op_types))
        colour = {t: cmap(i % 20) for i, t in enumerate(types)}
        for d in range(D):
            ops = np.flatnonzero(self.placement == d)
            if len(ops):
                ax.broken_barh(
                    list(zip(self.op_start[ops], self.op_end[ops] - self.op_start[ops])), (d - 0.4, 0.8),
                    facecolors=[colour[graph.op_types[o]] for o in ops], linewidth=0,
                )
        tasks = self.tasks()
        for d in range(D):  # send / receive tasks: hatched on their device's row
            mine = [(t0, t1 - t0) for _, _, dev, t0, t1 in tasks if dev == d]
            if mine:
                ax.broken_barh(mine, (d - 0.4, 0.8), facecolors="0.75", edgecolor="0.3", hatch="//", linewidth=0.3)
        for r, (s, d) in enumerate(links, start=D):
            xs = np.flatnonzero((self.x_src == s) & (self.x_dst == d))
            ax.broken_barh(list(zip(self.x_start[xs], self.x_end[xs] - self.x_start[xs])), (r - 0.3, 0.6),
                           facecolors="0.45", linewidth=0)
        ax.set_yticks(range(len(rows)), rows)
        ax.invert_yaxis()
        ax.set_xlabel("time (µs)")
        makespan = float(self.op_end.max()) if len(self.op_end) else 0.0
        ax.set_title(title or f"{graph.name} on {cluster.name}: step {makespan:,.0f} µs")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


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


class CostModel:
    """A graph on a cluster with op times ``T[op, device]``: scores placements.

    ``op_times`` (an ops x devices array, µs) overrides the profile and roofline.
    """

    def __init__(self, graph, cluster, profile=None, op_times=None):
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
        self.net = kernels.make_net(graph, cluster, self.T)
        self._param_bytes = np.ascontiguousarray(graph.param_bytes, np.int64)
        self._local = threading.local()  # one engine workspace per thread
        # group -> device-kind mask, and which devices each group may use
        self.group_device_ok = (graph.group_allowed[:, None] & cluster.kind_mask[None, :]) != 0
        self._group_first = np.array([ops[0] for ops in graph.group_ops], np.int64)
        self._op_group_first = np.ascontiguousarray(self._group_first[graph.group], np.intp)

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

    def work(self) -> kernels.Work:
        """This thread's engine workspace (allocated on first use, then reused)."""
        w = getattr(self._local, "work", None)
        if w is None:
            w = self._local.work = kernels.work_for(self.net)
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
        """Every op on one device (name or index)."""
        return np.full(self.graph.n_ops, self.cluster.device_index(device), np.int32)

    def violation(self, p: np.ndarray) -> str | None:
        """Why a per-op placement is invalid (split group, op without kernel), or None."""
        g = self.graph
        split, nok = kernels.placement_violation(p, self._op_group_first, self.T)
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
        w = self.work()
        ms, nx = kernels.simulate_full(self.net, w, p)
        busy = w.busy.copy()
        peak = kernels.device_peak(w.livepeak, p, self._param_bytes)
        reason = self._memory_reason(peak)
        tr = None
        if trace:
            tr = Trace(p, w.op_start[: g.n_ops].copy(), w.op_end[: g.n_ops].copy(), w.x_tensor[:nx].astype(np.int64),
                       w.x_src[:nx].astype(np.int64), w.x_dst[:nx].astype(np.int64), w.x_start[:nx].copy(),
                       w.x_end[:nx].copy(), w.x_task[:nx].copy())
        return SimResult(float(ms), reason is None, reason, busy, peak, names, tr)

    def simulate_batch(self, placements) -> BatchResult:
        """Simulate many per-op placements (or group assignments), in parallel across cores.

        Invalid rows (split group, op without kernel) get ``inf`` and ``feasible=False``;
        rows over memory keep their simulated time and get ``feasible=False``.
        """
        P = np.asarray(placements)
        g, D = self.graph, self.n_devices
        if P.ndim != 2:
            raise PlacementError(f"simulate_batch expects a 2-D array, got shape {P.shape}")
        if P.shape[1] == g.n_ops:
            P = np.ascontiguousarray(P, np.int32)
        elif P.shape[1] == g.n_groups:
            P = np.ascontiguousarray(P[:, g.group], np.int32)
        else:
            raise PlacementError(f"placements have {P.shape[1]} columns; graph has {g.n_ops} ops, {g.n_groups} groups")
        if P.size and (P.min() < 0 or P.max() >= D):
            raise PlacementError(f"placements hold device indices outside 0..{D - 1}")
        B = P.shape[0]
        step = np.empty(B)
        busy = np.zeros((B, D))
        peak = np.zeros((B, D), np.int64)
        if B:
            chunks = min(B, 4 * numba.get_num_threads())  # a few per thread: rows differ in cost
            kernels.simulate_batch(self.net, P, self._param_bytes, step, busy, peak, chunks)
        split = np.any(P != P[:, self._group_first[g.group]], axis=1)
        step[split] = np.inf
        feasible = np.isfinite(step) & np.all(peak <= self.capacity[None, :], axis=1)
        return BatchResult(step, feasible, busy, peak)

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
        cp = kernels.critical_path(g.topo_order, fastest, *g.successors)
        return float(max(cp, fastest.sum() / self.n_devices))

    # ----------------------------------------------------------- files
    def placement_to_json(self, p, step_time_us=None, extra=None) -> dict:
        """The placement file: {graph, cluster, devices per op name, simulated step time}."""
        p = self.placement_array(p)
        names = self.cluster.names
        d = {
            "format": "placetool.placement",
            "version": 1,
            "graph": self.graph.name,
            "cluster": self.cluster.name,
            "devices": {op: names[i] for op, i in zip(self.graph.names, p)},
            "step_time_us": None if step_time_us is None else float(step_time_us),
        }
        if extra:
            d.update(extra)
        return d

    def load_placement(self, path) -> np.ndarray:
        """Read a placement JSON file and check it matches this graph and cluster."""
        path = Path(path)
        d = read_json(path, "placement", PlacementError)
        if not isinstance(d, dict) or not isinstance(d.get("devices"), dict):
            raise PlacementError(f"{path}: expected an object with a 'devices' table of op -> device")
        try:
            return self.placement_array(d["devices"])
        except (PlacementError, ValueError) as e:
            raise PlacementError(f"{path}: {e}") from None
