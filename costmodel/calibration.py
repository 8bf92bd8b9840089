"""Measured profiles: per-op medians, per-op-type fits, link fits (no TensorFlow here).

A profile is written by ``placetool calibrate`` (:mod:`placetool.costmodel.tf.calibrate`) and read
by :func:`load_profile`; :meth:`Profile.op_times` turns it into ``T[op, device]`` with
NaN where it knows nothing, and :func:`placetool.costmodel.profile.op_time_matrix` fills the NaNs
from the datasheet roofline. Order of trust for an op on a device of kind K:

1. a measured median for this graph and op name on kind K, if the op still has the same
   type, FLOPs and bytes (a different batch size changes those, and then the old
   measurement is not used);
2. the kind's per-op-type fit ``t = intercept + flops * us_per_flop + bytes * us_per_byte``;
3. the kind's fit over all op types (``"*"``), when the type was never profiled.

The JSON file (format ``placetool.profile``, version 1)::

    {"format": "placetool.profile", "version": 1,
     "host": "...", "tf_version": "2.21.0", "date": "2026-...Z",
     "devices": [{"name": "cpu:0", "kind": "cpu", "tf": "/job:worker/replica:0/task:0/device:CPU:0"}],
     "step_overhead_us": [310.0, 620.0],          # fixed cost of a step using 1, 2, ... devices
     "dispatch_us": {"cpu": 12.0},                 # per-op executor cost the op trace misses
     "ops": {"cpu": {"GRAPH": {"OP": ["MatMul", median_us, flops, bytes], ...}}},
     "fits": {"cpu": {"MatMul": {"intercept_us": .., "us_per_flop": .., "us_per_byte": .., "n": ..}}},
     "links": [{"src": "cpu:0", "dst": "cpu:1", "latency_us": .., "bandwidth_bytes_per_us": ..,
                "samples": [[bytes, us], ...]}],
     "cluster": {...},                             # the calibrated cluster (Cluster.to_dict)
     "meta": {"transfer_fit": {                    # fitted to designed split placements
                 "params": {"latency_us": .., "send_us": .., "send_us_per_byte": ..,
                            "recv_us": .., "recv_us_per_byte": ..},
                 "fit": {"n": .., "median_abs_error_pct": .., "max_abs_error_pct": ..},
                 "held_out": {...}, "noise_floor_pct": ..,
                 "placements": [{"label", "held_out", "transfers", "measured_us",
                                 "spread_pct", "predicted_us", "error_pct"}, ...]},
              "noisy": "..."}}                     # only when the noise floor was too high

Units: microseconds, bytes, FLOPs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError, atomic_write, read_json

FORMAT = "placetool.profile"
VERSION = 1
#: the bandwidth (bytes/µs) :func:`fit_link` gives a link whose larger transfers took no
#: longer than its small ones: no cost per byte that the timings can tell
UNMEASURED_BANDWIDTH = 1e12


class ProfileError(UserError):
    """A profile file is malformed; the message names the file and field."""


@dataclass
class OpFit:
    """``t = intercept_us + flops * us_per_flop + bytes * us_per_byte`` (all >= 0)."""

    intercept_us: float
    us_per_flop: float
    us_per_byte: float
    n: int = 0

    def predict(self, flops, nbytes) -> np.ndarray:
        return self.intercept_us + np.asarray(flops, np.float64) * self.us_per_flop + \
            np.asarray(nbytes, np.float64) * self.us_per_byte

    def to_dict(self) -> dict:
        return {"intercept_us": self.intercept_us, "us_per_flop": self.us_per_flop,
                "us_per_byte": self.us_per_byte, "n": self.n}


def fit_op_type(flops, nbytes, times) -> OpFit:
    """Non-negative least squares of time on (1, flops, bytes).

    With fewer than 3 samples, or when a column is constant, the fit keeps fewer terms
    (an intercept alone for one sample) so it never extrapolates from noise.
    """
    from scipy.optimize import nnls

    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    t = np.asarray(times, np.float64)
    n = len(t)
    if n == 0:
        raise ValueError("no samples to fit")
    cols = [np.ones(n)]
    names = ["intercept"]
    # scale columns to unit max so nnls is well conditioned
    for name, x in (("flops", f), ("bytes", b)):
        if n >= 3 and np.ptp(x) > 0:
            cols.append(x)
            names.append(name)
    A = np.stack(cols, axis=1)
    scale = np.maximum(np.abs(A).max(axis=0), 1e-300)
    coef, _ = nnls(A / scale, t)
    coef = coef / scale
    c = dict(zip(names, coef))
    return OpFit(float(c.get("intercept", 0.0)), float(c.get("flops", 0.0)), float(c.get("bytes", 0.0)), n)


def fit_link(nbytes, times_us) -> tuple[float, float]:
    """(latency_us, bandwidth_bytes_per_us) from timed transfers: ``t = lat + bytes / bw``.

    Robust to a noisy machine: the slope (1 / bandwidth) is a least-squares fit over the
    large transfers (>= 1 MB, where bytes dominate), the latency the median residual of
    the small ones (<= 64 KB); both are kept >= 0. With fewer sizes, one fit over all.
    """
    from scipy.optimize import nnls

    x = np.asarray(nbytes, np.float64)
    t = np.asarray(times_us, np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("a link fit needs transfers of at least two sizes")
    big = x >= 2 ** 20
    if big.sum() < 2:
        big = np.ones_like(x, bool)
    A = np.stack([np.ones(big.sum()), x[big] / x.max()], axis=1)
    coef, _ = nnls(A, t[big])
    per_byte = float(coef[1] / x.max())
    small = x <= 2 ** 16
    if not small.any():
        small = x <= np.median(x)
    lat = max(float(np.median(t[small] - x[small] * per_byte)), 0.0)
    bw = 1.0 / per_byte if per_byte > 0 else UNMEASURED_BANDWIDTH
    return lat, bw


def count_latency(counts, times_us) -> float:
    """Per-transfer latency (µs, >= 0): the slope of step time over the number of hops of
    a chain of small dependent transfers (least squares)."""
    k = np.asarray(counts, np.float64)
    t = np.asarray(times_us, np.float64)
    if len(k) < 2 or np.ptp(k) == 0:
        raise ValueError("a latency fit needs at least two different transfer counts")
    slope = np.polyfit(k, t, 1)[0]
    return max(float(slope), 0.0)


@dataclass
class Profile:
    """A measured profile; see the module docstring for the JSON layout."""

    devices: list[dict]
    ops: dict = field(default_factory=dict)      # kind -> graph -> op -> [type, us, flops, bytes]
    fits: dict = field(default_factory=dict)     # kind -> op_type -> OpFit
    links: list[dict] = field(default_factory=list)
    step_overhead_us: list[float] = field(default_factory=list)
    dispatch_us: dict = field(default_factory=dict)  # kind -> µs added to every profiled op
    cluster_dict: dict | None = None
    host: str = ""
    tf_version: str = ""
    date: str = ""
    meta: dict = field(default_factory=dict)

    # --------------------------------------------------------------- build
    def add_op_medians(self, kind: str, graph, medians: dict[str, float]) -> None:
        """Record per-op medians (µs) measured for ``graph`` on a device of ``kind``."""
        by_op = self.ops.setdefault(kind, {}).setdefault(graph.name, {})
        moved = graph.in_bytes + graph.out_bytes
        for name, us in medians.items():
            i = graph.index.get(name)
            if i is None:
                continue
            by_op[name] = [graph.op_types[i], float(us), float(graph.flops[i]), int(moved[i])]

    @classmethod
    def merged(cls, profiles: list["Profile"]) -> "Profile":
        """One profile with the per-op medians of every profile in ``profiles`` (copied; a
        later one wins for a graph both hold), the first one's devices, links and overheads:
        what a fit pooled over graphs profiled one at a time on one testbed predicts with.

        >>> a = Profile(devices=[], ops={"cpu": {"g1": {"x": ["MatMul", 5.0, 1e3, 64]}}})
        >>> b = Profile(devices=[], ops={"cpu": {"g2": {"y": ["Add", 2.0, 10.0, 64]}}})
        >>> sorted(Profile.merged([a, b]).ops["cpu"])
        ['g1', 'g2']
        """
        first = profiles[0]
        ops: dict = {}
        for p in profiles:
            for kind, graphs in p.ops.items():
                ops.setdefault(kind, {}).update(
                    {g: {op: list(row) for op, row in by_op.items()} for g, by_op in graphs.items()})
        out = cls(devices=list(first.devices), ops=ops, links=list(first.links),
                  step_overhead_us=list(first.step_overhead_us), dispatch_us=dict(first.dispatch_us),
                  cluster_dict=first.cluster_dict, host=first.host, tf_version=first.tf_version)
        out.refit()
        return out

    def scale_ops(self, kind: str, graph_name: str, factor: float) -> None:
        """Multiply the per-op medians of ``graph_name`` on ``kind`` by ``factor`` and refit."""
        for row in self.ops.get(kind, {}).get(graph_name, {}).values():
            row[1] = float(row[1]) * factor
        self.refit()

    def refit(self, min_samples: int = 1) -> None:
        """Fit every op type of every kind from the recorded medians, plus ``"*"`` (all ops)."""
        self.fits = {}
        for kind, graphs in self.ops.items():
            rows: dict[str, list] = {}
            for ops in graphs.values():
                for typ, us, flops, nbytes in ops.values():
                    rows.setdefault(typ, []).append((flops, nbytes, us))
            fits = {}
            everything = []
            for typ, r in rows.items():
                everything += r
                if len(r) >= min_samples:
                    a = np.array(r, np.float64)
                    fits[typ] = fit_op_type(a[:, 0], a[:, 1], a[:, 2])
            if everything:
                a = np.array(everything, np.float64)
                fits["*"] = fit_op_type(a[:, 0], a[:, 1], a[:, 2])
            self.fits[kind] = fits

    # --------------------------------------------------------------- use
    def dispatch_per_device(self, cluster) -> np.ndarray:
        """µs the profile adds to every op on each device of ``cluster`` (its kind's
        dispatch cost, 0 where none was measured): what a trace of an op does not show."""
        return np.array([float(self.dispatch_us.get(k, 0.0)) for k in cluster.kinds])

    def op_times(self, graph, cluster) -> np.ndarray:
        """(ops x devices) µs: measured, else fitted; NaN where the profile knows nothing."""
        T = np.full((graph.n_ops, cluster.n_devices), np.nan)
        moved = (graph.in_bytes + graph.out_bytes).astype(np.int64)
        for kind in set(cluster.kinds):
            cols = [d for d, k in enumerate(cluster.kinds) if k == kind]
            col = self.kind_times(graph, kind, moved)
            T[:, cols] = col[:, None]
        return T

    def kind_times(self, graph, kind: str, moved=None) -> np.ndarray:
        """Per-op µs on a device of ``kind`` (NaN where unknown), dispatch cost included."""
        if moved is None:
            moved = (graph.in_bytes + graph.out_bytes).astype(np.int64)
        out = np.full(graph.n_ops, np.nan)
        fits = self.fits.get(kind, {})
        if fits:
            by_type: dict[str, list[int]] = {}
            for i, t in enumerate(graph.op_types):
                by_type.setdefault(t, []).append(i)
            for t, idx in by_type.items():
                f = fits.get(t) or fits.get("*")
                if f is not None:
                    idx = np.asarray(idx)
                    out[idx] = f.predict(graph.flops[idx], moved[idx])
        measured = self.ops.get(kind, {}).get(graph.name, {})
        for name, (typ, us, flops, nbytes) in measured.items():
            i = graph.index.get(name)
            if i is None or graph.op_types[i] != typ or int(moved[i]) != int(nbytes):
                continue
            if not np.isclose(graph.flops[i], flops, rtol=1e-9, atol=0.0):
                continue
            out[i] = us
        return out + float(self.dispatch_us.get(kind, 0.0))

    def coverage(self, graph, kind: str) -> dict:
        """How many ops of ``graph`` get a measured / fitted / no time on ``kind``."""
        moved = (graph.in_bytes + graph.out_bytes).astype(np.int64)
        measured = self.ops.get(kind, {}).get(graph.name, {})
        n_meas = sum(
            1 for n, (typ, _, fl, nb) in measured.items()
            if n in graph.index and graph.op_types[graph.index[n]] == typ
            and int(moved[graph.index[n]]) == int(nb) and np.isclose(graph.flops[graph.index[n]], fl)
        )
        known = np.isfinite(self.kind_times(graph, kind, moved)).sum()
        return {"measured": n_meas, "fitted": int(known) - n_meas, "roofline": graph.n_ops - int(known)}

    def step_overhead(self, n_devices_used: int) -> float:
        """Fixed per-step cost (µs) of a step touching ``n_devices_used`` devices."""
        if not self.step_overhead_us or n_devices_used <= 0:
            return 0.0
        k = min(n_devices_used, len(self.step_overhead_us)) - 1
        return float(self.step_overhead_us[k])

    def cluster(self):
        """The calibrated cluster stored in the profile (a :class:`placetool.costmodel.Cluster`)."""
        from .cluster import Cluster

        if not self.cluster_dict:
            raise ProfileError("profile holds no cluster; pass --cluster")
        return Cluster.from_dict(self.cluster_dict, source="profile cluster")

    # --------------------------------------------------------------- files
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "host": self.host,
            "tf_version": self.tf_version,
            "date": self.date,
            "devices": self.devices,
            "step_overhead_us": [float(x) for x in self.step_overhead_us],
            "dispatch_us": {k: float(v) for k, v in self.dispatch_us.items()},
            "ops": self.ops,
            "fits": {k: {t: f.to_dict() for t, f in v.items()} for k, v in self.fits.items()},
            "links": self.links,
            "cluster": self.cluster_dict,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict, source: str = "profile") -> "Profile":
        if not isinstance(d, dict):
            raise ProfileError(f"{source}: expected a JSON object")
        if d.get("format") != FORMAT:
            raise ProfileError(f"{source}: format {d.get('format')!r} is not {FORMAT!r}")
        if d.get("version") != VERSION:
            raise ProfileError(f"{source}: unknown {FORMAT} version {d.get('version')!r} (this placetool reads {VERSION})")
        devices = d.get("devices")
        if not isinstance(devices, list):
            raise ProfileError(f"{source}: field 'devices' must be a list")
        ops = d.get("ops", {})
        if not isinstance(ops, dict):
            raise ProfileError(f"{source}: field 'ops' must be an object kind -> graph -> op")
        for kind, graphs in ops.items():
            for gname, by_op in graphs.items():
                for op, row in by_op.items():
                    if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                            and all(isinstance(x, (int, float)) for x in row[1:]) and row[1] >= 0):
                        raise ProfileError(
                            f"{source}: ops.{kind}.{gname}: op {op!r} must be [type, median_us >= 0, flops, bytes]"
                        )
        fits = {}
        if not isinstance(d.get("fits", {}), dict):
            raise ProfileError(f"{source}: field 'fits' must be an object kind -> op type -> fit")
        for kind, by_type in d.get("fits", {}).items():
            fits[kind] = {}
            if not isinstance(by_type, dict):
                raise ProfileError(f"{source}: fits.{kind} must be an object op type -> fit")
            for typ, f in by_type.items():
                try:
                    fits[kind][typ] = OpFit(float(f["intercept_us"]), float(f["us_per_flop"]),
                                            float(f["us_per_byte"]), int(f.get("n", 0)))
                except (KeyError, TypeError, ValueError):
                    raise ProfileError(f"{source}: fits.{kind}.{typ}: needs intercept_us, us_per_flop, us_per_byte") from None
                ft = fits[kind][typ]
                coef = (ft.intercept_us, ft.us_per_flop, ft.us_per_byte)
                if not all(math.isfinite(c) and c >= 0 for c in coef):  # a fit predicts times >= 0
                    raise ProfileError(f"{source}: fits.{kind}.{typ}: intercept_us, us_per_flop and us_per_byte "
                                       f"must be finite numbers >= 0, got {coef}")
        so = d.get("step_overhead_us", [])
        if not isinstance(so, list) or not all(isinstance(x, (int, float)) and x >= 0 for x in so):
            raise ProfileError(f"{source}: step_overhead_us must be a list of numbers >= 0")
        return cls(
            devices=devices, ops=ops, fits=fits, links=list(d.get("links", [])),
            step_overhead_us=[float(x) for x in so], cluster_dict=d.get("cluster"),
            dispatch_us=_dispatch(d.get("dispatch_us", {}), source),
            host=str(d.get("host", "")), tf_version=str(d.get("tf_version", "")),
            date=str(d.get("date", "")), meta=dict(d.get("meta", {})),
        )

    def save(self, path) -> None:
        atomic_write(Path(path), json.dumps(self.to_dict(), indent=1) + "\n")


def _dispatch(d, source) -> dict:
    if not isinstance(d, dict) or not all(isinstance(v, (int, float)) and v >= 0 for v in d.values()):
        raise ProfileError(f"{source}: dispatch_us must map device kinds to numbers >= 0")
    return {str(k): float(v) for k, v in d.items()}


def load_profile(path) -> Profile:
    """Read a profile JSON file; errors name the file and field."""
    path = Path(path)
    return Profile.from_dict(read_json(path, "profile", ProfileError), source=str(path))


# ------------------------------------------------------------------ transfer costs from whole steps
#: What :func:`fit_transfer_costs` fits: one link latency for every link, and per device of
#: the fitted kinds the four device-side transfer costs of the simulator.
TRANSFER_PARAMS = ("latency_us", "send_us", "send_us_per_byte", "recv_us", "recv_us_per_byte")
_KB = 1024.0  # per-byte costs are fitted per KiB, so every parameter is O(1..1000)


@dataclass
class StepSample:
    """One placement's measured step, for fitting and judging transfer costs."""

    graph: object
    placement: np.ndarray
    measured_us: float
    spread_pct: float = 0.0
    label: str = ""
    held_out: bool = False


