"""A placement problem and the facts about its groups that methods share.

:class:`Problem` is a CostModel with its co-location groups and the devices each group
may use; the functions below (accelerators, fallback devices, estimated group memory,
group compute times, the group graph's traffic) read a problem and nothing else, and are
shared by the partitioners, list schedulers, expert placements, annealing and rl.
"""

from __future__ import annotations

import numpy as np

from .errors import SearchError


# ----------------------------------------------------------------- problem
class Problem:
    """A placement problem: a CostModel, its groups and which devices each group may use.

    A solution is a *group assignment*: an int array with one device index per group.
    """

    def __init__(self, cost_model):
        self.cost_model = cost_model
        g, cl = cost_model.graph, cost_model.cluster
        self.graph, self.cluster = g, cl
        self.n_groups, self.n_devices = g.n_groups, cl.n_devices
        #: (groups x devices) bool: the device kind can run every op of the group
        self.allowed = np.ascontiguousarray(cost_model.group_device_ok)
        #: persistent bytes of each group (parameters)
        self.group_param_bytes = np.bincount(g.group, weights=g.param_bytes, minlength=self.n_groups).astype(np.int64)
        #: compute time of each group on each device (sum of its ops' T; inf where no kernel)
        T = np.where(np.isfinite(cost_model.T), cost_model.T, 0.0)
        self.group_time = np.zeros((self.n_groups, self.n_devices))
        np.add.at(self.group_time, g.group, T)
        self.group_time[~self.allowed] = np.inf
        self._check_fits()

    @classmethod
    def preset(cls, instance: str) -> Problem:
        """The problem of a bundled graph on a bundled cluster, named ``"GRAPH/CLUSTER"``.

        >>> Problem.preset("synthetic-40/k80x2").n_devices
        3
        """
        from placetool.costmodel import CostModel, presets

        graph, sep, cluster = instance.partition("/")
        if not sep or not graph or not cluster or "/" in cluster:
            raise SearchError(f"{instance!r}: an instance is GRAPH/CLUSTER, e.g. gnmt8/k40x8")
        return cls(CostModel(presets.load_graph(graph), presets.load_cluster(cluster)))

    def _check_fits(self) -> None:
        cap = self.cost_model.capacity
        reason = self.cost_model.stranded()
        if reason is not None:
            raise SearchError(reason)
        best_cap = np.where(self.allowed, cap[None, :], 0).max(axis=1)
        too_big = np.flatnonzero(self.group_param_bytes > best_cap)
        if too_big.size:
            k = int(too_big[0])
            op = self.graph.names[self.graph.group_ops[k][0]]
            raise SearchError(
                f"cluster {self.cluster.name!r} cannot hold the parameters of the group of op {op!r} "
                f"({int(self.group_param_bytes[k]):,} bytes) on any device it may use"
            )
        if self.group_param_bytes.sum() > cap.sum():
            raise SearchError(
                f"cluster {self.cluster.name!r} has {int(cap.sum()):,} bytes of memory in all, less than "
                f"the graph's {int(self.group_param_bytes.sum()):,} parameter bytes: no placement fits"
            )

    def placement(self, assignment) -> np.ndarray:
        """Per-op placement of a group assignment."""
        return self.graph.to_placement(assignment)

    def is_valid(self, assignment) -> bool:
        """Every group on a device that may run it."""
        a = np.asarray(assignment)
        return a.shape == (self.n_groups,) and bool(np.all(self.allowed[np.arange(self.n_groups), a]))

    def random_assignment(self, rng: np.random.Generator) -> np.ndarray:
        """A uniformly random valid assignment."""
        u = rng.random((self.n_groups, self.n_devices)) * self.allowed
        return np.argmax(u, axis=1).astype(np.int32)

    def lower_bounds(self) -> dict:
        """The lower bounds of :func:`placetool.search.bounds.lower_bound` (µs), computed once."""
        if getattr(self, "_bounds", None) is None:
            from .bounds import lower_bound

            self._bounds = lower_bound(self)
        return self._bounds

    def traffic(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`group_edges` of this problem, computed once (read only: the
        partitioners, the guided moves and rl's prior all read it)."""
        if getattr(self, "_traffic", None) is None:
            edges = group_edges(self)
            for x in edges:
                x.flags.writeable = False
            self._traffic = edges
        return self._traffic

    def neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """Each group's neighbours in :meth:`traffic` as CSR, computed once (read only):
        ``nb[nb_ptr[g]:nb_ptr[g + 1]]``, a pair linked both ways listed twice."""
        if getattr(self, "_neighbours", None) is None:
            s, d, _ = self.traffic()
            src, dst = np.concatenate([s, d]), np.concatenate([d, s])
            o = np.argsort(src, kind="stable")
            nb_ptr = np.searchsorted(src[o], np.arange(self.n_groups + 1)).astype(np.int64)
            nb = np.ascontiguousarray(dst[o], np.int64)
            for x in (nb_ptr, nb):
                x.flags.writeable = False
            self._neighbours = nb_ptr, nb
        return self._neighbours

    def lower_bound_us(self) -> float:
        """The best lower bound on the step time of any placement (µs)."""
        return self.lower_bounds()["best"]


# ------------------------------------------------------------------ groups
def accelerators(problem) -> np.ndarray:
    """Indices of the GPU devices (all devices when the cluster has no GPU)."""
    k = np.array([kind == "gpu" for kind in problem.cluster.kinds])
    return np.flatnonzero(k) if k.any() else np.arange(problem.n_devices)


def fallback_device(problem) -> np.ndarray:
    """For each group, the device it goes to when it cannot use the chosen accelerator:
    the first CPU it may use, else the first device it may use."""
    cpu = np.array([kind == "cpu" for kind in problem.cluster.kinds])
    pref = problem.allowed & cpu[None, :]
    has = pref.any(axis=1)
    return np.where(has, np.argmax(pref, axis=1), np.argmax(problem.allowed, axis=1)).astype(np.int32)


def group_memory_bytes(problem) -> np.ndarray:
    """Estimated bytes a group needs on its device: its parameters plus all its ops'
    outputs (an upper bound on its own working set: the simulator frees outputs once
    consumed, so real peaks are lower)."""
    g = problem.graph
    out = np.bincount(g.group, weights=g.out_bytes, minlength=problem.n_groups)
    return (problem.group_param_bytes + out).astype(np.int64)


def gpu_group_time(problem) -> np.ndarray:
    """Compute time of each group on the fastest accelerator that may run it (µs);
    the fastest device it may use when no accelerator may."""
    acc = accelerators(problem)
    t = problem.group_time[:, acc].min(axis=1)
    return np.where(np.isfinite(t), t, problem.group_time.min(axis=1))


def group_edges(problem):
    """Directed group-to-group traffic: (src group, dst group, bytes) with src != dst.

    A tensor is counted once per consuming group (the simulator sends it once per
    destination device, and a group is one device).
    """
    g = problem.graph
    data = g.edge_tensor >= 0
    t = g.edge_tensor[data]
    dg = g.group[g.edge_dst[data]].astype(np.int64)
    pairs = np.unique(np.stack([t.astype(np.int64), dg]), axis=1)
    sg = g.group[g.tensor_op[pairs[0]]].astype(np.int64)
    b = g.tensor_bytes[pairs[0]]
    keep = sg != pairs[1]
    sg, dg, b = sg[keep], pairs[1][keep], b[keep]
    G = problem.n_groups
    key = sg * G + dg
    uk, inv = np.unique(key, return_inverse=True)
    w = np.bincount(inv, weights=b, minlength=len(uk))
    return (uk // G).astype(np.int64), (uk % G).astype(np.int64), w
