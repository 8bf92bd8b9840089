"""V-cycles: refine a placement by annealing on clusters of groups that keep it.

A V-cycle takes the tracker's best placement, clusters the group graph by heavy-edge
matching with only groups on the same device merging (:func:`~placetool.search.coarsen.cluster_levels`
with ``assignment``), so the coarse problem holds that placement exactly, anneals on the
clusters from it and scores the best projected back on the fine problem. A move of a
cluster moves many groups at once, and the coarse graph simulates faster, so on graphs of
thousands of groups the cycle gets out of where annealing on the groups settles: on
nmt/k80x4 sa's minute ends at 143.9-149.4 ms with four cycles first, at 160-168 on the
groups alone. Each cycle draws its own clusters. ``multilevel`` runs them after its
critical-path pulls, ``sa`` after its seeds on large graphs, where :func:`race` first
decides whether they pay.
"""

from __future__ import annotations

import numpy as np

from .annealing import anneal
from .coarsen import cluster_levels, coarse_problem
from .tracker import Budget, BudgetExhausted, Tracker

#: seconds of budget per V-cycle by default: one V-cycle's annealing on nmt/k80x4 gains
#: little after 5-10 s, and other clusters (each cycle draws its own) get out of where
#: it settled (60 s: 143.1-156.6 ms over 4 seeds with 4 cycles, 144.2-163.7 with one)
CYCLE_SECONDS = 15.0
#: how far ahead of a V-cycle annealing on the groups must end a race (a share of the
#: start's step time) to stop the cycles: where the two ran close (inception_v3, 0.5-0.9
#: points apart either way), the cycles won in the end, and where they did not, the
#: groups led by 1.4 points or more (mobilenet_v2, xception)
RACE_MARGIN = 0.01


def coarse_budget(budget, tracker, share: float, fine_ops: int, coarse_ops: int):
    """A coarse level's budget: ``share`` of the seconds (the tracker's clock runs on),
    and under an evaluation budget that share of the fine evaluations scaled by how many
    times fewer ops the level simulates."""
    seconds = evals = None
    if budget.seconds is not None:
        seconds = max(1e-3, share * budget.seconds)
        seconds = min(seconds, max(1e-3, budget.seconds - tracker.seconds))
    if budget.evals is not None:
        evals = max(1, int(share * budget.evals * fine_ops / max(coarse_ops, 1)))
    return Budget(evals=evals, seconds=seconds)


def anneal_apart(problem, budget, seed, start, seeds, sa_options, keep_top: int = 0) -> Tracker:
    """sa without V-cycles on its own tracker and clock (from ``start``, else from
    ``seeds``); returns that tracker (its best, evaluations and, with ``keep_top``, the
    best distinct placements it scored)."""
    tr = Tracker(problem, budget, keep_top=keep_top)
    opts = dict(sa_options or {}, cycles=0)  # no V-cycles within a V-cycle or a race
    if start is not None:
        opts["start"] = start
    else:
        opts["seeds"] = seeds
    try:
        anneal(problem, budget, seed, tr, **opts)
    except BudgetExhausted:
        pass
    return tr


def anneal_coarse(coarse, budget, seed, start, seeds, sa_options):
    """sa on a coarse problem: (best coarse assignment or None, its step time, feasible,
    evaluations)."""
    tr = anneal_apart(coarse.problem, budget, seed, start, seeds, sa_options)
    return tr.best_assignment, tr.best_step_us, tr.best_feasible, tr.evaluations


def score_fine(tracker, a):
    """One fine evaluation of ``a``: (step, feasible, peak bytes per device), or None
    when the budget is spent."""
    try:
        r = tracker.evaluate(a)
    except BudgetExhausted:
        return None
    return float(r.step_time_us[0]), bool(r.feasible[0]), r.peak_memory_bytes[0]


def calibrate_memory(coarse, fine_peak, coarse_peak) -> None:
    """Scale the coarse problem's capacities by how far its memory account overstates
    (a coarse op holds all it sends until its last consumer ends) or understates (what
    stays inside a coarse op is not counted) the fine one on the same placement, per
    device, by 0.5 to 2 times."""
    cm = coarse.problem.cost_model
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(fine_peak > 0, coarse_peak / np.maximum(fine_peak, 1), 1.0)
    cm.capacity = (cm.capacity * np.clip(ratio, 0.5, 2.0)).astype(np.int64)


