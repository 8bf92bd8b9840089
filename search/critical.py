"""The simulated critical path of a placement, and the moves it suggests.

:func:`critical_path` walks back from the op that ends last in a simulated trace: an op
started when its last input arrived (a local producer ended, a control predecessor
ended, or a transfer landed) or, failing that, when the op before it on its device
ended. The walk collects the ops on that chain and the transfers on it (as producer
-> consumer op pairs). :class:`CriticalMoves` turns one such path into neighbour
assignments that can shorten it: pull a transfer's two ends onto one device, move a
critical group to a neighbouring group's device, put a run of consecutive critical
groups on one device, move a critical group off the busiest device, swap a critical
group with one elsewhere, move a connected region of groups around a critical one to a
device its neighbours outside it are on (drawn in proportion to how many are on each).
"""

from __future__ import annotations

import weakref

import numpy as np
from numba import njit


@njit(cache=True)
def _walk(placement, op_start, op_end, in_ptr, in_tensor, tensor_op, cpred_ptr, cpred_src, arrival, dev_prev,
          on_path, comm_src, comm_dst):
    """Fill ``on_path`` (ops) and ``comm_src/dst`` (transfers on the path); returns the
    number of transfers. ``arrival[t * D + d]``: when tensor t landed on device d."""
    n = placement.shape[0]
    D = arrival.shape[0] // max(tensor_op.shape[0], 1)
    v = 0
    for i in range(n):
        if op_end[i] > op_end[v]:
            v = i
    nc = 0
    steps = 0
    while v >= 0 and steps <= n:
        steps += 1
        on_path[v] = True
        s = op_start[v]
        if s <= 0.0:
            break
        d = placement[v]
        eps = 1e-9 * max(1.0, s)
        nxt = -1
        comm = False
        for k in range(in_ptr[v], in_ptr[v + 1]):
            t = in_tensor[k]
            u = tensor_op[t]
            if placement[u] == d:
                if abs(op_end[u] - s) <= eps:
                    nxt = u
                    break
            elif abs(arrival[t * D + d] - s) <= eps:
                nxt = u
                comm = True
                break
        if nxt < 0:
            for k in range(cpred_ptr[v], cpred_ptr[v + 1]):
                u = cpred_src[k]
                if abs(op_end[u] - s) <= eps:
                    nxt = u
                    break
        if nxt < 0:
            u = dev_prev[v]
            if u >= 0 and abs(op_end[u] - s) <= eps:
                nxt = u
        if nxt < 0:  # started when something off the path freed (e.g. a late input): take the latest input
            best = -1.0
            for k in range(in_ptr[v], in_ptr[v + 1]):
                t = in_tensor[k]
                u = tensor_op[t]
                a = op_end[u] if placement[u] == d else arrival[t * D + d]
                if a > best:
                    best, nxt = a, u
                    comm = placement[u] != d
            if dev_prev[v] >= 0 and op_end[dev_prev[v]] > best:
                nxt = dev_prev[v]
                comm = False
        if comm:
            comm_src[nc] = nxt
            comm_dst[nc] = v
            nc += 1
        v = nxt
    return nc


@njit(cache=True)
def _region(start, size, cur, nb_ptr, nb, movable, seen, stamp, out, boundary):
    """Breadth-first from group ``start`` over neighbouring movable groups on its device,
    up to ``size`` of them, into ``out``; returns the count. ``boundary[d]`` counts the
    region's neighbours on each other device d (zeroed by the caller). ``seen`` holds
    ``stamp`` for groups visited in this call, so it is never cleared."""
    d = cur[start]
    out[0] = start
    seen[start] = stamp
    n = 1
    head = 0
    while head < n:
        k = out[head]
        head += 1
        for j in range(nb_ptr[k], nb_ptr[k + 1]):
            h = nb[j]
            if seen[h] == stamp:
                continue
            if cur[h] != d:
                seen[h] = stamp
                boundary[cur[h]] += 1
            elif n < size and movable[h]:
                seen[h] = stamp
                out[n] = h
                n += 1
    return n


_INPUTS = weakref.WeakKeyDictionary()


def _inputs(g):
    """(in_ptr, in_tensor, tensor_op, control-predecessor ptr, sources) of graph ``g``
    as the walk reads them; built once per graph (annealing traces a path per accepted move)."""
    got = _INPUTS.get(g)
    if got is None:
        n, c = g.n_ops, g.csr
        ce = np.flatnonzero(g.edge_tensor < 0)
        co = ce[np.argsort(g.edge_dst[ce], kind="stable")]
        cpred_ptr = np.searchsorted(g.edge_dst[co], np.arange(n + 1)).astype(np.int64)
        got = _INPUTS[g] = (c.in_ptr.astype(np.int64), c.in_tensor.astype(np.int64), g.tensor_op.astype(np.int64),
                            cpred_ptr, g.edge_src[co].astype(np.int64))
    return got


