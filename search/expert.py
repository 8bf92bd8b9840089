"""The human-expert placement the papers compare against.

The model zoo tags ``graph.layer[op]`` and sets ``graph.meta["expert"]``:

- ``"single-gpu"`` (Inception-V3, ResNet, RNNLM, ...): everything that may run on a GPU
  on the first GPU;
- ``"layers"`` (NMT/GNMT): layer k on GPU k mod n_gpus (the zoo tags attention and
  softmax with the last layer's index); untagged groups go to the first GPU.

Without that meta (or without tags) the expert splits by depth: ops are cut into
n_gpus contiguous ranges of topological depth with about equal GPU compute time each,
the way a person splits a deep model into pipeline stages. Groups stay whole (a group
takes the device most of its ops' tags point to); groups that cannot run on a GPU go
to the CPU.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .problem import accelerators, fallback_device
from .registry import register
from .tracker import score


@njit(cache=True)
def _depth(order, ptr, succ):
    """Longest path (in ops) from a source to each op."""
    n = len(order)
    d = np.zeros(n, np.int64)
    for i in range(n):
        v = order[i]
        for k in range(ptr[v], ptr[v + 1]):
            w = succ[k]
            if d[v] + 1 > d[w]:
                d[w] = d[v] + 1
    return d


def op_depth(graph) -> np.ndarray:
    """Topological depth of every op (sources are 0)."""
    return _depth(np.ascontiguousarray(graph.topo_order, np.int64), *graph.successors)


def depth_stages(problem, n_stages: int) -> np.ndarray:
    """Stage 0..n_stages-1 of every op: contiguous depth ranges of about equal compute."""
    g = problem.graph
    if n_stages <= 1 or g.n_ops == 0:
        return np.zeros(g.n_ops, np.int64)
    depth = op_depth(g)
    acc = accelerators(problem)
    w = problem.cost_model.T[:, acc].min(axis=1)
    w = np.where(np.isfinite(w), w, 0.0)  # host-only ops weigh nothing in the GPU split
    per_depth = np.bincount(depth, weights=w, minlength=int(depth.max()) + 1)
    cum = np.cumsum(per_depth)
    total = cum[-1]
    if total <= 0:  # no compute anywhere: split depths evenly
        stage_of_depth = np.arange(len(per_depth)) * n_stages // len(per_depth)
    else:
        # a depth goes to the stage its cumulative-work midpoint falls in
        mid = cum - per_depth / 2
        stage_of_depth = np.minimum((mid / total * n_stages).astype(np.int64), n_stages - 1)
    return stage_of_depth[depth]


def _group_vote(problem, op_target: np.ndarray, valid: np.ndarray, default: int) -> np.ndarray:
    """Per group, the most common target among its ops with a valid target (ties: lowest)."""
    g = problem.graph
    G = problem.n_groups
    n_t = int(op_target[valid].max()) + 1 if valid.any() else 1
    votes = np.zeros((G, n_t), np.int64)
    np.add.at(votes, (g.group[valid], op_target[valid]), 1)
    out = np.argmax(votes, axis=1)
    return np.where(votes.sum(axis=1) > 0, out, default)


def expert_assignment(problem, mode: str | None = None) -> tuple[np.ndarray, str]:
    """The expert group assignment and the rule used ("single-gpu", "layers" or "depth")."""
    g = problem.graph
    acc = accelerators(problem)
    n = len(acc)
    mode = mode or g.meta.get("expert")
    tagged = g.layer >= 0
    if mode == "single-gpu":
        stage = np.zeros(problem.n_groups, np.int64)
    elif mode == "layers" and tagged.any():
        stage = _group_vote(problem, g.layer.astype(np.int64) % n, tagged, 0)
    else:
        mode = "depth"
        st = depth_stages(problem, n)
        stage = _group_vote(problem, st, np.ones(g.n_ops, bool), 0)
    dev = acc[stage]
    ok = problem.allowed[np.arange(problem.n_groups), dev]
    return np.where(ok, dev, fallback_device(problem)).astype(np.int32), mode


@register("expert", seed_rank=2)
def expert(problem, budget, seed, tracker, mode: str | None = None):
    """Human-expert placement: the zoo's layer tags, or a depth split without them.

    ``mode`` overrides the graph's ``meta["expert"]`` ("single-gpu", "layers", "depth").
    """
    if mode not in (None, "single-gpu", "layers", "depth"):
        from .errors import SearchError

        raise SearchError(f"expert mode {mode!r} is not one of single-gpu, layers, depth")
    a, used = expert_assignment(problem, mode)
    score(tracker, a)
    return {"rule": used}
