"""OpGraph: a dataflow graph held as contiguous numpy arrays plus names.

Ops keep a fixed order (the order they were given in). Every op produces zero or more
tensors; a data edge consumes one tensor, a control edge carries nothing. Groups are
sets of ops that must share a device; every op belongs to exactly one group (a
singleton unless told otherwise). Pinned ops may only run on some device kinds.

Units: bytes (int64), FLOPs (float64).
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import UserError, atomic_write

FORMAT = "placetool.opgraph"
VERSION = 1

#: Bit for each device kind in ``OpGraph.allowed``.
KIND_BITS = {"cpu": 1, "gpu": 2}
ALL_KINDS = 3


class GraphError(UserError):
    """A graph is malformed; the message names the op or field."""


def kinds_mask(kinds) -> int:
    """Bit mask of a list of device kinds, e.g. ``["cpu"] -> 1``."""
    mask = 0
    for k in kinds:
        if k not in KIND_BITS:
            raise GraphError(f"unknown device kind {k!r} (expected one of {sorted(KIND_BITS)})")
        mask |= KIND_BITS[k]
    return mask


def mask_kinds(mask: int) -> list[str]:
    return [k for k, b in KIND_BITS.items() if mask & b]


@dataclass(eq=False)
class OpGraph:
    """A dataflow graph; build with :meth:`from_arrays`, :meth:`from_networkx` or :func:`load`.

    Per op (length ``n_ops``): ``names``, ``op_types``, ``out_bytes`` (all outputs),
    ``param_bytes`` (persistent, e.g. variables), ``flops``, ``group`` (dense ids
    0..n_groups-1), ``allowed`` (bit mask of device kinds, see ``KIND_BITS``), ``layer``
    (a model-level tag used by the expert heuristic, -1 where untagged).
    Per tensor: ``tensor_op`` (producer, sorted), ``tensor_bytes``.
    Per edge: ``edge_src``, ``edge_dst``, ``edge_tensor`` (-1 for control edges),
    ``edge_bytes`` (0 for control edges).
    """

    name: str
    names: list[str]
    op_types: list[str]
    out_bytes: np.ndarray
    param_bytes: np.ndarray
    flops: np.ndarray
    group: np.ndarray
    allowed: np.ndarray
    layer: np.ndarray
    tensor_op: np.ndarray
    tensor_bytes: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_tensor: np.ndarray
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_arrays(
        cls,
        name,
        names,
        op_types,
        out_bytes,
        edge_src,
        edge_dst,
        edge_tensor=None,
        tensor_op=None,
        tensor_bytes=None,
        param_bytes=None,
        flops=None,
        group=None,
        allowed=None,
        layer=None,
        meta=None,
    ) -> "OpGraph":
        """Build and validate a graph from plain arrays.

        Without ``tensor_op`` every op has one output tensor of ``out_bytes`` and every
        edge (unless ``edge_tensor`` says -1) consumes it. ``group`` may hold any ids;
        they are renumbered densely in order of first appearance.
        """
        n = len(names)
        names = [str(s) for s in names]
        op_types = [str(s) for s in op_types]
        out_bytes = _arr(out_bytes, np.int64, n, "out_bytes")
        edge_src = np.ascontiguousarray(edge_src, dtype=np.int32).reshape(-1)
        edge_dst = np.ascontiguousarray(edge_dst, dtype=np.int32).reshape(-1)
        if tensor_op is None:
            tensor_op = np.arange(n, dtype=np.int32)
            tensor_bytes = out_bytes.copy()
            et = edge_src.copy() if edge_tensor is None else np.asarray(edge_tensor, np.int32)
            if edge_tensor is not None:
                et = np.where(et < 0, -1, edge_src).astype(np.int32)
            edge_tensor = et
        tensor_op = np.ascontiguousarray(tensor_op, dtype=np.int32)
        tensor_bytes = _arr(tensor_bytes, np.int64, len(tensor_op), "tensor_bytes")
        edge_tensor = np.ascontiguousarray(edge_tensor, dtype=np.int32)
        g = cls(
            name=str(name),
            names=names,
            op_types=op_types,
            out_bytes=out_bytes,
            param_bytes=_arr(param_bytes, np.int64, n, "param_bytes"),
            flops=_arr(flops, np.float64, n, "flops"),
            group=_dense_groups(group, n),
            allowed=_arr(allowed, np.uint8, n, "allowed", fill=ALL_KINDS),
            layer=_arr(layer, np.int32, n, "layer", fill=-1),
            tensor_op=tensor_op,
            tensor_bytes=tensor_bytes,
            edge_src=edge_src,
            edge_dst=edge_dst,
            edge_tensor=edge_tensor,
            meta=dict(meta or {}),
        )
        g.validate()
        return g

    @classmethod
    def from_networkx(cls, g, name: str | None = None) -> "OpGraph":
        """Build from a ``networkx.DiGraph``; ops keep the node insertion order.

        Node attributes: ``op_type``, ``out_bytes`` (required); ``param_bytes``,
        ``flops``, ``group`` (any hashable label), ``kinds`` (allowed device kinds,
        e.g. ``["cpu"]``), ``layer`` (optional). Edge attributes: ``bytes`` (defaults to
        the producer's ``out_bytes``), ``output`` (which output of the producer, default
        0; edges of one output share one tensor), ``control`` (True: a control edge).

        >>> import networkx as nx
        >>> g = nx.DiGraph()
        >>> g.add_node("x", op_type="Placeholder", out_bytes=400)
        >>> g.add_node("y", op_type="Relu", out_bytes=400)
        >>> g.add_edge("x", "y")
        >>> OpGraph.from_networkx(g, "tiny").n_edges
        1
        """
        nodes = list(g.nodes)
        index = {v: i for i, v in enumerate(nodes)}
        op_types, out_bytes, param_bytes, flops, group, allowed, layer = [], [], [], [], [], [], []
        for v in nodes:
            a = g.nodes[v]
            for key in ("op_type", "out_bytes"):
                if key not in a:
                    raise GraphError(f"op {v!r}: missing node attribute {key!r}")
            op_types.append(a["op_type"])
            out_bytes.append(a["out_bytes"])
            param_bytes.append(a.get("param_bytes", 0))
            flops.append(a.get("flops", 0.0))
            group.append(a["group"] if a.get("group") is not None else ("\0op", v))
            allowed.append(kinds_mask(a["kinds"]) if a.get("kinds") else ALL_KINDS)
            layer.append(a.get("layer", -1))

        tensors: dict[tuple[int, int], int] = {}
        t_op, t_bytes, e_src, e_dst, e_t = [], [], [], [], []
        for u, v, a in sorted(g.edges(data=True), key=lambda e: (index[e[0]], index[e[1]])):
            s, d = index[u], index[v]
            e_src.append(s)
            e_dst.append(d)
            if a.get("control", False):
                e_t.append(-1)
                continue
            b = int(a.get("bytes", out_bytes[s]))
            key = (s, int(a.get("output", 0)))
            if key not in tensors:
                tensors[key] = len(t_op)
                t_op.append(s)
                t_bytes.append(b)
            elif t_bytes[tensors[key]] != b:
                raise GraphError(
                    f"op {u!r}: edges of output {key[1]} disagree on bytes "
                    f"({t_bytes[tensors[key]]} vs {b}); give them distinct 'output' attributes"
                )
            e_t.append(tensors[key])
        # Tensors must be sorted by producer; edges were visited in producer order.
        return cls.from_arrays(
            name or g.graph.get("name", "graph"),
            [str(v) for v in nodes],
            op_types,
            out_bytes,
            e_src,
            e_dst,
            edge_tensor=e_t,
            tensor_op=np.asarray(t_op, np.int32),
            tensor_bytes=np.asarray(t_bytes, np.int64),
            param_bytes=param_bytes,
            flops=flops,
            group=group,
            allowed=allowed,
            layer=layer,
            meta=dict(g.graph.get("meta", {})),
        )

    def to_networkx(self):
        """The graph as a ``networkx.DiGraph`` with the attributes of :meth:`from_networkx`."""
        import networkx as nx

        g = nx.DiGraph(name=self.name, meta=dict(self.meta))
        out_index = self.tensor_output_index
        for i, v in enumerate(self.names):
            attrs = dict(
                op_type=self.op_types[i],
                out_bytes=int(self.out_bytes[i]),
                param_bytes=int(self.param_bytes[i]),
                flops=float(self.flops[i]),
                group=int(self.group[i]),
                layer=int(self.layer[i]),
            )
            if self.allowed[i] != ALL_KINDS:
                attrs["kinds"] = mask_kinds(int(self.allowed[i]))
            g.add_node(v, **attrs)
        for s, d, t in zip(self.edge_src, self.edge_dst, self.edge_tensor):
            if t < 0:
                g.add_edge(self.names[s], self.names[d], control=True, bytes=0)
            else:
                g.add_edge(
                    self.names[s], self.names[d],
                    bytes=int(self.tensor_bytes[t]), output=int(out_index[t]),
                )
        return g

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise :class:`GraphError` naming the op if the graph is malformed."""
        n, nt = self.n_ops, len(self.tensor_op)
        if len(self.op_types) != n:
            raise GraphError(f"graph {self.name!r}: {len(self.op_types)} op types for {n} ops")
        if len(set(self.names)) != n:
            seen = set()
            for v in self.names:
                if v in seen:
                    raise GraphError(f"op {v!r}: duplicate op name")
                seen.add(v)
        for field_name in ("out_bytes", "param_bytes", "tensor_bytes"):
            a = getattr(self, field_name)
            bad = np.flatnonzero(a < 0)
            if bad.size:
                i = bad[0] if field_name != "tensor_bytes" else self.tensor_op[bad[0]]
                raise GraphError(f"op {self.names[i]!r}: negative {field_name} ({a[bad[0]]})")
        bad = np.flatnonzero(~np.isfinite(self.flops) | (self.flops < 0))
        if bad.size:
            raise GraphError(f"op {self.names[bad[0]]!r}: flops must be finite and >= 0")
        bad = np.flatnonzero((self.allowed & ALL_KINDS) == 0)
        if bad.size:
            raise GraphError(f"op {self.names[bad[0]]!r}: no device kind allowed")
        if nt and (self.tensor_op.min() < 0 or self.tensor_op.max() >= n):
            raise GraphError(f"graph {self.name!r}: tensor produced by a missing op")
        if nt and np.any(np.diff(self.tensor_op) < 0):
            raise GraphError(f"graph {self.name!r}: tensors must be sorted by producer op")
        ne = len(self.edge_src)
        if len(self.edge_dst) != ne or len(self.edge_tensor) != ne:
            raise GraphError(f"graph {self.name!r}: edge arrays differ in length")
        for arr, what in ((self.edge_src, "source"), (self.edge_dst, "destination")):
            bad = np.flatnonzero((arr < 0) | (arr >= n))
            if bad.size:
                other = self.edge_dst if what == "source" else self.edge_src
                o = other[bad[0]]
                who = f"op {self.names[o]!r}" if 0 <= o < n else f"edge {bad[0]}"
                raise GraphError(f"{who}: dangling edge ({what} op index {arr[bad[0]]} does not exist)")
        data = self.edge_tensor >= 0
        if np.any(self.edge_tensor >= nt):
            e = int(np.flatnonzero(self.edge_tensor >= nt)[0])
            raise GraphError(f"op {self.names[self.edge_dst[e]]!r}: consumes a tensor that does not exist")
        wrong = np.zeros(ne, bool)
        wrong[data] = self.tensor_op[self.edge_tensor[data]] != self.edge_src[data]
        if np.any(wrong):
            e = int(np.flatnonzero(wrong)[0])
            raise GraphError(
                f"op {self.names[self.edge_dst[e]]!r}: edge from {self.names[self.edge_src[e]]!r} "
                "names a tensor that op does not produce"
            )
        self_loop = np.flatnonzero(self.edge_src == self.edge_dst)
        if self_loop.size:
            raise GraphError(f"op {self.names[self.edge_src[self_loop[0]]]!r}: edge to itself (cycle)")
        order = _topo_order(n, self.edge_src, self.edge_dst)
        if len(order) < n:
            placed = np.zeros(n, bool)
            placed[order] = True
            stuck = [self.names[i] for i in np.flatnonzero(~placed)[:5]]
            raise GraphError(f"graph {self.name!r} has a cycle through op(s) {', '.join(map(repr, stuck))}")
        gmask = np.full(self.n_groups, ALL_KINDS, np.uint8)
        np.bitwise_and.at(gmask, self.group, self.allowed)
        bad = np.flatnonzero(gmask == 0)
        if bad.size:
            ops = [self.names[i] for i in np.flatnonzero(self.group == bad[0])[:4]]
            raise GraphError(f"group of ops {ops}: no device kind can run all of them")

    # ---------------------------------------------------------------- properties
    @property
    def n_ops(self) -> int:
        return len(self.names)

    @property
    def n_edges(self) -> int:
        return len(self.edge_src)

    @property
    def n_tensors(self) -> int:
        return len(self.tensor_op)

    @cached_property
    def n_groups(self) -> int:
        return int(self.group.max()) + 1 if self.n_ops else 0

    @cached_property
    def edge_bytes(self) -> np.ndarray:
        """Bytes carried by each edge (0 for control edges)."""
        t = self.edge_tensor
        if self.n_tensors == 0:  # control edges only
            return np.zeros(len(t), np.int64)
        return np.where(t >= 0, self.tensor_bytes[np.maximum(t, 0)], 0).astype(np.int64)

    @cached_property
    def index(self) -> dict[str, int]:
        """Op name -> op index."""
        return {v: i for i, v in enumerate(self.names)}

    @cached_property
    def topo_order(self) -> np.ndarray:
        """A topological order; among ready ops the smallest index comes first."""
        return _topo_order(self.n_ops, self.edge_src, self.edge_dst)

    @cached_property
    def topo_rank(self) -> np.ndarray:
        """Position of each op in :attr:`topo_order` (the simulator's tie-breaker)."""
        rank = np.empty(self.n_ops, np.int32)
        rank[self.topo_order] = np.arange(self.n_ops, dtype=np.int32)
        return rank

    @cached_property
    def group_allowed(self) -> np.ndarray:
        """Device-kind mask of each group (what every op in it allows)."""
        m = np.full(self.n_groups, ALL_KINDS, np.uint8)
        np.bitwise_and.at(m, self.group, self.allowed)
        return m

    @cached_property
    def group_ops(self) -> list[np.ndarray]:
        """Op indices of each group."""
        order = np.argsort(self.group, kind="stable")
        bounds = np.searchsorted(self.group[order], np.arange(self.n_groups + 1))
        return [order[bounds[k]:bounds[k + 1]] for k in range(self.n_groups)]

    @cached_property
    def group_first(self) -> np.ndarray:
        """int64 [groups]: the first op of each group (what stands for the group)."""
        return np.array([ops[0] for ops in self.group_ops], np.int64)

    @cached_property
    def in_bytes(self) -> np.ndarray:
        """Bytes each op reads: the sum of its distinct input tensors."""
        data = self.edge_tensor >= 0
        pairs = np.unique(np.stack([self.edge_dst[data], self.edge_tensor[data]]), axis=1)
        out = np.zeros(self.n_ops, np.int64)
        np.add.at(out, pairs[0], self.tensor_bytes[pairs[1]])
        return out

    @cached_property
    def tensor_output_index(self) -> np.ndarray:
        """For each tensor, its output slot on its producer (0, 1, ...)."""
        nt = self.n_tensors
        first = np.searchsorted(self.tensor_op, self.tensor_op, side="left")
        return (np.arange(nt) - first).astype(np.int32)

    @cached_property
    def successors(self) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, dst): op v's successors over all edges are dst[ptr[v]:ptr[v+1]]."""
        order = np.argsort(self.edge_src, kind="stable")
        ptr = np.searchsorted(self.edge_src[order], np.arange(self.n_ops + 1)).astype(np.int64)
        return ptr, np.ascontiguousarray(self.edge_dst[order], np.int64)

    @cached_property
    def csr(self) -> "GraphCSR":
        """Adjacency in the compressed layouts the simulator kernels read."""
        return GraphCSR.build(self)

    def to_placement(self, group_assignment) -> np.ndarray:
        """Per-op placement from a per-group device assignment."""
        a = np.asarray(group_assignment)
        if a.shape != (self.n_groups,):
            raise ValueError(f"group assignment has shape {a.shape}, expected ({self.n_groups},)")
        return np.ascontiguousarray(a[self.group], dtype=np.int32)

    def to_assignment(self, placement) -> np.ndarray:
        """Per-group device assignment of a per-op placement (each group's first op's
        device; the inverse of :meth:`to_placement` for a placement that splits no group)."""
        p = np.asarray(placement)
        if p.shape != (self.n_ops,):
            raise ValueError(f"placement has shape {p.shape}, expected ({self.n_ops},)")
        return np.ascontiguousarray(p[self.group_first], dtype=np.int32)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "ops": self.n_ops,
            "edges": self.n_edges,
            "control_edges": int((self.edge_tensor < 0).sum()),
            "tensors": self.n_tensors,
            "groups": self.n_groups,
            "pinned_ops": int((self.allowed != ALL_KINDS).sum()),
            "total_flops": float(self.flops.sum()),
            "param_bytes": int(self.param_bytes.sum()),
            "out_bytes": int(self.out_bytes.sum()),
        }

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, ops={self.n_ops}, edges={self.n_edges}, groups={self.n_groups})"

    # ---------------------------------------------------------------------- I/O
    @classmethod
    def load(cls, path) -> "OpGraph":
        """Read a graph written by :meth:`save` (same checks as :func:`load`)."""
        return load(path)

    def save(self, path) -> None:
        """Write the versioned compressed format (``.npz``); atomic (no half-written file)."""
        path = Path(path)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "meta": self.meta,
        }
        types = sorted(set(self.op_types))
        tcode = {t: i for i, t in enumerate(types)}
        arrays = {
            "names": _pack_strings(self.names),
            "type_vocab": _pack_strings(types),
            "op_type_code": np.array([tcode[t] for t in self.op_types], np.int32),
            "out_bytes": self.out_bytes,
            "param_bytes": self.param_bytes,
            "flops": self.flops,
            "group": self.group,
            "allowed": self.allowed,
            "layer": self.layer,
            "tensor_op": self.tensor_op,
            "tensor_bytes": self.tensor_bytes,
            "edge_src": self.edge_src,
            "edge_dst": self.edge_dst,
            "edge_tensor": self.edge_tensor,
        }
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("meta.json", json.dumps(meta))
            for k, a in arrays.items():
                b = io.BytesIO()
                np.save(b, np.ascontiguousarray(a), allow_pickle=False)
                z.writestr(k + ".npy", b.getvalue())
        atomic_write(path, buf.getvalue())


