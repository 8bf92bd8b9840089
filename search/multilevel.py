"""``multilevel``: search in moves of many groups at once, for graphs of tens of thousands of ops.

On such graphs one simulation takes milliseconds and a move of one group changes little,
so ``sa`` gets a few hundred evaluations in ten seconds and barely leaves its start. This
method decides at the level of clusters and regions: it coarsens the group graph as
METIS does (:mod:`placetool.search.coarsen`: heavy-edge matching into clusters, each
level a smaller problem for the simulator whose assignment gives every group its
cluster's device), anneals on the clusters, and moves whole regions along the simulated
critical path:

1. the seeding methods (``seeds``, default ``dispatch``: HEFT and the learnt
   dispatching rules, the best one-shot method on large graphs) run on the fine
   problem within ``seed_share`` of the budget (running on while nothing they scored
   fits);
2. where none finished or gave a feasible placement, a coarse pass (:func:`_descend`)
   anneals on each level of clusters (``clusters``, finest first; the finer levels' clusters are
   short in time, so a cluster's ops run close together), coarsest first, each level
   from the best of the level above, seeded on the coarsest by ``coarse_seeds`` run on
   the coarse graph, in a fraction of their time on the fine one;
3. greedy rounds of region-sized critical-path moves take ``pull_share`` of what is
   left (:func:`_pull_rounds`): each round traces the path of the current placement and
   scores a batch of candidates, pulling a random share of the path's transfers onto one
   device each (towards the device with memory to spare) or, where the path crosses
   devices hundreds of times, a stretch of it onto the device that holds most of its
   work, and moving one of the longest groups to another device; the best, or all that
   gained together where that is faster still, is kept if it fits;
   ``pull_patience`` rounds in a row that keep nothing end them early;
4. ``cycles`` V-cycles (one per 15 s of the budget) refine the best: clusters that keep
   it exactly (groups merge only with neighbours on the same device), sa on them from
   it, the best projected back;
5. sa on the fine groups from the best for the rest of the budget (at least
   ``refine_share`` of it).

The budget is the fine problem's: its tracker counts fine evaluations (the seeds', the
rounds' candidates, one for each coarse stage's best projected and one for each
V-cycle's start, and the refinement's; the traces of the path are not counted, as sa's
are not); the coarse stages get shares of the seconds and, under an evaluation
budget, as many coarse evaluations as the same share of fine evaluations would
simulate ops. A best over memory is fitted into it
(:func:`~placetool.search.memory.fit_memory`) before the fine refinement, and where
nothing feasible was found the ``fallback`` one-shot method is scored, so the result
fits whenever that one's does.

``metadata["levels"]`` has one row per coarse stage: clusters, coarse ops, coarse
evaluations, the coarse step time and the fine step time of its best projected, its
seconds and those of them spent building its clusters and coarse graph;
``seed_seconds``, ``pulls`` (rounds, improvements kept by kind of move, seconds) and
``refine["seconds"]`` tell the other stages, and ``best_from`` names the stage that
found the result.

>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem, Budget, run
>>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))
>>> r = run("multilevel", Problem(cm), Budget(evals=60), seed=0)
>>> r.feasible, r.evaluations <= 60, [row["stage"] for row in r.metadata["levels"]][:1]
(True, True, ['v-cycle 1'])
"""

from __future__ import annotations

import numpy as np

from .annealing import anneal
from .coarsen import coarse_problem, cluster_levels
from .errors import SearchError
from .memory import fit_memory
from .registry import Count, Positive, Seeds, Share, register
from .seeding import seed_limits
from .tracker import Budget, BudgetExhausted
from .vcycle import CYCLE_SECONDS, anneal_coarse, coarse_budget, score_fine, vcycles

#: the default cluster counts of the levels, finest first, as fractions of the groups
#: (and at least / at most these many clusters)
LEVEL_FRACTIONS = (0.06, 0.012)
LEVEL_MIN, LEVEL_MAX = (60, 12), (6000, 1200)
#: a level's clusters span at most this share of the zero-communication critical path
#: (finest level first; None: any span)
SPAN_SHARES = (1 / 200, None)