class CriticalPath:
    """The critical path of one simulated placement: ``ops`` (bool per op),
    ``path_ops`` (its ops in the order they started), ``groups`` (critical groups in
    path order, earliest first), ``comm`` ((producer group, consumer group) pairs of the
    transfers on it) and per-device busy time. ``result``: the placement's traced
    :class:`~placetool.costmodel.simulate.SimResult`, where the caller has it already."""

    def __init__(self, cost_model, assignment, result=None):
        g = cost_model.graph
        D = cost_model.n_devices
        r = result if result is not None else cost_model.simulate(np.asarray(assignment, np.int32), trace=True)
        tr = r.trace
        self.step_time_us = r.step_time_us
        self.busy_us = r.busy_us
        n = g.n_ops
        on = np.zeros(n, np.bool_)
        comm_s = np.zeros(n + 1, np.int64)
        comm_d = np.zeros(n + 1, np.int64)
        if tr is not None and n:
            arrival = np.full(max(g.n_tensors, 1) * D, np.inf)
            arrival[tr.x_tensor * D + tr.x_dst] = tr.x_end
            # each op's predecessor on its device, in the order the simulator ran them
            nc = _walk(tr.placement, tr.op_start, tr.op_end, *_inputs(g), arrival, tr.op_prev, on, comm_s, comm_d)
        else:
            nc = 0
        self.ops = on
        path_ops = np.flatnonzero(on)
        order = path_ops[np.argsort(tr.op_start[path_ops], kind="stable")] if len(path_ops) else path_ops
        #: the path's ops in the order they started
        self.path_ops = order
        grp = g.group[order]
        # groups in path order, each once (its first appearance)
        _, first = np.unique(grp, return_index=True)
        self.groups = grp[np.sort(first)].astype(np.int64)
        gs, gd = g.group[comm_s[:nc]], g.group[comm_d[:nc]]
        self.comm = np.stack([gs, gd], axis=1).astype(np.int64) if nc else np.zeros((0, 2), np.int64)
        self.on_group = np.zeros(g.n_groups, np.bool_)
        self.on_group[self.groups] = True

    def still_holds(self, groups, step_time_us) -> bool:
        """Whether to keep guiding by this path after ``groups`` moved and the step time
        came out at ``step_time_us``: none of them was on it and the step is unchanged, so
        it most likely still ends last (a cheap guess, good enough to aim moves by)."""
        return step_time_us == self.step_time_us and not self.on_group[groups].any()

    def moved(self, groups, old, new, group_time) -> None:
        """Shift the per-device busy times by the compute of ``groups``, moved from devices
        ``old`` to ``new`` (their send/receive costs aside)."""
        busy = self.busy_us.copy()
        np.subtract.at(busy, old, group_time[groups, old])
        np.add.at(busy, new, group_time[groups, new])
        self.busy_us = busy


def path_breakdown(cost_model, placement, top: int = 10, result=None) -> dict:
    """Where the simulated critical path of ``placement`` (per op or per group) spends
    the step, in µs: computing, waiting where it changes device (a transfer and its place
    in the link's queue) and any other gap, with the computing per device and the
    ``top`` longest waits (producer and consumer op, their devices, the bytes between
    them, when the wait began). ``start_us + compute_us + transfer_wait_us +
    other_gap_us`` is the step time. ``result``: the placement's traced
    :class:`~placetool.costmodel.simulate.SimResult`, where the caller has it already.

    >>> from placetool.costmodel import CostModel, presets
    >>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))
    >>> b = path_breakdown(cm, cm.single_device("gpu:0"))
    >>> b["device_changes"], b["transfer_wait_us"], round(b["compute_us"]) == round(b["step_time_us"])
    (0, 0.0, True)
    """
    r = result if result is not None else cost_model.simulate(np.asarray(placement, np.int32), trace=True)
    tr = r.trace
    if tr is None:
        raise ValueError("no critical path: the placement is invalid")
    cp = CriticalPath(cost_model, placement, r)
    g, names = cost_model.graph, cost_model.cluster.names
    order = cp.path_ops
    dev = tr.placement[order]
    comp = tr.op_end[order] - tr.op_start[order]
    gaps = tr.op_start[order[1:]] - tr.op_end[order[:-1]]
    cross = dev[1:] != dev[:-1]
    by_dev = np.bincount(dev, weights=comp, minlength=cost_model.n_devices)
    waits = []
    for k in np.flatnonzero(cross)[np.argsort(-gaps[cross], kind="stable")][:top]:
        u, v = int(order[k]), int(order[k + 1])
        ins = g.csr.in_tensor[g.csr.in_ptr[v]:g.csr.in_ptr[v + 1]]
        sent = ins[g.tensor_op[ins] == u]
        waits.append({"wait_us": float(gaps[k]), "from_op": g.names[u], "to_op": g.names[v],
                      "from_device": names[dev[k]], "to_device": names[dev[k + 1]],
                      "bytes": int(g.tensor_bytes[sent].max(initial=0)), "at_us": float(tr.op_end[u])})
    return {"step_time_us": float(cp.step_time_us), "path_ops": int(len(order)),
            "start_us": float(tr.op_start[order[0]]) if len(order) else 0.0,
            "compute_us": float(comp.sum()), "device_changes": int(cross.sum()),
            "transfer_wait_us": float(gaps[cross].sum()), "other_gap_us": float(gaps[~cross].sum()),
            "compute_by_device_us": {names[d]: float(by_dev[d]) for d in range(len(names)) if by_dev[d] > 0},
            "waits": waits}