def count_transfers(graph, p) -> int:
    """Transfers a per-op placement makes: distinct (tensor, destination device) pairs of
    data edges whose consumer is on another device than the tensor's producer."""
    p = np.asarray(p)
    t = graph.edge_tensor
    data = t >= 0
    src, dst, t = graph.edge_src[data], graph.edge_dst[data], t[data]
    cross = p[src] != p[dst]
    if not cross.any():
        return 0
    return int(len(np.unique(t[cross].astype(np.int64) * (int(p.max()) + 1) + p[dst[cross]])))


def with_transfer_params(cluster, params: dict, kinds=("cpu",)):
    """``cluster`` with the device-side transfer costs of ``params`` on every device of
    ``kinds`` and every link's latency set to ``params["latency_us"]`` (one figure for
    every link, or a (D, D) matrix).

    A lone transfer's measured per-byte time stays what it was: the per-byte costs moved
    onto the devices (send + receive) are taken off the link's (never below 10% of it).
    """
    from dataclasses import replace

    D = cluster.n_devices
    fit = np.array([d.kind in kinds for d in cluster.devices])
    devices = [replace(d, send_us=params["send_us"], send_us_per_byte=params["send_us_per_byte"],
                       recv_us=params["recv_us"], recv_us_per_byte=params["recv_us_per_byte"]) if f else d
               for d, f in zip(cluster.devices, fit)]
    off = ~np.eye(D, dtype=bool)
    lat = np.where(off, params["latency_us"], 0.0)
    bw = np.asarray(cluster.bandwidth_bytes_per_us, np.float64)
    link_pb = np.divide(1.0, bw, out=np.zeros((D, D)), where=off & np.isfinite(bw) & (bw > 0))
    moved = (np.where(fit, params["send_us_per_byte"], 0.0)[:, None]
             + np.where(fit, params["recv_us_per_byte"], 0.0)[None, :])
    pb = np.maximum(link_pb - moved, 0.1 * link_pb)
    bw = np.divide(1.0, pb, out=np.full((D, D), np.inf), where=pb > 0)
    return replace(cluster, devices=devices, latency_us=lat, bandwidth_bytes_per_us=bw,
                   metadata=dict(cluster.metadata))