def _parse_counts(clusters, n_groups) -> list[int]:
    """Cluster counts of the levels, finest first: ``"3000,600"`` or a list; default
    from :data:`LEVEL_FRACTIONS`."""
    if clusters is None:
        out = [int(min(hi, max(lo, f * n_groups))) for f, lo, hi in zip(LEVEL_FRACTIONS, LEVEL_MIN, LEVEL_MAX)]
    else:
        parts = clusters.split(",") if isinstance(clusters, str) else list(clusters)
        try:
            out = [int(x) for x in parts if str(x).strip()]
        except ValueError:
            raise SearchError(f"multilevel: clusters must be counts like 3000,600, got {clusters!r}") from None
        if not out or any(x < 1 for x in out):
            raise SearchError(f"multilevel: clusters must be counts >= 1, got {clusters!r}")
    out = sorted({min(x, n_groups) for x in out}, reverse=True)
    return [x for x in out if x < n_groups] or [max(1, n_groups // 2)]


class _Stages:
    """What each stage found, for the metadata: the stage the tracker's best came from."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.best_from = None
        self._last = (False, np.inf)

    def note(self, stage: str) -> None:
        t = self.tracker
        now = (t.best_feasible, t.best_step_us)
        if t.best_assignment is not None and now != self._last:
            self.best_from = stage
            self._last = now


def _descend(problem, budget, seed, tracker, counts, share, runs_per_cluster, seeds, sa_options, stages, rows):
    """The coarse pass: anneal on each level of :func:`cluster_levels`, coarsest first,
    each from the best of the level above; every level's best is scored on the fine
    problem. Returns the last level's best as a fine assignment (None if none)."""
    t0 = tracker.seconds
    cp = problem.cost_model.lower_bound_us()
    spans = [None if s is None else s * cp for s in SPAN_SHARES]
    spans = (spans + [None] * len(counts))[: len(counts)]
    part = cluster_levels(problem, counts, spans, seed=seed)
    levels = [coarse_problem(problem, c, runs_per_cluster=runs_per_cluster) for c in part]
    built = tracker.seconds - t0
    cur = None
    for k, lv in enumerate(reversed(levels)):  # coarsest first
        if tracker.done():
            break
        t1 = tracker.seconds
        start = None if cur is None else lv.restrict(cur, problem)
        b = coarse_budget(budget, tracker, share / len(levels), problem.graph.n_ops, lv.problem.graph.n_ops)
        a, step, ok, n = anneal_coarse(lv, b, seed + k, start, seeds, sa_options)
        row = {"stage": f"level {len(levels) - k}", "clusters": lv.n_clusters,
               "coarse_ops": lv.problem.graph.n_ops, "evaluations": n,
               "coarse_step_us": None if a is None else step, "coarse_feasible": ok, "fine_step_us": None,
               "build_seconds": built if k == 0 else 0.0}
        rows.append(row)
        if a is None:
            continue
        cur = lv.project(a)
        got = score_fine(tracker, cur)
        if got is not None:
            row["fine_step_us"], row["fine_feasible"] = got[:2]
        row["seconds"] = tracker.seconds - t1 + row["build_seconds"]
        stages.note(row["stage"])
    return cur


#: candidates per round that move one of the :data:`HEAVY` longest groups
HEAVY_MOVES = 6
HEAVY = 64
#: the first rounds try each of this many longest groups, longest first, on every other
#: device it may use (a sweep: one round per group)
SWEEP_FIRST = 16
#: the shares of the critical path's transfers one pull move takes, one candidate each
#: per round
PULL_FRACTIONS = (0.005, 0.02)
#: a path with at least this many transfers gets :data:`SEGMENTS` moves of a stretch of
#: it (and :data:`SEGMENT_HEAVY_MOVES` heavy ones) per round instead of the pulls. On
#: gnmt8/k40x8 (~2,400 transfers on dispatch's path) and gnmt4/k80x4 (~680) stretches
#: gain 2-4% at 10 s; on nmt/k80x4 (~210) stretches alone end 4-8% slower than pulls
#: (benchmarks/README.md, "Stretches of the critical path"); 300 did no better than 500
SEGMENT_MIN_TRANSFERS = 500
#: stretch moves per round, and how many of the path's device changes a stretch spans
#: (one drawn per candidate)
SEGMENTS = 8
SEGMENT_HOPS = (2, 4, 8, 16)
SEGMENT_HEAVY_MOVES = 2
#: the most candidates a round scores, the union of those that gained included
ROUND_MAX = max(len(PULL_FRACTIONS) + HEAVY_MOVES, SEGMENTS + SEGMENT_HEAVY_MOVES) + 1


def _pull_candidates(problem, rng, cur, comm, room, fractions):
    """Region-sized moves along the critical path: per candidate, a random share of its
    transfers pulled onto one device each (the consumer's group to the producer's device
    or the other way, towards the device with more memory to spare, in proportion), where
    the group may run there."""
    gs, gd = comm[:, 0], comm[:, 1]
    ds, dd = cur[gs], cur[gd]
    rs, rd = np.maximum(room[ds], 0.0), np.maximum(room[dd], 0.0)
    to_src = np.where(rs + rd > 0, rs / np.maximum(rs + rd, 1e-9), 0.5)
    out = []
    for f in fractions:
        a = cur.copy()
        sel = rng.random(len(comm)) < f
        back = rng.random(len(comm)) < to_src
        m1 = sel & back & problem.allowed[gd, ds]  # consumer joins the producer
        m2 = sel & ~back & problem.allowed[gs, dd]  # producer joins the consumer
        a[gd[m1]] = ds[m1]
        a[gs[m2]] = dd[m2]
        out.append(a)
    return out


def _heavy_candidates(problem, rng, cur, heavy, weight, n):
    """``n`` moves of one long group each (drawn in proportion to its compute time) to
    another device it may use: a 78 ms softmax on the wrong GPU is a move sa's random and
    path-guided draws find rarely among 50k groups, and the one a step time turns on."""
    out = []
    for _ in range(n):
        k = heavy[rng.choice(len(heavy), p=weight)]
        ok = np.flatnonzero(problem.allowed[k])
        ok = ok[ok != cur[k]]
        if ok.size:
            a = cur.copy()
            a[k] = ok[rng.integers(ok.size)]
            out.append(a)
    return out


def _segment_candidates(problem, rng, cur, path_groups, work, n, hops=SEGMENT_HOPS):
    """``n`` moves of a stretch of the critical path onto one device each: the groups of
    a run of ``path_groups`` (the path's groups in path order) that changes device a
    drawn number of ``hops`` times, all to the device that holds most of their ``work``
    (per group, µs), where each may run. On gnmt8 the path of a list schedule changes
    device ~2,400 times and spends a third of the step in those transfers; a stretch
    removes a few of them in one place, and stretches far apart mostly add up."""
    dev = cur[path_groups]
    cuts = np.flatnonzero(dev[1:] != dev[:-1]) + 1
    out = []
    if not len(cuts):
        return out
    for _ in range(n):
        h = int(hops[rng.integers(len(hops))])
        i = int(rng.integers(max(1, len(cuts) - h)))
        lo = cuts[i - 1] if i else 0
        hi = cuts[i + h] if i + h < len(cuts) else len(path_groups)  # runs i..i+h
        grp = path_groups[lo:hi]
        d = int(np.argmax(np.bincount(cur[grp], weights=work[grp] + 1e-9, minlength=problem.n_devices)))
        grp = grp[problem.allowed[grp, d] & (cur[grp] != d)]
        if grp.size:
            a = cur.copy()
            a[grp] = d
            out.append(a)
    return out


def _union(cur, cands, picks) -> np.ndarray:
    """``cur`` with the changes of the candidates ``picks`` applied in that order (a later
    one wins where two move the same group)."""
    u = cur.copy()
    for i in picks:
        ch = cands[i] != cur
        u[ch] = cands[i][ch]
    return u


def _sweep_candidates(problem, cur, k):
    """Group ``k`` on each other device it may use, one candidate each."""
    out = []
    for d in np.flatnonzero(problem.allowed[k]):
        if d != cur[k]:
            a = cur.copy()
            a[k] = d
            out.append(a)
    return out


def _pull_rounds(problem, seed, tracker, until: float, max_evals: int | None, stages, meta,
                 patience: int | None = None) -> None:
    """Greedy rounds of moves along the critical path from the tracker's best feasible
    placement until ``until`` seconds (of the tracker's clock), ``max_evals``
    evaluations (None: any) or the budget ends. Each round traces the path of the
    current placement and scores a batch of candidates: random shares of the path's
    transfers pulled onto one device each (:func:`_pull_candidates`) or, on a path with
    :data:`SEGMENT_MIN_TRANSFERS` transfers or more, stretches of it pulled onto one
    device each (:func:`_segment_candidates`), and moves of long groups
    (:func:`_heavy_candidates`); the first rounds sweep the longest groups over the
    devices (:data:`SWEEP_FIRST`). Where two or more candidates gain (outside a sweep),
    all of them together are scored too (one more evaluation); the best that fits and is
    faster is kept. ``patience`` rounds in a row that keep nothing end them (the greedy rounds are
    then at a local optimum the V-cycles get out of: on nmt/k80x4 they kept nothing
    after the first 3 s of 45). One move of sa changes one or two groups; on a graph
    whose path crosses devices thousands of times that is too little per simulation to
    get anywhere in seconds."""
    from .critical import CriticalPath

    rng = np.random.default_rng(seed + 1_000_003)
    cm = problem.cost_model
    cur = tracker.best_assignment
    if cur is None or not tracker.best_feasible:
        return
    got = score_fine(tracker, cur)
    if got is None:
        return
    step, peak = got[0], got[2]
    t0, n0, rounds, kept, idle = tracker.seconds, tracker.evaluations, 0, {}, 0
    gt = np.where(np.isfinite(problem.group_time), problem.group_time, 0.0)
    t = gt.min(axis=1)
    heavy = np.argsort(-t, kind="stable")[: min(HEAVY, problem.n_groups)]
    weight = t[heavy] + 1e-9
    weight = weight / weight.sum()
    n_heavy = HEAVY_MOVES if (problem.allowed[heavy].sum(axis=1) > 1).any() else 0
    groups = np.arange(problem.n_groups)
    cap = cm.capacity.astype(np.float64)
    cp = None  # the path of ``cur``, traced again only once ``cur`` changes
    while not tracker.done() and tracker.seconds < until:
        if max_evals is not None and tracker.evaluations - n0 + ROUND_MAX > max_evals:
            # (a sweep may ask for more; the tracker scores what the budget holds)
            break
        if cp is None:
            cp = CriticalPath(cm, cur)
        if not len(cp.comm) or (patience is not None and idle >= patience):
            break
        sweep = n_heavy and rounds < min(SWEEP_FIRST, len(heavy))
        cands = _sweep_candidates(problem, cur, heavy[rounds]) if sweep else []
        kinds = ["sweep"] * len(cands)
        if not cands:
            if len(cp.comm) >= SEGMENT_MIN_TRANSFERS:
                cands = _segment_candidates(problem, rng, cur, cp.groups, gt[groups, cur], SEGMENTS)
                kinds = ["segment"] * len(cands)
                k_heavy = min(n_heavy, SEGMENT_HEAVY_MOVES)
            else:
                cands = _pull_candidates(problem, rng, cur, cp.comm, cap - peak, PULL_FRACTIONS)
                kinds = [f"pull {f:g}" for f in PULL_FRACTIONS]
                k_heavy = n_heavy
            cands += _heavy_candidates(problem, rng, cur, heavy, weight, k_heavy)
            kinds += ["heavy"] * (len(cands) - len(kinds))
        if not cands:
            break
        try:
            r = tracker.evaluate(np.stack(cands))
        except BudgetExhausted:
            break
        rounds += 1
        idle += 1
        obj = np.where(r.feasible, r.step_time_us, np.inf)
        i = int(np.argmin(obj))
        good = np.flatnonzero(obj < step)
        if len(good) > 1 and not sweep:  # (a sweep's candidates all move one group)
            # moves in different parts of the path mostly add up: all that gained,
            # together, the best last
            u = _union(cur, r.assignments, good[np.argsort(-obj[good])])
            try:  # traced: kept (44 rounds of 79 on gnmt8), it needs no second simulation
                ru, traced = tracker.evaluate_traced(u)
            except BudgetExhausted:
                break
            if ru.feasible[0] and ru.step_time_us[0] < obj[i]:
                cur, step, cp, idle = u, float(ru.step_time_us[0]), CriticalPath(cm, u, traced), 0
                peak = ru.peak_memory_bytes[0]
                kept["union"] = kept.get("union", 0) + 1
                continue
        if obj[i] < step:
            cur, step, cp, idle = r.assignments[i].copy(), float(obj[i]), None, 0
            peak = r.peak_memory_bytes[i]
            kept[kinds[i]] = kept.get(kinds[i], 0) + 1
    meta["pulls"] = {"rounds": rounds, "kept": kept, "seconds": tracker.seconds - t0,
                     "stalled": patience is not None and idle >= patience}
    stages.note("critical-path pulls")


@register("multilevel", budget=Budget(seconds=10.0),
          summary="Multilevel annealing: sa on the group graph coarsened by heavy-edge matching (as METIS), "
                  "in V-cycles from the seeding methods' best, then on the groups")
def multilevel(problem, budget, seed, tracker, seeds: str | None = "dispatch", seed_share: Share = 0.25,
               cycles: Count | None = None, cycle_clusters: Count | None = None, refine_share: Share = 0.05,
               clusters=None, runs_per_cluster: Positive = 4.0, coarse_seeds: Seeds | None = "heft,m-etf,metis",
               fallback: str | None = "m-topo", batch: Count | None = None, start=None,
               pull_share: Share = 0.75, pull_patience: Count | None = 200):
    """Multilevel search (see the module docstring); returns metadata.

    ``seeds`` run on the fine problem within ``seed_share`` of the budget (a cap: the
    stage ends when they do; dispatch runs its schedules' memory rounds breadth first,
    so a quarter of 10 s on gnmt8 holds its best placement, and the pulls from it gain
    more than its later rounds would; while nothing they scored fits, up to
    :data:`~placetool.search.seeding.UNTIL_FEASIBLE_SHARE` of it, since that placement
    comes 2.4-2.5 s in and a start that does not fit costs the search 70%) (``none``:
    skip them and start from the coarse pass); rounds of critical-path pulls take
    ``pull_share`` of what is left, or end after ``pull_patience`` rounds in a row that
    keep nothing; ``cycles`` V-cycles (default one per :data:`CYCLE_SECONDS` of a seconds
    budget, at least one) of ``cycle_clusters`` clusters (default a tenth of the groups; a target: matching
    stops where it stalls, on gnmt8/k40x8 at 8,100-8,600 clusters whatever the target) share the rest but
    ``refine_share`` of the budget, which the fine sa takes; ``clusters`` gives the
    coarse pass's levels, finest first (``--option clusters=3000,600``),
    ``coarse_seeds`` its seeding methods;
    ``runs_per_cluster``: how finely a coarse graph keeps the order of a cluster's ops
    (more: closer to the fine step time, slower to simulate); ``fallback``: the fine
    one-shot method scored when nothing feasible was found; ``start`` (a group
    assignment, from Python) replaces the seeds: the V-cycles start from it."""
    from .registry import seed_names

    skip_seeds = seeds is None or (isinstance(seeds, str) and seeds.strip().lower() == "none")
    if not skip_seeds:
        seed_names(seeds)  # an unknown name is an error before anything runs
    sa_options = {} if batch is None else {"batch": batch}
    stages = _Stages(tracker)
    rows: list[dict] = []
    meta = {"levels": rows}
    over = None  # the seeds' fastest placement over memory
    if start is not None:
        a = np.asarray(start)
        if a.shape != (problem.n_groups,) or a.dtype.kind not in "iu" or not problem.is_valid(a):
            raise SearchError(f"multilevel: start must be a valid assignment of the {problem.n_groups} groups")
        score_fine(tracker, a.astype(np.int32))
        stages.note("start")
    elif not skip_seeds:
        meta["seeds"], over = _run_seeds(problem, budget, seed, tracker, seed_names(seeds), seed_share)
        meta["seed_seconds"] = tracker.seconds
        stages.note("seeds")
    # no seed finished within its share (a list scheduler cut short gives none): the
    # coarse pass starts
    seeded = start is not None or bool(meta.get("seeds"))
    if over is not None and not tracker.done():
        # the fastest seed over memory, when faster than every one that fits (a list
        # scheduler cut short in its memory rounds falls back to m-TOPO's placement,
        # twice as slow): fitted with the simulator's account it is the better start
        if over[0] < tracker.best_feasible_us:
            _, r = fit_memory(problem, over[1], tracker)
            meta["seed_fitted"] = bool(r is not None and r.feasible[0])
    if (not seeded or not tracker.best_feasible) and not tracker.done():
        counts = _parse_counts(clusters, problem.n_groups)
        _descend(problem, budget, seed, tracker, counts, seed_share if skip_seeds else 0.3,
                 runs_per_cluster, coarse_seeds, sa_options, stages, rows)
    left = max(0.0, 1.0 - tracker.seconds / budget.seconds) if budget.seconds else 1.0 - seed_share
    if budget.seconds is not None:
        until = tracker.seconds + pull_share * left * budget.seconds
        _pull_rounds(problem, seed, tracker, until, None, stages, meta, pull_patience)
    else:
        _pull_rounds(problem, seed, tracker, np.inf, int(pull_share * tracker.remaining_evals()), stages,
                     meta, pull_patience)
    left = max(0.0, 1.0 - tracker.seconds / budget.seconds) if budget.seconds else left * (1 - pull_share)
    if cycles is None:
        cycles = max(1, int(budget.seconds // CYCLE_SECONDS)) if budget.seconds else 1
    rows += vcycles(problem, budget, seed, tracker, int(cycles), max(0.0, left - refine_share), cycle_clusters,
                    runs_per_cluster, sa_options, note=stages.note)
    meta.update(_finish(problem, budget, seed, tracker, fallback, stages, sa_options))
    meta["best_from"] = stages.best_from
    return meta


def _run_seeds(problem, budget, seed, tracker, names, share: float):
    """Run the seeding methods ``names`` on the fine problem within ``share`` of a
    seconds budget (60 s under an evaluation budget; running on while nothing scored
    fits), as sa's seeding does. Returns the names that scored a placement and the
    fastest they scored over memory as (step time, assignment) (None if none was), for
    the caller to fit where it beats every one that fits."""
    from .registry import get

    done = []
    with tracker.sub_budget(*seed_limits(budget, share)) as rows:
        for name in names:
            if tracker.done():
                break
            n0 = len(rows)
            try:
                get(name)(problem, budget, seed, tracker)
            except BudgetExhausted:
                pass
            except Exception:  # a broken seeding method must not sink the search
                continue
            if len(rows) > n0:
                done.append(name)
    over = [(float(r.step_time_us[i]), r.assignments[i]) for r in rows for i in range(len(r.assignments))
            if not r.feasible[i] and np.isfinite(r.step_time_us[i])]
    return done, (min(over, key=lambda x: x[0]) if over else None)


def _finish(problem, budget, seed, tracker, fallback, stages, sa_options) -> dict:
    """Fit the best into memory if it is over, anneal on the fine groups for the rest
    of the budget, and score the ``fallback`` method if nothing feasible was found."""
    meta = {}
    if tracker.best_assignment is not None and not tracker.best_feasible and not tracker.done():
        _, r = fit_memory(problem, tracker.best_assignment, tracker)
        meta["memory_fit"] = bool(r is not None and r.feasible[0])
        stages.note("memory fit")
    if tracker.best_assignment is not None and not tracker.done():
        t0 = tracker.seconds
        try:
            m = anneal(problem, budget, seed, tracker, start=tracker.best_assignment, **sa_options)
            meta["refine"] = {k: m.get(k) for k in ("proposals", "accepted", "restarts", "mode")}
        except BudgetExhausted:
            pass
        meta.setdefault("refine", {})["seconds"] = tracker.seconds - t0
        stages.note("fine sa")
    if not tracker.best_feasible and fallback:
        # nothing feasible: a fine one-shot method's placement, scored even past a
        # seconds budget as one-shot methods are, so the result fits whenever it does
        from .registry import get

        try:
            get(fallback)(problem, budget, seed, tracker)
        except BudgetExhausted:
            pass
        stages.note(f"fallback {fallback}")
    return meta