#: stored arrays: name -> numpy kinds it may have (i: signed, u: unsigned, f: float)
_ARRAY_KINDS = {
    "names": "u", "type_vocab": "u", "op_type_code": "iu", "out_bytes": "iu", "param_bytes": "iu",
    "flops": "iuf", "group": "iu", "allowed": "iu", "layer": "iu", "tensor_op": "iu",
    "tensor_bytes": "iu", "edge_src": "iu", "edge_dst": "iu", "edge_tensor": "iu",
}
_REQUIRED = ("names", "type_vocab", "op_type_code", "out_bytes", "edge_src", "edge_dst")


def load(path) -> OpGraph:
    """Read a graph written by :meth:`OpGraph.save`.

    Every kind of damage (a cut-short or bit-flipped file, a member that is not a plain
    numeric array, wrong meta data, a graph with no ops) is a one-line
    :class:`GraphError` naming the file; pickled arrays are never loaded.
    """
    path = Path(path)
    if path.is_dir():
        raise GraphError(f"{path}: is a folder, not a graph file")
    try:
        meta, a = _read_members(path)
    except FileNotFoundError:
        raise GraphError(f"{path}: no such graph file") from None
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from None
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, KeyError, TypeError,
            UnicodeDecodeError, OverflowError, NotImplementedError, RuntimeError) as e:
        # zip headers, deflate streams, CRCs, npy headers: all say "damaged"
        raise GraphError(f"{path}: damaged or not a placetool graph file ({type(e).__name__}: "
                         f"{' '.join(str(e).split())})") from None
    try:
        names = _unpack_strings(a["names"])
        vocab = _unpack_strings(a["type_vocab"])
        codes = a["op_type_code"]
        if len(codes) != len(names):
            raise GraphError(f"field 'op_type_code' has {len(codes)} entries for {len(names)} ops")
        if len(codes) and (codes.min() < 0 or codes.max() >= len(vocab)):
            raise GraphError("field 'op_type_code' names an op type that is not in 'type_vocab'")
        if not names:
            raise GraphError("the graph has no ops")
        return OpGraph.from_arrays(
            meta.get("name", path.stem),
            names,
            [vocab[c] for c in codes.tolist()],
            a["out_bytes"],
            _index_array(a["edge_src"], "edge_src"),
            _index_array(a["edge_dst"], "edge_dst"),
            edge_tensor=_index_array(a.get("edge_tensor"), "edge_tensor"),
            tensor_op=_index_array(a.get("tensor_op"), "tensor_op"),
            tensor_bytes=a.get("tensor_bytes"),
            param_bytes=a.get("param_bytes"),
            flops=a.get("flops"),
            group=a.get("group"),
            allowed=_index_array(a.get("allowed"), "allowed"),
            layer=_index_array(a.get("layer"), "layer"),
            meta=meta.get("meta", {}),
        )
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from None
    except UnicodeDecodeError as e:
        raise GraphError(f"{path}: damaged op or type names ({e.reason} at byte {e.start})") from None


