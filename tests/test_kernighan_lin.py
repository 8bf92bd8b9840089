"""search.kernighan_lin against networkx's Kernighan-Lin, and known answers."""

from __future__ import annotations

import doctest

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from networkx.algorithms.community import kernighan_lin_bisection

from placetool.search import kernighan_lin as kl_module
from placetool.search.kernighan_lin import kernighan_lin


def csr(n, a, b, w):
    """Both directions of edges a < b, rows and neighbours ascending."""
    src, dst, ww = np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([w, w])
    o = np.lexsort((dst, src))
    return np.searchsorted(src[o], np.arange(n + 1)), dst[o], ww[o]


def cut(ptr, adj, w, side):
    src = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    return w[side[src] != side[adj]].sum() / 2


@st.composite
def graphs(draw):
    n = draw(st.integers(2, 40))
    pairs = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    pairs = sorted({(min(p), max(p)) for p in pairs if p[0] != p[1]})
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    # distinct real weights: no ties between costs, so the two must agree exactly
    seed = draw(st.integers(0, 2**32 - 1))
    w = np.random.default_rng(seed).random(len(pairs)) * 10 + 0.1
    n1 = draw(st.integers(1, n - 1))
    return n, a, b, w, n1


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_the_same_bisection_as_networkx(g):
    """With distinct weights the compiled refinement and networkx's end in the same
    bisection from the same start (first n1 nodes against the rest); sizes are kept and
    the cut never grows."""
    n, a, b, w, n1 = g
    G = nx.Graph()
    G.add_nodes_from(range(n))
    G.add_weighted_edges_from(zip(a.tolist(), b.tolist(), w.tolist()))  # in CSR order: same sums
    theirs = kernighan_lin_bisection(G, partition=(set(range(n1)), set(range(n1, n))), max_iter=10,
                                     weight="weight")
    ptr, adj, ww = csr(n, a, b, w)
    start = np.array([1] * n1 + [0] * (n - n1), np.int8)
    side = kernighan_lin(ptr, adj, ww, start)
    ours = {frozenset(np.flatnonzero(side == s).tolist()) for s in (0, 1)}
    assert ours == {frozenset(p) for p in theirs}
    assert np.count_nonzero(side) == n1
    assert cut(ptr, adj, ww, side) <= cut(ptr, adj, ww, start) + 1e-9


def test_two_cliques_split_at_their_light_edge():
    """Two 4-cliques of heavy edges joined by a light one, started interleaved: KL swaps
    until the cut is the light edge alone."""
    a, b, w = [], [], []
    for base in (0, 4):
        for i in range(4):
            for j in range(i + 1, 4):
                a.append(base + i), b.append(base + j), w.append(10.0)
    a.append(3), b.append(4), w.append(1.0)
    ptr, adj, ww = csr(8, np.array(a), np.array(b), np.array(w))
    side = kernighan_lin(ptr, adj, ww, np.array([1, 0, 1, 0, 1, 0, 1, 0], np.int8))
    assert side.tolist() in ([1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1])
    assert cut(ptr, adj, ww, side) == 1.0


def test_the_module_example():
    assert doctest.testmod(kl_module).failed == 0
