"""Placement files: which device runs each op, by short name and as a TF device string.

A placement file is JSON::

    {"format": "placetool.placement", "version": 1,
     "graph": "nmt", "cluster": "k80x4",
     "devices":    {"op name": "gpu:0", ...},                      # cluster device names
     "tf_devices": {"op name": "/device:GPU:0", ...},              # what TensorFlow calls them
     "step_time_us": 1234.5,
     ...}                                                          # any other keys are kept

``devices`` is what placetool reads back; ``tf_devices`` is for people and for other tools
that set ``NodeDef.device`` themselves (``placetool export`` writes a GraphDef with them).

TF device strings (:func:`tf_device_names`), first that applies:

1. a cluster spec (a testbed or a ``--cluster-spec`` file; anything with a ``tf_devices``
   list, one string per cluster device in cluster order): its full names, e.g.
   ``/job:worker/replica:0/task:1/device:CPU:0``;
2. the cluster's own ``metadata.tf_devices`` (``placetool calibrate`` records the devices
   it measured);
3. otherwise the devices of one TF process: a cluster device is named by its kind and its
   rank among the cluster's devices of that kind, so the first cpu is ``/device:CPU:0``
   and the k-th gpu ``/device:GPU:k``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError, atomic_write, read_json

FORMAT = "placetool.placement"
VERSION = 1
_KNOWN = ("format", "version", "graph", "cluster", "devices", "tf_devices", "step_time_us")


class PlacementError(UserError):
    """A placement does not fit the graph or cluster, or its file is malformed; the message
    names the file, field, op or device."""


def tf_device_names(cluster, spec=None) -> list[str]:
    """One TF device string per cluster device, in cluster order (see the module docstring).

    ``spec``: None, an object with a ``tf_devices`` list, or a list of strings; it must
    name as many devices as the cluster has.
    """
    meta = (cluster.metadata or {}).get("tf_devices")
    if spec is None and isinstance(meta, list) and len(meta) == cluster.n_devices:
        spec = meta
    if spec is not None:
        names = list(getattr(spec, "tf_devices", spec))
        if len(names) != cluster.n_devices:
            raise UserError(f"cluster {cluster.name!r} has {cluster.n_devices} devices but the cluster spec "
                            f"names {len(names)} TF devices")
        if not all(isinstance(s, str) and s for s in names):
            raise UserError("a cluster spec's TF devices must be non-empty strings")
        return names
    seen: dict[str, int] = {}
    out = []
    for d in cluster.devices:
        k = seen.get(d.kind, 0)
        seen[d.kind] = k + 1
        out.append(f"/device:{d.kind.upper()}:{k}")
    return out


@dataclass
class Placement:
    """A placement by op name: ``devices`` {op: cluster device name}, ``tf_devices`` {op: TF
    device string} (may be empty), the graph and cluster names, the simulated step time,
    and any ``extra`` keys of the file (method, seed, ...)."""

    graph: str
    cluster: str
    devices: dict[str, str | int]
    tf_devices: dict[str, str] = field(default_factory=dict)
    step_time_us: float | None = None
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------ arrays
    @classmethod
    def from_array(cls, graph, cluster, placement, step_time_us=None, spec=None, extra=None) -> "Placement":
        """From a per-op array of device indices (``spec``: see :func:`tf_device_names`)."""
        p = np.asarray(placement)
        if p.shape != (graph.n_ops,):
            raise UserError(f"placement has shape {p.shape}; graph {graph.name!r} has {graph.n_ops} ops")
        names, tfn = cluster.names, tf_device_names(cluster, spec)
        return cls(
            graph=graph.name, cluster=cluster.name,
            devices={op: names[int(i)] for op, i in zip(graph.names, p)},
            tf_devices={op: tfn[int(i)] for op, i in zip(graph.names, p)},
            step_time_us=None if step_time_us is None else float(step_time_us),
            extra=dict(extra or {}),
        )

    def to_array(self, graph, cluster, source: str = "placement") -> np.ndarray:
        """Per-op device indices for ``graph`` on ``cluster``; every op named exactly once."""
        index = {n: i for i, n in enumerate(cluster.names)}
        out = np.empty(graph.n_ops, np.int32)
        for i, op in enumerate(graph.names):
            dev = self.devices.get(op)
            if dev is None:
                raise PlacementError(f"{source}: devices: names no device for op {op!r} of graph {graph.name!r}")
            j = index.get(dev) if isinstance(dev, str) else (dev if 0 <= dev < cluster.n_devices else None)
            if j is None:
                raise PlacementError(f"{source}: devices[{op!r}]: unknown device {dev!r} "
                                         f"(cluster {cluster.name!r} has {', '.join(cluster.names)})")
            out[i] = j
        if len(self.devices) != graph.n_ops:
            extra = next(op for op in self.devices if op not in graph.index)
            raise PlacementError(f"{source}: devices: names op {extra!r}, which graph {graph.name!r} lacks")
        return out

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, "graph": self.graph, "cluster": self.cluster,
             "devices": dict(self.devices), "tf_devices": dict(self.tf_devices),
             # an infeasible placement has no finite step time; JSON has no inf
             "step_time_us": self.step_time_us if self.step_time_us is not None
             and math.isfinite(self.step_time_us) else None}
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d

    @classmethod
    def from_dict(cls, d, source: str = "placement") -> "Placement":
        """Validate a parsed file; errors are one line naming ``source`` and the field."""
        if not isinstance(d, dict):
            raise PlacementError(f"{source}: expected a JSON object, got {type(d).__name__}")
        _check_numbers(d, source)
        fmt = d.get("format", FORMAT)  # files written before the format field: still version 1
        if fmt != FORMAT:
            raise PlacementError(f"{source}: format: {fmt!r} is not a placetool placement ({FORMAT!r})")
        ver = d.get("version", VERSION)
        if ver != VERSION or isinstance(ver, bool):
            raise PlacementError(f"{source}: version: {ver!r} is not supported (this placetool reads {VERSION})")
        for key in ("graph", "cluster"):
            if key in d and d[key] is not None and not isinstance(d[key], str):
                raise PlacementError(f"{source}: {key}: expected a string, got {type(d[key]).__name__}")
        devices = _str_table(d, "devices", source, required=True, index_ok=True)
        tf_devices = _str_table(d, "tf_devices", source, required=False)
        extra_ops = set(tf_devices) - set(devices)
        if extra_ops:
            raise PlacementError(f"{source}: devices: no device for op {sorted(extra_ops)[0]!r} (tf_devices names "
                                 f"it; every op needs an entry in 'devices')")
        st = d.get("step_time_us")
        if st is not None and (isinstance(st, bool) or not isinstance(st, (int, float)) or math.isnan(st)):
            raise PlacementError(f"{source}: step_time_us: expected a number or null, got {st!r}")
        return cls(graph=d.get("graph") or "", cluster=d.get("cluster") or "", devices=devices,
                   tf_devices=tf_devices, step_time_us=None if st is None else float(st),
                   extra={k: v for k, v in d.items() if k not in _KNOWN})

    @classmethod
    def load(cls, path) -> "Placement":
        """Read and validate a placement file (it is matched to a graph by :meth:`to_array`)."""
        path = Path(path)
        d = read_json(path, "placement", PlacementError, parse_constant=_Bad, parse_float=_float, parse_int=_int)
        return cls.from_dict(d, source=str(path))

    def save(self, path) -> None:
        """Write the file atomically (readers never see half a file)."""
        atomic_write(Path(path), json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")

    def with_tf_devices(self, cluster, spec=None) -> "Placement":
        """A copy whose ``tf_devices`` name the devices of ``spec`` (see :func:`tf_device_names`)."""
        tfn = dict(zip(cluster.names, tf_device_names(cluster, spec)))
        devices = {op: cluster.names[dev] if isinstance(dev, int) and 0 <= dev < cluster.n_devices else dev
                   for op, dev in self.devices.items()}
        bad = next((dev for dev in devices.values() if dev not in tfn), None)
        if bad is not None:
            raise PlacementError(f"placement names device {bad!r}, which cluster {cluster.name!r} lacks")
        return Placement(self.graph, self.cluster, devices,
                         {op: tfn[dev] for op, dev in devices.items()}, self.step_time_us, dict(self.extra))


class _Bad(str):
    """A number of a placement file that no float64 or int64 holds (kept as its text, so
    that the error can name its field)."""


def _float(text: str):
    x = float(text)
    return x if math.isfinite(x) else _Bad(text)


def _int(text: str):
    # compared as text: Python refuses to convert integers of over 4,300 digits
    if len(text.lstrip("-")) > 19:
        return _Bad(text)
    x = int(text)
    return x if -2 ** 63 <= x < 2 ** 63 else _Bad(text)


def _check_numbers(d, source: str, where: str = "") -> None:
    """One rule for every number of a placement file, in whatever field: finite, and an
    integer within int64. NaN, Infinity, 1e400 and 5,000-digit integers are refused
    alike, naming the field."""
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        field_ = f"{where}[{k!r}]" if where else str(k)
        if isinstance(v, _Bad) or (isinstance(v, float) and not math.isfinite(v)):
            text = str(v) if len(str(v)) <= 24 else f"{str(v)[:12]}... ({len(str(v))} characters)"
            raise PlacementError(f"{source}: {field_}: {text}: numbers in a placement file must be finite, "
                                 "and integers within int64")
        if isinstance(v, (dict, list)):
            _check_numbers(v, source, field_)


def _str_table(d, key, source, required, index_ok=False) -> dict:
    """An op -> device table; ``index_ok``: a device may also be a cluster index (hand-written files)."""
    t = d.get(key)
    if t is None:
        if required:
            raise PlacementError(f"{source}: missing {key!r}: a table of op name -> device")
        return {}
    if not isinstance(t, dict):
        raise PlacementError(f"{source}: {key}: expected a table of op name -> device, got {type(t).__name__}")
    for op, dev in t.items():
        if isinstance(dev, str) or (index_ok and isinstance(dev, int) and not isinstance(dev, bool)):
            continue
        want = "a device name or index" if index_ok else "a string"
        raise PlacementError(f"{source}: {key}[{op!r}]: device must be {want}, got {dev!r}")
    return dict(t)
