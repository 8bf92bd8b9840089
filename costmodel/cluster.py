"""Cluster: devices, directed links and memory; human-written TOML files.

A cluster file looks like::

    name = "k80x2"
    [metadata]
    source = "analytic: datasheet roofline"

    [[devices]]
    name = "cpu:0"
    kind = "cpu"
    memory_bytes = 68719476736
    peak_flops_per_us = 1.16e6          # datasheet roofline, used without a profile
    memory_bandwidth_bytes_per_us = 6.8e4
    launch_overhead_us = 2.0
    send_us = 0.0                       # device time per outgoing transfer (optional, default 0)
    send_us_per_byte = 0.0
    recv_us = 0.0                       # device time per incoming transfer (optional, default 0)
    recv_us_per_byte = 0.0

    [links.default]
    latency_us = 10.0
    bandwidth_bytes_per_us = 1.2e4

    # queue = "fifo"                     # optional: "fifo" (default) or "none", see below
    # send = "eager"                     # optional: "eager" (default), "idle", "aside" or "workers"

    [[links.pairs]]                      # optional overrides, one direction each
    src = "gpu:0"
    dst = "gpu:1"
    latency_us = 5.0
    bandwidth_bytes_per_us = 2.0e4
    symmetric = true                     # also dst -> src

The four ``send``/``recv`` figures are the compute-queue time a transfer costs its
sending and receiving device on top of the link time (serialisation, Send/Recv kernels);
0 for devices whose copy engines overlap transfers with compute.

``links.queue`` says whether transfers on one directed link wait for each other:
``"fifo"`` (the default), one at a time, first queued first served, as one copy engine
per direction serves them (a GPU's host copies: benchmarks/gpu_copy_engines.py); ``"none"``,
each takes its own latency + bytes / bandwidth from when it is sent, whatever else is in
flight, as gRPC serves the RecvTensor calls of TensorFlow workers side by side (traced
steps: docs/explain.md).

``links.send`` says when a tensor leaves its source device: ``"eager"`` (the default) as
soon as its producer ends (after the device's send task, where it has a send cost);
``"idle"``, only once the source device has no ready op left: every transfer gets a send
task, even of zero time, that the device runs after all its ready ops. So a TensorFlow
worker behaves, whose RecvTensor handler waits in the inter-op pool's queue behind the
executor's own work (traced steps: a worker running a chain of ops sends nothing until
the chain ends; benchmarks/README.md, "Transfers wait for the sender to fall idle").
``"aside"``: as soon as its producer ends, and the send task runs beside the link
transfer, first on its device, instead of before it: CPU the sender spends on a message
already on its way (traced steps: benchmarks/README.md, "What a device pays per message").
``"workers"``: as a TensorFlow worker of one compute thread sends it
(:mod:`placetool.costmodel.workers`): the receiver issues a request when its thread
reaches the ``_Recv`` (``request_us`` of the receiver), the sender's thread answers it
behind its own work (``send_us`` + ``send_us_per_byte`` x bytes), and the receiver's
thread takes the response in next (``recv_us`` + ``recv_us_per_byte`` x bytes); each
device runs its own ready work last in, first out, and ops readied by an arrival after
it. ``links.queue`` does not apply: responses travel side by side.

Units: microseconds, bytes, FLOPs.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from .errors import UserError, atomic_write, read_parsed

KINDS = ("cpu", "gpu")
# Per-device transfer costs on the device's own compute queue (µs, µs per byte).
TRANSFER_COST_KEYS = ("send_us", "send_us_per_byte", "recv_us", "recv_us_per_byte")

# Roofline defaults when a device entry gives none: a modest CPU / GPU.
_DEFAULT_SPEC = {
    "cpu": dict(peak_flops_per_us=1.0e5, memory_bandwidth_bytes_per_us=2.0e4, launch_overhead_us=2.0),
    "gpu": dict(peak_flops_per_us=4.0e6, memory_bandwidth_bytes_per_us=2.4e5, launch_overhead_us=5.0),
}


class ClusterError(UserError):
    """A cluster description is malformed; the message names the file, device or field."""


@dataclass(frozen=True)
class Device:
    """One execution unit; the roofline fields are its analytic op-cost source."""

    name: str
    kind: str
    memory_bytes: int
    peak_flops_per_us: float
    memory_bandwidth_bytes_per_us: float
    launch_overhead_us: float
    cost_source: str = "roofline"
    send_us: float = 0.0
    send_us_per_byte: float = 0.0
    recv_us: float = 0.0
    recv_us_per_byte: float = 0.0
    request_us: float = 0.0  # links.send "workers": a receiver's time to issue one request


#: the fields a [[devices]] entry may have (a misspelt one is an error, not a default)
DEVICE_KEYS = frozenset(f.name for f in fields(Device))
TOP_KEYS = frozenset({"name", "devices", "links", "metadata"})
LINK_KEYS = frozenset({"latency_us", "bandwidth_bytes_per_us"})
#: how transfers on one directed link share it (``links.queue``; see the module docstring)
LINK_QUEUES = ("fifo", "none")
#: when a tensor leaves its source device (``links.send``; see the module docstring)
LINK_SENDS = ("eager", "idle", "aside", "workers")
#: limits on a cluster file's figures: memory sums stay in int64, op and transfer times finite
MAX_MEMORY = 1 << 60
MAX_LATENCY_US = 1e12
MIN_BANDWIDTH = 1e-6
#: the most devices a cluster may have: the simulator keeps state for every ordered
#: device pair (link queues, pending link events) and resets it for each placement, so
#: its workspace and each simulation's set-up grow as devices^2 (at 1,024 devices about
#: 40 MB a workspace and 1 ms a placement, 5.8 ms at 2,048: benchmarks/device_scale.py)
MAX_DEVICES = 1024


def _link_rule(value, choices, field_name: str, where: str):
    """``value`` if it is one of ``choices`` (``links.queue``, ``links.send``), else a
    ClusterError naming ``where`` and the field."""
    if value not in choices:
        raise ClusterError(f"{where}: links.{field_name} must be one of {', '.join(map(repr, choices))}, "
                           f"got {value!r}")
    return value


def check_device_count(n_devices: int, where: str) -> None:
    """ClusterError naming ``where`` and the limit when a cluster has more devices than
    :data:`MAX_DEVICES`."""
    if n_devices > MAX_DEVICES:
        raise ClusterError(f"{where}: {n_devices:,} devices; the simulator is built for at most "
                           f"{MAX_DEVICES:,} (its per-link state grows as devices^2)")


@dataclass(eq=False)
class Cluster:
    """Devices plus a dense (D x D) matrix of link latency and bandwidth."""

    name: str
    devices: list[Device]
    latency_us: np.ndarray
    bandwidth_bytes_per_us: np.ndarray
    metadata: dict = field(default_factory=dict)
    #: ``fifo``: transfers on one directed link run one at a time; ``none``: side by side
    link_queue: str = "fifo"
    #: ``eager``: a tensor leaves when produced; ``idle``: when its device has no ready op
    link_send: str = "eager"

    def __post_init__(self):
        _link_rule(self.link_queue, LINK_QUEUES, "queue", f"cluster {self.name!r}")
        _link_rule(self.link_send, LINK_SENDS, "send", f"cluster {self.name!r}")

    @property
    def fifo_links(self) -> bool:
        """Transfers on one directed link wait for each other (``links.queue`` "fifo"; under
        ``links.send`` "workers" responses travel side by side whatever the queue says)."""
        return self.link_queue == "fifo" and self.link_send != "workers"

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    @property
    def kinds(self) -> list[str]:
        return [d.kind for d in self.devices]

    @property
    def memory_bytes(self) -> np.ndarray:
        return np.array([d.memory_bytes for d in self.devices], np.int64)

    @property
    def kind_mask(self) -> np.ndarray:
        """Bit of each device's kind (see ``costmodel.graph.KIND_BITS``)."""
        from .graph import KIND_BITS

        return np.array([KIND_BITS[d.kind] for d in self.devices], np.uint8)

    def transfer_costs(self) -> np.ndarray:
        """(4, D) float64: send_us, send_us_per_byte, recv_us, recv_us_per_byte per device."""
        return np.array([[getattr(d, k) for d in self.devices] for k in TRANSFER_COST_KEYS], np.float64)

    def device_index(self, name_or_index) -> int:
        """Index of a device given by name or index; ClusterError names the unknown one."""
        if isinstance(name_or_index, (int, np.integer)):
            i = int(name_or_index)
            if not 0 <= i < self.n_devices:
                raise ClusterError(f"cluster {self.name!r}: no device index {i} (has {self.n_devices})")
            return i
        for i, d in enumerate(self.devices):
            if d.name == name_or_index:
                return i
        raise ClusterError(
            f"cluster {self.name!r}: unknown device {name_or_index!r} (devices: {', '.join(self.names)})"
        )

    # ------------------------------------------------------------------ build
    @classmethod
    def from_dict(cls, d: dict, source: str = "cluster") -> "Cluster":
        """Build from a dict shaped like the TOML file (see the module docstring)."""
        if not isinstance(d, dict):
            raise ClusterError(f"{source}: expected a table at top level")
        _known(d, TOP_KEYS, source)
        name = d.get("name", "cluster")
        devs_in = d.get("devices")
        if not isinstance(devs_in, list) or not devs_in:
            raise ClusterError(f"{source}: needs a non-empty 'devices' list")
        check_device_count(len(devs_in), source)
        devices = []
        for i, e in enumerate(devs_in):
            where = f"{source}: device {e.get('name', i)!r}" if isinstance(e, dict) else f"{source}: device {i}"
            if not isinstance(e, dict):
                raise ClusterError(f"{where}: expected a table")
            for key in ("name", "kind", "memory_bytes"):
                if key not in e:
                    raise ClusterError(f"{where}: missing field {key!r}")
            _known(e, DEVICE_KEYS, where)
            kind = e["kind"]
            if kind not in KINDS:
                raise ClusterError(f"{where}: kind {kind!r} is not one of {KINDS}")
            spec = dict(_DEFAULT_SPEC[kind])
            for key in spec:
                if key in e:
                    spec[key] = _positive(e[key], f"{where}: {key}", allow_zero=key == "launch_overhead_us")
                    # a rate near 0 or an overhead of ages makes op times overflow to inf
                    if key == "launch_overhead_us" and spec[key] > MAX_LATENCY_US:
                        raise ClusterError(f"{where}: {key} must be at most {MAX_LATENCY_US:g} µs, got {e[key]!r}")
                    if key != "launch_overhead_us" and spec[key] < MIN_BANDWIDTH:
                        raise ClusterError(f"{where}: {key} must be at least {MIN_BANDWIDTH:g} per µs, got {e[key]!r}")
            costs = {key: _cost(e[key], f"{where}: {key}") for key in TRANSFER_COST_KEYS + ("request_us",)
                     if key in e}
            mem = e["memory_bytes"]
            if not isinstance(mem, int) or isinstance(mem, bool) or not 0 < mem <= MAX_MEMORY:
                raise ClusterError(f"{where}: memory_bytes must be a whole number of bytes from 1 to "
                                   f"{MAX_MEMORY:,} (e.g. 12884901888), got {mem!r}")
            if not isinstance(e["name"], str) or not e["name"].strip():
                raise ClusterError(f"{where}: name must be non-empty text, got {e['name']!r}")
            devices.append(
                Device(
                    name=str(e["name"]),
                    kind=kind,
                    memory_bytes=int(mem),
                    cost_source=str(e.get("cost_source", "roofline")),
                    **spec,
                    **costs,
                )
            )
        names = [x.name for x in devices]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ClusterError(f"{source}: duplicate device name {dup!r}")
        D = len(devices)
        links = d.get("links", {})
        if not isinstance(links, dict):
            raise ClusterError(f"{source}: 'links' must be a table")
        _known(links, {"default", "pairs", "queue", "send"}, f"{source}: links")
        queue = _link_rule(links.get("queue", "fifo"), LINK_QUEUES, "queue", source)
        send = _link_rule(links.get("send", "eager"), LINK_SENDS, "send", source)
        default = links.get("default")
        if not isinstance(default, dict):
            raise ClusterError(f"{source}: needs [links.default] with latency_us and bandwidth_bytes_per_us")
        _known(default, LINK_KEYS, f"{source}: links.default")
        if not isinstance(links.get("pairs", []), list):
            raise ClusterError(f"{source}: links.pairs must be a list of [[links.pairs]] tables")
        lat = np.full((D, D), _link_field(default, "latency_us", f"{source}: links.default", True))
        bw = np.full((D, D), _link_field(default, "bandwidth_bytes_per_us", f"{source}: links.default"))
        index = {n: i for i, n in enumerate(names)}
        for k, p in enumerate(links.get("pairs", [])):
            where = f"{source}: links.pairs[{k}]"
            if not isinstance(p, dict):
                raise ClusterError(f"{where}: expected a table")
            _known(p, LINK_KEYS | {"src", "dst", "symmetric"}, where)
            for end in ("src", "dst"):
                if p.get(end) not in index:
                    raise ClusterError(f"{where}: unknown device {p.get(end)!r} in {end!r}")
            s, t = index[p["src"]], index[p["dst"]]
            pairs = [(s, t), (t, s)] if p.get("symmetric", False) else [(s, t)]
            for a, b in pairs:
                if "latency_us" in p:
                    lat[a, b] = _link_field(p, "latency_us", where, True)
                if "bandwidth_bytes_per_us" in p:
                    bw[a, b] = _link_field(p, "bandwidth_bytes_per_us", where)
        np.fill_diagonal(lat, 0.0)
        np.fill_diagonal(bw, np.inf)
        return cls(
            name=str(name),
            devices=devices,
            latency_us=np.ascontiguousarray(lat, np.float64),
            bandwidth_bytes_per_us=np.ascontiguousarray(bw, np.float64),
            metadata=dict(d.get("metadata", {})),
            link_queue=queue,
            link_send=send,
        )

    def to_dict(self) -> dict:
        """A dict that :meth:`from_dict` reads back to an equal cluster."""
        D = self.n_devices
        lat0, bw0 = _mode_offdiag(self.latency_us), _mode_offdiag(self.bandwidth_bytes_per_us)
        pairs = []
        for a in range(D):
            for b in range(D):
                if a != b and (self.latency_us[a, b] != lat0 or self.bandwidth_bytes_per_us[a, b] != bw0):
                    pairs.append(
                        dict(
                            src=self.devices[a].name,
                            dst=self.devices[b].name,
                            latency_us=float(self.latency_us[a, b]),
                            bandwidth_bytes_per_us=float(self.bandwidth_bytes_per_us[a, b]),
                        )
                    )
        out = {
            "name": self.name,
            "metadata": dict(self.metadata),
            "devices": [
                dict(
                    name=x.name,
                    kind=x.kind,
                    memory_bytes=int(x.memory_bytes),
                    peak_flops_per_us=float(x.peak_flops_per_us),
                    memory_bandwidth_bytes_per_us=float(x.memory_bandwidth_bytes_per_us),
                    launch_overhead_us=float(x.launch_overhead_us),
                    cost_source=x.cost_source,
                    **{key: float(getattr(x, key)) for key in TRANSFER_COST_KEYS},
                    **({"request_us": float(x.request_us)} if x.request_us else {}),
                )
                for x in self.devices
            ],
            "links": {"default": {"latency_us": float(lat0), "bandwidth_bytes_per_us": float(bw0)}},
        }
        if self.link_queue != "fifo":
            out["links"]["queue"] = self.link_queue
        if self.link_send != "eager":
            out["links"]["send"] = self.link_send
        if pairs:
            out["links"]["pairs"] = pairs
        return out

    @classmethod
    def load(cls, path) -> "Cluster":
        """Read a cluster TOML written by hand or by :meth:`save`."""
        return load(path)

    def save(self, path) -> None:
        """Write TOML atomically."""
        import tomli_w

        atomic_write(Path(path), tomli_w.dumps(self.to_dict()).encode())

    def transfer_time_us(self, src: int, dst: int, nbytes: float) -> float:
        """Time to send ``nbytes`` from device ``src`` to ``dst`` (0 on the same device)."""
        if src == dst:
            return 0.0
        return float(self.latency_us[src, dst] + nbytes / self.bandwidth_bytes_per_us[src, dst])

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, devices={self.names})"