def unfitted_cluster(cluster, profile=None, kinds=("cpu",)):
    """``cluster`` as it was before :func:`with_transfer_params`: each link's measured
    latency and bandwidth (the profile's lone-transfer timings, where it has them) and no
    device-side transfer cost on devices of ``kinds``: what a refit starts from."""
    from dataclasses import replace

    lat = np.array(cluster.latency_us, np.float64)
    bw = np.array(cluster.bandwidth_bytes_per_us, np.float64)
    index = {n: i for i, n in enumerate(cluster.names)}
    for link in (profile.links if profile is not None else []):
        a, b = index.get(link["src"]), index.get(link["dst"])
        if a is not None and b is not None:
            lat[a, b] = float(link.get("latency_measured_us", link["latency_us"]))
            bw[a, b] = float(link["bandwidth_bytes_per_us"])
    zero = dict.fromkeys(("send_us", "send_us_per_byte", "recv_us", "recv_us_per_byte"), 0.0)
    devices = [replace(d, **zero) if d.kind in kinds else d for d in cluster.devices]
    return replace(cluster, devices=devices, latency_us=lat, bandwidth_bytes_per_us=bw,
                   metadata=dict(cluster.metadata))


@dataclass
class TransferFit:
    """Fitted transfer costs and how well they predict measured steps (errors in %)."""

    params: dict
    rows: list                      # per sample: label, graph, held_out, measured, predicted, error %
    noise_floor_pct: float
    per_transfer_us: float = 0.0    # a fixed step cost per transfer, where held-out steps ask for it
                                    # (reported only: the simulator has no such term)
    per_transfer_note: str = ""

    def _errs(self, held_out: bool) -> np.ndarray:
        return np.array([r["error_pct"] for r in self.rows if r["held_out"] == held_out], np.float64)

    def summary(self) -> dict:
        def stats(e):
            if not len(e):
                return {"n": 0, "median_abs_error_pct": None, "max_abs_error_pct": None}
            return {"n": int(len(e)), "median_abs_error_pct": float(np.median(np.abs(e))),
                    "max_abs_error_pct": float(np.max(np.abs(e)))}
        return {"params": dict(self.params), "fit": stats(self._errs(False)), "held_out": stats(self._errs(True)),
                "noise_floor_pct": self.noise_floor_pct, "per_transfer_step_us": self.per_transfer_us,
                "per_transfer_note": self.per_transfer_note, "placements": self.rows}