def vcycle(problem, budget, seed, tracker, k, target, share, runs_per_cluster=4.0, sa_options=None):
    """One V-cycle from the tracker's best: clusters that keep it exactly (groups merge
    only with groups on their device), sa on them from it, the best projected back and
    scored. Returns its row for ``metadata["levels"]`` (see :func:`vcycles`), or None when
    it could not run (no budget, nothing to start from)."""
    sa_options = sa_options or {}
    best = tracker.best_assignment
    if best is None or tracker.done():
        return None
    t0 = tracker.seconds
    part = cluster_levels(problem, [target], seed=seed + 7919 * (k + 1), assignment=best)[0]
    lv = coarse_problem(problem, part, runs_per_cluster=runs_per_cluster)
    start = lv.restrict(best, problem)
    built = tracker.seconds - t0
    if budget.seconds:  # building the clusters spent part of the cycle's share
        share = max(share - built / budget.seconds, 0.0)
    b = coarse_budget(budget, tracker, share, problem.graph.n_ops, lv.problem.graph.n_ops)
    got = score_fine(tracker, best)  # its peaks, counted as the evaluation they are
    if got is None:
        return None
    calibrate_memory(lv, got[2], lv.problem.cost_model.simulate_batch(start[None]).peak_memory_bytes[0])
    a, step, ok, n = anneal_coarse(lv, b, seed + 101 * (k + 1), start, None, sa_options)
    row = {"stage": f"v-cycle {k + 1}", "clusters": lv.n_clusters, "coarse_ops": lv.problem.graph.n_ops,
           "evaluations": n, "coarse_step_us": None if a is None else step, "coarse_feasible": ok,
           "fine_step_us": None, "build_seconds": built}
    if a is not None and np.any(a != start):
        got = score_fine(tracker, lv.project(a))
        if got is not None:
            row["fine_step_us"], row["fine_feasible"] = got[:2]
    row["seconds"] = tracker.seconds - t0
    return row


def vcycles(problem, budget, seed, tracker, cycles: int, share: float, target: int | None = None,
            runs_per_cluster: float = 4.0, sa_options=None, note=None, first: int = 0) -> list[dict]:
    """``cycles`` V-cycles from the tracker's best, sharing ``share`` of the budget, each
    of ``target`` clusters (default a tenth of the groups). Returns one row per cycle that
    ran: ``stage`` ("v-cycle K"), ``clusters``, ``coarse_ops``, coarse ``evaluations``,
    ``coarse_step_us``, ``coarse_feasible``, ``fine_step_us`` of its best projected back
    (None when it kept the start), ``build_seconds`` (clustering) and ``seconds``.
    ``note(stage)`` is called after each; ``first`` cycles ran before (their numbers and
    clusters are not drawn again)."""
    target = target or max(2, problem.n_groups // 10)
    each = share / max(int(cycles), 1)
    rows = []
    for k in range(int(first), int(first) + int(cycles)):
        if each <= 0:
            break
        row = vcycle(problem, budget, seed, tracker, k, target, each, runs_per_cluster, sa_options)
        if row is None:
            break
        rows.append(row)
        if note is not None:
            note(row["stage"])
    return rows


def race(problem, budget, seed, tracker, share: float, sa_options=None) -> dict:
    """Race one V-cycle against annealing on the groups, each for ``share`` of the seconds
    budget and from the tracker's best, and say which placement came out faster.

    Whether V-cycles pay depends on the graph, not on its size: at 15 s one cycle took
    gnmt4/k80x4 7.4% and resnet50/k80x4 2.8% below annealing on the groups alone, and left
    xception/k80x4 5.7% and mobilenet_v2/k80x4 3.3% above it. A race of 1.5 s each told
    them apart on the 7 such graphs it was tried on (benchmarks/README.md, "A race
    decides whether sa's V-cycles pay"). Both runs count: the cycle's best is scored as
    any cycle's, the annealing's evaluations and best are recorded (its best few where the
    tracker keeps them, ``keep_top``, for ``--verify-top``). The groups win only by
    :data:`RACE_MARGIN` of the start's step time or more.
    Returns ``won`` ("v-cycles" or "groups"), ``start_us``, ``v-cycle_us`` and
    ``groups_us`` (the best each found that fits; None: none), ``seconds`` each, and the
    cycle's ``row`` (see :func:`vcycles`; None when it could not run).
    """
    start = tracker.best_assignment
    kept = tracker.best_step_us if tracker.best_feasible else np.inf
    rows = vcycles(problem, budget, seed, tracker, 1, share, sa_options=sa_options)
    row = rows[0] if rows else None
    cycle = kept
    if row is not None and row["fine_step_us"] is not None and row.get("fine_feasible"):
        cycle = min(cycle, row["fine_step_us"])
    seconds = min(share * budget.seconds, tracker.seconds_left())
    groups = kept
    if start is not None and seconds > 0 and not tracker.done():
        tr = anneal_apart(problem, Budget(seconds=seconds), seed, start, None, sa_options, tracker.keep_top)
        if tr.best_assignment is not None:
            # its best, or the best few it saw where the caller keeps them for --verify-top,
            # standing for every evaluation it made
            tracker.record_top(tr.top or [(tr.best_step_us, tr.best_feasible, tr.best_assignment)], tr.evaluations)
            if tr.best_feasible:
                groups = min(groups, tr.best_step_us)
    ref = kept if kept < np.inf else min(cycle, groups)
    won = "groups" if groups < cycle - RACE_MARGIN * ref else "v-cycles"
    return {"won": won, "start_us": None if kept == np.inf else kept, "v-cycle_us": None if cycle == np.inf else cycle,
            "groups_us": None if groups == np.inf else groups, "seconds": seconds, "row": row}