def _read_members(path: Path) -> tuple[dict, dict]:
    """meta.json and the arrays of a graph file, each checked for shape and kind."""
    with zipfile.ZipFile(path) as z:
        try:
            raw = z.read("meta.json")
        except KeyError:
            raise GraphError("missing meta.json") from None
        try:
            meta = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise GraphError(f"malformed meta.json ({e})") from None
        if not isinstance(meta, dict):
            raise GraphError("meta.json is not an object")
        if meta.get("format") != FORMAT:
            raise GraphError(f"format {meta.get('format')!r} is not {FORMAT!r}")
        if meta.get("version") != VERSION:
            raise GraphError(f"unknown {FORMAT} version {meta.get('version')!r} (this placetool reads {VERSION})")
        if not isinstance(meta.get("name", ""), str):
            raise GraphError("meta.json: 'name' is not a string")
        if not isinstance(meta.get("meta", {}), dict):
            raise GraphError("meta.json: 'meta' is not an object")
        a = {}
        for name in z.namelist():
            key = name[:-4]
            if not name.endswith(".npy") or key not in _ARRAY_KINDS:
                continue
            arr = np.load(io.BytesIO(z.read(name)), allow_pickle=False)
            if arr.ndim != 1 or arr.dtype.kind not in _ARRAY_KINDS[key]:
                raise GraphError(f"field {key!r} is a {arr.ndim}-D {arr.dtype} array, "
                                 f"not a 1-D array of {'bytes' if key in ('names', 'type_vocab') else 'numbers'}")
            a[key] = arr
    for k in _REQUIRED:
        if k not in a:
            raise GraphError(f"missing field {k!r}")
    return meta, a


