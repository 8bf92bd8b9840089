"""A lower bound on the step time that charges communication (the ``communication``
term of :func:`placetool.search.bounds.lower_bound`).

For every op ``v`` and device ``d`` two numbers are computed by dynamic programmes over
the topological order:

- ``S[v, d]``, a head: no placement with ``v`` on ``d`` starts ``v`` before it;
- ``Q[v, d]``, a tail: no placement with ``v`` on ``d`` ends the step less than ``Q``
  after ``v`` ends.

A data edge ``u -> v`` between devices ``a != b`` delays ``v`` by at least the transfer's
three stages as the simulator charges them (docs/simulator.md): ``a``'s send cost, the
link's ``latency + bytes / bandwidth`` and ``b``'s receive cost, each of which starts no
earlier than the one before ends (queues on links or devices only add waiting); with
``links.send`` "aside" the send cost runs beside the link and is left out. A
control edge, or a data edge within one device, delays nothing beyond the producer's end.
Ops of one colocation group share a device, so an edge inside a group never crosses.

Heads. For ``v`` on ``d`` every predecessor ``u`` is either on ``d`` (it ends no earlier
than ``S[u, d] + T[u, d]``) or elsewhere (its tensor arrives no earlier than
``a_u = min over d' != d of S[u, d'] + T[u, d'] + transfer(d' -> d)``). The
predecessors on ``d`` are moreover one machine's jobs that all end before ``v`` starts,
so ``v`` starts no earlier than the least makespan of those jobs under their release
times (the earliest-release-first schedule, which is optimal for that problem). Whatever
the placement, with R its remote predecessors, ``v`` starts no earlier than ``max(that
makespan over the local ones, max over R of a_u)``; the least of this over the choices of
R is the head, and it suffices to try R = {u : a_u <= tau} for each threshold tau (a
larger local set only lengthens the machine's makespan). Tails are the mirror image:
successors on ``d`` run one after another after ``v`` ends, each followed by its own
tail (Jackson's order, by tail, is optimal with equal releases), the others pay their
transfer first.

By induction over the topological order, for any placement every op's start is at
least its head and the step's end at least its end plus its tail on the device the
placement gives it, so

- ``min over d of S[v, d] + T[v, d] + Q[v, d]`` bounds every placement, for every op;
- for a group, whose ops all share one device, ``min over d`` of the pre-emptive
  one-machine bound of its ops with those heads, run times and tails on ``d`` bounds
  every placement too (its ops cannot overlap there).

The term is the largest of these. Unlike a longest path with free communication, it
charges a switch of device wherever the fastest device of consecutive ops differs,
wherever an op is pinned to a slow host, and wherever the branches of a fork or a join
either queue on one device or pay transfers. Devices a group may not use
(``problem.allowed``) get an infinite time, so they are never chosen.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .exact_bound import one_machine_bound

#: forks and joins with more distinct neighbours than this take the plain max-min step
#: (the threshold search is quadratic in the neighbours; 4,202-input joins exist in gnmt8)
MAX_FAN = 96
#: floating-point slack: the simulator sums the same figures in another order
SLACK = 1e-9


class Net(NamedTuple):
    """The graph and cluster as the kernels read them."""

    T: np.ndarray  # float64 [n, D]: op time, inf where its group may not go
    group: np.ndarray  # int64 [n]
    topo: np.ndarray  # int64 [n]
    in_ptr: np.ndarray  # int64 [n + 1] -> in_src, in_bytes (edges by consumer)
    in_src: np.ndarray  # int64
    in_bytes: np.ndarray  # float64: tensor bytes, -1 for a control edge
    out_ptr: np.ndarray  # int64 [n + 1] -> out_dst, out_bytes (edges by producer)
    out_dst: np.ndarray  # int64
    out_bytes: np.ndarray  # float64: tensor bytes, -1 for a control edge
    lat: np.ndarray  # float64 [D, D]
    bw: np.ndarray  # float64 [D, D]
    dev_cost: np.ndarray  # float64 [4, D]: send_us, send_us_per_byte, recv_us, recv_us_per_byte


def make_net(problem) -> Net:
    """Pack a problem for the kernels."""
    g, cm, cl = problem.graph, problem.cost_model, problem.cluster
    nbytes = np.where(g.edge_tensor >= 0, g.edge_bytes.astype(np.float64), -1.0)
    i = np.argsort(g.edge_dst, kind="stable")
    o = np.argsort(g.edge_src, kind="stable")
    n = g.n_ops

    def c(x, dt):
        return np.ascontiguousarray(x, dt)

    return Net(
        T=c(np.where(problem.allowed[g.group], cm.T, np.inf), np.float64), group=c(g.group, np.int64),
        topo=c(g.topo_order, np.int64),
        in_ptr=np.searchsorted(g.edge_dst[i], np.arange(n + 1)).astype(np.int64),
        in_src=c(g.edge_src[i], np.int64), in_bytes=c(nbytes[i], np.float64),
        out_ptr=np.searchsorted(g.edge_src[o], np.arange(n + 1)).astype(np.int64),
        out_dst=c(g.edge_dst[o], np.int64), out_bytes=c(nbytes[o], np.float64),
        lat=c(cl.latency_us, np.float64), bw=c(cl.bandwidth_bytes_per_us, np.float64),
        dev_cost=c(_delaying_costs(cl), np.float64),
    )


def _delaying_costs(cl) -> np.ndarray:
    """The device-side transfer costs that delay a consumer: with ``links.send`` "aside"
    the send task runs beside the link transfer, so only the receive task is on the path;
    with "workers" a handler that came before the tensor leaves only the encoding on it."""
    costs = np.array(cl.transfer_costs(), np.float64)
    if cl.link_send == "aside":
        costs[:2] = 0.0
    elif cl.link_send == "workers":
        costs[0] = 0.0
    return costs


@njit(cache=True, inline="always")
def _transfer(nbytes, a, b, lat, bw, dev_cost):
    """Least delay from a producer ending on ``a`` to its tensor being usable on ``b``:
    send task, link, receive task (0 on one device and for a control edge)."""
    if a == b or nbytes < 0.0:
        return 0.0
    return ((dev_cost[0, a] + nbytes * dev_cost[1, a]) + (lat[a, b] + nbytes / bw[a, b])
            + (dev_cost[2, b] + nbytes * dev_cost[3, b]))


@njit(cache=True)
def _threshold_min(local, remote, m, r, p, idx, order, heads):
    """min over thresholds tau of max(one machine of the neighbours with remote > tau,
    tau): neighbours sorted by ``remote`` descending join the local set one by one.

    The machine: with ``heads``, jobs released at ``r`` taking ``p``, its makespan in
    earliest-release order (optimal without tails); else jobs all released at 0 taking
    ``p`` with tails ``r``, the largest end + tail in longest-tail order (Jackson's rule,
    optimal with equal releases). ``idx`` holds the local set in that order, ``order``
    the neighbours by remote arrival; both are scratch."""
    for i in range(m):
        order[i] = i
    for i in range(1, m):  # insertion sort by remote, descending: fans are small
        j, x = i, order[i]
        while j > 0 and remote[order[j - 1]] < remote[x]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = x
    best = np.inf
    v = 0.0
    for k in range(m + 1):  # the first k (largest remote arrival) are local
        if k > 0:
            x = order[k - 1]
            if not np.isfinite(local[x]):
                break  # a neighbour that cannot be local: this and every larger set
            j = k - 1  # insert x into the local set, kept in the machine's order
            while j > 0 and ((r[idx[j - 1]] > r[x]) if heads else (r[idx[j - 1]] < r[x])):
                idx[j] = idx[j - 1]
                j -= 1
            idx[j] = x
            v = 0.0
            t = -np.inf if heads else 0.0
            for i in range(k):
                y = idx[i]
                if heads:
                    t = max(t, r[y]) + p[y]
                    v = t
                else:
                    t += p[y]
                    v = max(v, t + r[y])
        tau = remote[order[k]] if k < m else 0.0
        best = min(best, max(v, tau))
        if tau <= v:
            break  # a larger local set only lengthens the machine
    return best


@njit(cache=True)
def heads(net):
    """``S[v, d]``: the earliest ``v`` can start on ``d`` (see the module docstring)."""
    T, group, topo, ptr, src, nb = net.T, net.group, net.topo, net.in_ptr, net.in_src, net.in_bytes
    n, D = T.shape
    S = np.full((n, D), np.inf)
    slot = np.full(n, -1, np.int64)  # a predecessor's row in the buffers below, per op
    fan = 0
    for v in range(n):
        fan = max(fan, ptr[v + 1] - ptr[v])
    who = np.empty(fan, np.int64)
    local = np.empty(fan)
    remote = np.empty(fan)
    r = np.empty(fan)
    p = np.empty(fan)
    idx = np.empty(fan, np.int64)
    order = np.empty(fan, np.int64)
    for k in range(n):
        v = topo[k]
        for d in range(D):
            if not np.isfinite(T[v, d]):
                continue
            m = 0
            for e in range(ptr[v], ptr[v + 1]):
                u = src[e]
                a = np.inf
                if group[u] != group[v]:  # the same group never crosses
                    for d2 in range(D):
                        if d2 != d:
                            a = min(a, S[u, d2] + T[u, d2] + _transfer(nb[e], d2, d, net.lat, net.bw, net.dev_cost))
                if slot[u] < 0:
                    slot[u] = m
                    who[m], local[m], remote[m] = u, S[u, d] + T[u, d], a
                    r[m], p[m] = S[u, d], T[u, d]
                    m += 1
                else:  # every tensor of u must arrive
                    remote[slot[u]] = max(remote[slot[u]], a)
            plain = 0.0
            for i in range(m):
                plain = max(plain, min(local[i], remote[i]))
            if 1 < m <= MAX_FAN:
                plain = max(plain, _threshold_min(local, remote, m, r, p, idx, order, True))
            S[v, d] = plain
            for i in range(m):
                slot[who[i]] = -1
    return S


@njit(cache=True)
def tails(net, S):
    """``Q[v, d]``: the least time from ``v`` ending on ``d`` to the end of the step."""
    T, group, topo, ptr, dst, nb = net.T, net.group, net.topo, net.out_ptr, net.out_dst, net.out_bytes
    n, D = T.shape
    Q = np.full((n, D), np.inf)
    slot = np.full(n, -1, np.int64)
    fan = 0
    for v in range(n):
        fan = max(fan, ptr[v + 1] - ptr[v])
    who = np.empty(fan, np.int64)
    local = np.empty(fan)
    remote = np.empty(fan)
    q = np.empty(fan)
    p = np.empty(fan)
    idx = np.empty(fan, np.int64)
    order = np.empty(fan, np.int64)
    for k in range(n - 1, -1, -1):
        v = topo[k]
        for d in range(D):
            if not np.isfinite(T[v, d]):
                continue
            m = 0
            for e in range(ptr[v], ptr[v + 1]):
                u = dst[e]
                b = np.inf
                if group[u] != group[v]:
                    for d2 in range(D):
                        if d2 != d:
                            b = min(b, _transfer(nb[e], d, d2, net.lat, net.bw, net.dev_cost) + T[u, d2] + Q[u, d2])
                if slot[u] < 0:
                    slot[u] = m
                    who[m], local[m], remote[m] = u, T[u, d] + Q[u, d], b
                    q[m], p[m] = Q[u, d], T[u, d]
                    m += 1
                else:
                    remote[slot[u]] = max(remote[slot[u]], b)
            plain = 0.0
            for i in range(m):
                plain = max(plain, min(local[i], remote[i]))
            if 1 < m <= MAX_FAN:
                plain = max(plain, _threshold_min(local, remote, m, q, p, idx, order, False))
            Q[v, d] = plain
            for i in range(m):
                slot[who[i]] = -1
    return Q


@njit(cache=True)
def op_bound(T, S, Q):
    """max over ops of min over devices of head + run time + tail."""
    n, D = T.shape
    best = 0.0
    for v in range(n):
        m = np.inf
        for d in range(D):
            m = min(m, S[v, d] + T[v, d] + Q[v, d])
        if np.isfinite(m):
            best = max(best, m)
    return best


def group_bound(net, S, Q, groups) -> float:
    """max over groups (of more than one op) of min over devices of the one-machine
    bound of its ops with their heads, run times and tails there."""
    best = 0.0
    for ops in groups:
        if len(ops) < 2:
            continue
        m = np.inf
        for d in range(net.T.shape[1]):
            r, p, q = S[ops, d], net.T[ops, d], Q[ops, d]
            if not (np.isfinite(r).all() and np.isfinite(p).all() and np.isfinite(q).all()):
                continue  # the group may not go there
            m = min(m, one_machine_bound(r, p, q, len(ops)))
        if np.isfinite(m):
            best = max(best, m)
    return best


def communication_bound(problem) -> float:
    """The ``communication`` term (see the module docstring), µs."""
    g = problem.graph
    if g.n_ops == 0:
        return 0.0
    net = make_net(problem)
    S = heads(net)
    Q = tails(net, S)
    best = max(op_bound(net.T, S, Q), group_bound(net, S, Q, g.group_ops))
    return float(best) * (1.0 - SLACK)