def load(path) -> Cluster:
    """Read a cluster TOML file; errors name the file and field."""
    path = Path(path)

    def parse(p):
        with open(p, "rb") as f:
            return tomllib.load(f)

    d = read_parsed(path, parse, ClusterError, "cluster", "malformed TOML",
                    (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError))
    d.setdefault("name", path.name.removesuffix(".toml"))
    return Cluster.from_dict(d, source=str(path))


def _positive(v, where, allow_zero=False) -> float:
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 or (allow_zero and v == 0))
            or v == float("inf")):
        raise ClusterError(f"{where} must be a {'non-negative' if allow_zero else 'positive'} finite number, "
                           f"got {v!r}")
    return float(v)


def _cost(v, where) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ClusterError(f"{where} must be a finite non-negative number, got {v!r}")
    return float(v)


def _link_field(d, key, where, allow_zero=False) -> float:
    if key not in d:
        raise ClusterError(f"{where}: missing field {key!r}")
    v = _positive(d[key], f"{where}.{key}", allow_zero)
    # beyond these a transfer time overflows the simulator's clock (or means nothing)
    if key == "latency_us" and v > MAX_LATENCY_US:
        raise ClusterError(f"{where}.{key} must be at most {MAX_LATENCY_US:g} µs, got {v!r}")
    if key == "bandwidth_bytes_per_us" and v < MIN_BANDWIDTH:
        raise ClusterError(f"{where}.{key} must be at least {MIN_BANDWIDTH:g} bytes/µs, got {v!r}")
    return v


def _known(table: dict, keys, where) -> None:
    """A misspelt field would silently fall back to a default: name the first unknown one."""
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise ClusterError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(keys))})")


def _mode_offdiag(m: np.ndarray) -> float:
    D = m.shape[0]
    if D < 2:
        return float(m[0, 0]) if np.isfinite(m[0, 0]) and m[0, 0] > 0 else 1.0
    vals, counts = np.unique(m[~np.eye(D, dtype=bool)], return_counts=True)
    return float(vals[np.argmax(counts)])