def _index_array(a, name):
    """An integer array that must fit int32 (op, tensor and group indices, codes)."""
    if a is None:
        return None
    if len(a) and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
        raise GraphError(f"field {name!r} holds values out of range")
    return a


# ------------------------------------------------------------------------- CSR
@dataclass(frozen=True)
class GraphCSR:
    """Compressed adjacency for the kernels (all int32/int64, contiguous).

    - ``op_tensor_ptr[op]..[op+1]``: the tensors op produces (tensors are sorted by op).
    - ``tensor_ptr[t]..[t+1]`` into ``tensor_cons``: consumer ops of tensor t, one per
      data edge, in edge order.
    - ``ctrl_ptr[op]..[op+1]`` into ``ctrl_dst``: control successors of op.
    - ``in_ptr[op]..[op+1]`` into ``in_tensor``: tensors op consumes, one per data edge.
    - ``n_inputs[op]``: number of edges (data and control) into op.
    """

    op_tensor_ptr: np.ndarray
    tensor_ptr: np.ndarray
    tensor_cons: np.ndarray
    ctrl_ptr: np.ndarray
    ctrl_dst: np.ndarray
    in_ptr: np.ndarray
    in_tensor: np.ndarray
    n_inputs: np.ndarray

    @classmethod
    def build(cls, g: OpGraph) -> "GraphCSR":
        n, nt = g.n_ops, g.n_tensors
        data = np.flatnonzero(g.edge_tensor >= 0)
        ctrl = np.flatnonzero(g.edge_tensor < 0)
        op_tensor_ptr = np.searchsorted(g.tensor_op, np.arange(n + 1)).astype(np.int64)
        et = g.edge_tensor[data]
        o = data[np.argsort(et, kind="stable")]
        tensor_ptr = np.searchsorted(g.edge_tensor[o], np.arange(nt + 1)).astype(np.int64)
        oc = ctrl[np.argsort(g.edge_src[ctrl], kind="stable")]
        ctrl_ptr = np.searchsorted(g.edge_src[oc], np.arange(n + 1)).astype(np.int64)
        oi = data[np.argsort(g.edge_dst[data], kind="stable")]
        in_ptr = np.searchsorted(g.edge_dst[oi], np.arange(n + 1)).astype(np.int64)
        return cls(
            op_tensor_ptr=op_tensor_ptr,
            tensor_ptr=tensor_ptr,
            tensor_cons=np.ascontiguousarray(g.edge_dst[o], np.int32),
            ctrl_ptr=ctrl_ptr,
            ctrl_dst=np.ascontiguousarray(g.edge_dst[oc], np.int32),
            in_ptr=in_ptr,
            in_tensor=np.ascontiguousarray(g.edge_tensor[oi], np.int32),
            n_inputs=np.bincount(g.edge_dst, minlength=n).astype(np.int32),
        )