class CriticalMoves:
    """Neighbour assignments aimed at a critical path (see the module docstring)."""

    KINDS = ("pull", "neighbour", "chain", "offload", "swap", "region")

    def __init__(self, problem, rng, chain_max: int = 8, region_max: int | None = None):
        self.problem = problem
        self.rng = rng
        self.allowed = problem.allowed
        self.movable = problem.allowed.sum(axis=1) >= 2
        self.chain_max = chain_max
        self.nb_ptr, self.nb = problem.neighbours()
        # a region move takes up to region_max groups: by default a share of one device's
        # groups in a balanced split, so it can move a whole stage of a pipeline
        G, D = problem.n_groups, problem.n_devices
        self.region_max = max(2, int(region_max if region_max is not None else G // (2 * D)))
        self._seen = np.zeros(G, np.int64)
        self._stamp = 0
        self._out = np.zeros(G, np.int64)

    def _set(self, a, groups, dev) -> bool:
        """Put every movable group of ``groups`` that may run on ``dev`` there."""
        g = np.atleast_1d(groups)
        g = g[self.movable[g] & self.allowed[g, dev] & (a[g] != dev)]
        a[g] = dev
        return bool(g.size)

    def propose(self, cur, cp: CriticalPath, kind: str):
        """One neighbour of ``cur`` of the given kind, or None when the path offers none."""
        rng = self.rng
        a = cur.copy()
        groups = cp.groups[self.movable[cp.groups]] if len(cp.groups) else cp.groups
        if kind == "pull" and len(cp.comm):
            gs, gd = cp.comm[rng.integers(len(cp.comm))]
            src, dst = (gs, gd) if rng.random() < 0.5 else (gd, gs)
            return a if self._set(a, src, cur[dst]) else None
        if not len(groups):
            return None
        if kind == "neighbour":
            k = groups[rng.integers(len(groups))]
            nb = self.nb[self.nb_ptr[k]:self.nb_ptr[k + 1]]
            devs = np.unique(cur[nb]) if len(nb) else np.arange(self.problem.n_devices)
            devs = devs[(devs != cur[k]) & self.allowed[k, devs]]
            if not len(devs):
                return None
            return a if self._set(a, k, devs[rng.integers(len(devs))]) else None
        if kind == "chain":
            all_g = cp.groups
            L = int(rng.integers(2, self.chain_max + 1))
            i = int(rng.integers(max(1, len(all_g) - L + 1)))
            seg = all_g[i:i + L]
            dev = cur[seg[rng.integers(len(seg))]]
            return a if self._set(a, seg, dev) else None
        if kind == "offload":
            on_busy = groups[cur[groups] == int(np.argmax(cp.busy_us))]
            if not len(on_busy):
                return None
            k = on_busy[rng.integers(len(on_busy))]
            load = np.where(self.allowed[k], cp.busy_us, np.inf)
            load[cur[k]] = np.inf
            dev = int(np.argmin(load))
            return a if np.isfinite(load[dev]) and self._set(a, k, dev) else None
        if kind == "region":
            # a connected region around a critical group, of log-uniform size, joins a device
            # its outside neighbours are on, drawn by their count (large moves, few new transfers)
            k = groups[rng.integers(len(groups))]
            size = int(2 ** rng.uniform(1, np.log2(self.region_max) + 1e-9))
            self._stamp += 1
            boundary = np.zeros(self.problem.n_devices, np.int64)
            n = _region(k, size, cur, self.nb_ptr, self.nb, self.movable, self._seen, self._stamp, self._out, boundary)
            boundary[~self.allowed[k]] = 0
            if boundary.sum() == 0:
                devs = np.flatnonzero(self.allowed[k])
                devs = devs[devs != cur[k]]
                if not len(devs):
                    return None
                dev = devs[rng.integers(len(devs))]
            else:
                dev = int(rng.choice(len(boundary), p=boundary / boundary.sum()))
            return a if self._set(a, self._out[:n], dev) else None
        if kind == "swap":
            k = groups[rng.integers(len(groups))]
            for _ in range(8):
                h = int(rng.integers(self.problem.n_groups))
                if (cur[h] != cur[k] and self.movable[h] and self.allowed[k, cur[h]]
                        and self.allowed[h, cur[k]]):
                    a[k], a[h] = cur[h], cur[k]
                    return a
        return None