def fit_transfer_costs(samples: list[StepSample], cluster, profile, kinds=("cpu",),
                       try_per_transfer: bool = True) -> TransferFit:
    """Least-squares fit of the transfer parameters (:data:`TRANSFER_PARAMS`) to whole steps.

    Prediction of a sample = the simulated step of its placement on ``cluster`` with the
    parameters (:func:`with_transfer_params`) + the profile's fixed step overhead; the
    residual is ``log(predicted / measured)``, over the samples not ``held_out``; all
    parameters >= 0 (scipy ``least_squares``, several starts, the best kept). Then a
    model with one more term, a fixed step cost per transfer, is fitted too and kept
    only if it predicts the *held-out* samples better by more than the noise floor
    (the median spread of repeated measurements): nothing the data does not ask for.
    """
    from scipy.optimize import least_squares

    from .simulate import CostModel

    if not any(not s.held_out for s in samples):
        raise ValueError("no samples to fit")
    T, over, ntr = {}, [], []
    for s in samples:
        if id(s.graph) not in T:
            T[id(s.graph)] = CostModel(s.graph, cluster, profile=profile).T
        over.append(profile.step_overhead(len(np.unique(s.placement))) if profile is not None else 0.0)
        ntr.append(count_transfers(s.graph, s.placement))
    over, ntr = np.array(over), np.array(ntr, np.float64)
    meas = np.array([s.measured_us for s in samples])
    train = np.array([not s.held_out for s in samples])

    def unpack(x):
        return {"latency_us": x[0], "send_us": x[1], "send_us_per_byte": x[2] / _KB,
                "recv_us": x[3], "recv_us_per_byte": x[4] / _KB}

    def predict(x):
        c = with_transfer_params(cluster, unpack(x), kinds)
        sim = np.array([CostModel(s.graph, c, op_times=T[id(s.graph)]).simulate(s.placement).step_time_us
                        for s in samples])
        extra = x[5] * ntr if len(x) > 5 else 0.0
        return sim + over + extra

    def resid(x):
        return np.log(predict(x)[train] / meas[train])

    lat0 = float(np.median(cluster.latency_us[~np.eye(cluster.n_devices, dtype=bool)])) \
        if cluster.n_devices > 1 else 0.0

    def solve(n):
        starts = [np.r_[lat0, 0, 0, 0, 0], np.r_[lat0 / 4, lat0 / 2 + 50, 0.2, lat0 / 2 + 50, 0.2]]
        best = None
        for x0 in starts:
            x0 = np.r_[x0, [0.0] * (n - 5)]
            r = least_squares(resid, x0, bounds=(0, np.inf), diff_step=0.05, x_scale=np.r_[[100.0, 100, 1, 100, 1],
                              [10.0] * (n - 5)], max_nfev=200)
            if best is None or r.cost < best.cost:
                best = r
        # the step time is piecewise linear in the parameters (critical paths switch), where
        # finite-difference steps can stall: polish with a derivative-free search
        from scipy.optimize import minimize

        pol = minimize(lambda z: float(np.sum(resid(np.abs(z)) ** 2)), best.x, method="Nelder-Mead",
                       options={"maxfev": 60 * n, "xatol": 1e-3, "fatol": 1e-10})
        return np.abs(pol.x) if pol.fun < 2 * best.cost else best.x

    x = solve(5)
    noise = float(np.median([s.spread_pct for s in samples]))
    pred = predict(x)
    per_transfer, note = 0.0, "not tried (needs held-out placements with transfers)"
    if try_per_transfer and (~train).any() and ntr[train].any():
        # does a fixed step cost per transfer (not on any device or link) explain more?
        x6 = solve(6)
        e5 = float(np.median(np.abs(pred[~train] / meas[~train] - 1))) * 100
        e6 = float(np.median(np.abs(predict(x6)[~train] / meas[~train] - 1))) * 100
        asks = bool(x6[5] > 0 and e5 - e6 > noise)
        per_transfer = float(x6[5]) if asks else 0.0
        note = (f"{'the data asks for it' if asks else 'not needed'}: {x6[5]:.1f} µs per transfer gives "
                f"held-out median |error| {e6:.1f}% vs {e5:.1f}% without (noise floor {noise:.1f}%)")
    rows = []
    for s, pr, n in zip(samples, pred, ntr):
        rows.append({"graph": s.graph.name, "label": s.label, "held_out": bool(s.held_out), "transfers": int(n),
                     "measured_us": float(s.measured_us), "spread_pct": float(s.spread_pct),
                     "predicted_us": float(pr), "error_pct": float(100.0 * (pr - s.measured_us) / s.measured_us)})
    params = {k: float(v) for k, v in unpack(x[:5]).items()}
    return TransferFit(params, rows, noise, per_transfer, note)