# --------------------------------------------------------------------- helpers
def _arr(a, dtype, n, name, fill=0):
    if a is None:
        return np.full(n, fill, dtype)
    out = np.ascontiguousarray(a, dtype=dtype).reshape(-1)
    if len(out) != n:
        raise GraphError(f"field {name!r} has {len(out)} entries for {n} ops")
    return out


def _dense_groups(group, n) -> np.ndarray:
    if group is None:
        return np.arange(n, dtype=np.int32)
    if isinstance(group, np.ndarray) and group.dtype.kind in "iu":
        _, inv = np.unique(group, return_index=False, return_inverse=True)
        # renumber in order of first appearance so ids follow op order
        first = np.full(inv.max() + 1 if n else 0, n, np.int64)
        np.minimum.at(first, inv, np.arange(n))
        rank = np.empty_like(first)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        return np.ascontiguousarray(rank[inv], np.int32)
    ids: dict = {}
    out = np.empty(n, np.int32)
    for i, label in enumerate(group):
        out[i] = ids.setdefault(label, len(ids))
    if len(group) != n:
        raise GraphError(f"field 'group' has {len(group)} entries for {n} ops")
    return out


def _topo_order(n, src, dst) -> np.ndarray:
    """Kahn's algorithm, smallest index first among ready ops (deterministic)."""
    import heapq

    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    order_e = np.argsort(src, kind="stable")
    ptr = np.searchsorted(src[order_e], np.arange(n + 1))
    succ = dst[order_e]
    heap = np.flatnonzero(indeg == 0).tolist()
    heapq.heapify(heap)
    out = []
    indeg = indeg.tolist()
    ptr = ptr.tolist()
    succ = succ.tolist()
    while heap:
        v = heapq.heappop(heap)
        out.append(v)
        for k in range(ptr[v], ptr[v + 1]):
            w = succ[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, w)
    return np.asarray(out, dtype=np.int32)


def _pack_strings(strings) -> np.ndarray:
    return np.frombuffer("\n".join(strings).encode("utf-8"), dtype=np.uint8)


def _unpack_strings(a) -> list[str]:
    s = bytes(np.asarray(a, np.uint8)).decode("utf-8")
    return s.split("\n") if s else []
