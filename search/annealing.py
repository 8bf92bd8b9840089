"""``sa``: simulated annealing over group assignments, guided by the critical path.

With ``moves="critical"`` (the default) a share ``guided`` of the neighbours comes from
the simulated critical path of the current placement
(:class:`placetool.search.critical.CriticalMoves`: pull a transfer on the path onto one
device, move a critical group to a neighbour's device, put a run of critical groups on one
device, move a critical group off the busiest device, swap one with a group elsewhere,
move a connected region around a critical group to a device its outside neighbours are
on; ``kinds`` picks some of them). With ``adapt`` (the default) a kind is drawn half
uniformly, half in proportion to how often its moves improved lately (:class:`KindOdds`;
``metadata["kind_odds"]``). The rest move one random group to another device it may use
(or, with probability ``swap``, exchange the devices of two groups); ``moves="random"``
uses only the latter. ``batch`` neighbours are proposed at a time (default 8; under a
budget of seconds alone, one per thread where numba runs more: on 16 cores batches of 16
found better placements on 4 of 4 runs, benchmarks/README.md; an evaluation budget keeps
8, so that a seed gives the same answer on every machine). With
``mode="incremental"`` the incremental simulator scores them
(:mod:`placetool.costmodel.incremental`, exact, re-simulates only from the first event a
move changes, on up to ``threads`` cores, default numba's thread count; it must also
re-simulate each accepted move with checkpoints), with ``mode="batch"`` the parallel batch
simulator scores them together, each from scratch. Which is faster depends on the graph
(where in the step a move's first changed event lies, how often moves are accepted);
``mode="auto"`` (the default) times both as it goes and scores with the faster (the one in
use at the end: ``metadata["mode"]``; ``metadata["us_per_evaluation"]``). The best
neighbour of a batch faces the Metropolis rule; the path is traced again after an accepted
move that touched it or changed the step time (a sideways move off the path leaves it in
place). The temperature is relative (an uphill step of ``x`` times the current step time
is taken with probability ``exp(-x / T)``) and adapts to keep the uphill acceptance rate
near a target that falls from ``accept_start`` to ``accept_end`` over the budget. Runs
start from the best placement of the seeding methods (every baseline and list scheduler
registered with a seed position) and restart, re-heated, from the best placement seen or
the next seed when a run stops improving; the random moves that kick a restart off the
best double with each restart in a row that finds no new best, up to a quarter of the
groups, then start small again (``metadata["widest_kick"]``). Out-of-memory placements
score ``max(step, best feasible seed's step) * (1.5 + overflow fraction)``, so they can
be crossed but are never preferred to a feasible one; the tracker reports the best
feasible one. Seeds that are out of memory but faster than every feasible one are first
fitted into memory (:func:`placetool.search.memory.fit_memory`) and join the seeds as
``NAME (fitted)``.

On problems of :data:`CYCLE_MIN_GROUPS` groups or more under a seconds budget, sa may
first run V-cycles from the seeds' best (:mod:`placetool.search.vcycle`: annealing on
clusters of groups that keep the best placement; ``metadata["levels"]``), then anneal on
the groups from their best. On some such graphs a move of one group changes too little:
on nmt/k80x4 sa's minute on the groups alone stays at 160-168 ms, with cycles first it
ends at 143.9-149.4. On others the cycles only take time from the groups (xception,
mobilenet_v2, transformer). So by default a short cycle races as long an annealing on
the groups (:func:`~placetool.search.vcycle.race`, each :data:`RACE_SHARE` of what the
seeds left, at most :data:`RACE_SECONDS`; ``metadata["race"]``), and only where the
cycle wins do the cycles run on: one per 15 s of budget, in :data:`CYCLE_SHARE` of what
is left. ``cycles=N`` runs N cycles without a race.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from placetool.costmodel.jitclock import work_clock

from .critical import CriticalMoves, CriticalPath
from .errors import SearchError
from .registry import Count, Seeds, Share, Size, register
from .seeding import objective, seed_assignments
from .tracker import BudgetExhausted


#: sa runs V-cycles (:mod:`placetool.search.vcycle`) by default on problems of this many
#: groups: the zoo's graphs, where a move of one group changes too little
CYCLE_MIN_GROUPS = 2000
#: the share of the budget left after the seeds that sa's V-cycles take; annealing on
#: the groups from their best takes the rest
CYCLE_SHARE = 0.8
#: the share of the budget left after the seeds that each side of the race between a
#: V-cycle and annealing on the groups takes (sa's default on large problems), up to
#: RACE_SECONDS: races of 1.5 s named the winner on 7 graphs of 7; at 60 s, races of
#: 5.5 s left nmt/k80x4 7.9% slower than cycling always (one went to the groups)
RACE_SHARE = 0.1
RACE_SECONDS = 1.5

#: how ``sa`` scores neighbours (see :class:`_Scorer`): ``auto`` times both engines as it goes
MODES = ("auto", "incremental", "batch")


class _Scorer:
    """Scores ``sa``'s batches with one of two exact engines and keeps its base current.

    ``incremental`` (:class:`~placetool.costmodel.incremental.IncrementalSimulator`,
    every core) re-simulates each candidate from the first event it changes but must
    re-simulate each accepted move with checkpoints; ``batch`` simulates every candidate
    from scratch on every core. In ``auto`` mode both are timed: the first batches
    alternate between them until each has been timed ``probe`` times (its first batch
    untimed: it pays for set-up), and then, every ``period`` batches, ``recheck`` batches
    go to the engine not in use, as the acceptance rate (and so the incremental engine's
    commits) falls over a run. While the batch engine is in use the incremental base is
    left behind and caught up, untimed, when the incremental engine scores again.
    Costs are wall seconds per evaluation, moving averages; the incremental engine's
    includes its commits at the current acceptance rate. The engines give the same
    answers, so the choice changes only the speed.
    """

    def __init__(self, tracker, cost_model, cur, mode, checkpoints=None, threads=None, probe: int = 6,
                 period: int = 64, recheck: int = 3):
        self.tracker = tracker
        if cost_model.workers:  # links.send "workers" has no incremental engine
            mode = "batch"
        self.mode = mode
        self.inc = None
        if mode != "batch":
            from placetool.costmodel.incremental import IncrementalSimulator

            self.inc = IncrementalSimulator(cost_model, cur, checkpoints=checkpoints, threads=threads)
        self.cur = cur  # the assignment the incremental base should hold
        self.stale = False  # the incremental base is behind ``cur``
        self.probe, self.period, self.recheck = probe, period, recheck
        self.batches = 0
        self.in_use = "batch" if mode == "batch" else "incremental"
        self.cost = {"incremental": None, "batch": None}  # seconds per evaluation
        self.commit_s = 0.0  # seconds per commit (moving average)
        self.timed = {"incremental": 0, "batch": 0}
        self.accept_rate = 0.0  # accepted moves per evaluation (moving average)

    def _engine(self) -> str:
        if self.mode != "auto":
            return self.mode
        k = self.batches
        if k < 2 * (self.probe + 1):
            return ("incremental", "batch")[k % 2]
        other = "batch" if self.in_use == "incremental" else "incremental"
        return other if k % self.period < self.recheck else self.in_use

    def _note(self, engine, seconds, n) -> None:
        self.timed[engine] += 1
        if self.timed[engine] == 1:  # set-up: compilation, workspaces, the thread pool
            return
        c = seconds / n
        self.cost[engine] = c if self.cost[engine] is None else 0.8 * self.cost[engine] + 0.2 * c
        inc, bat = self.cost["incremental"], self.cost["batch"]
        if inc is not None and bat is not None:
            self.in_use = "incremental" if inc + self.commit_s * self.accept_rate <= bat else "batch"

    def score(self, cands, moved):
        """(step, feasible, peak) of the candidates, recorded by the tracker; empty when
        the budget is spent."""
        engine = self._engine()
        self.batches += 1
        if engine == "incremental" and self.stale and not self.tracker.done():
            self.inc.commit(self.cur)  # catching up after the batch engine's turn: not its cost per move
            self.stale = False
        t0 = work_clock()
        if engine == "batch":
            try:
                r = self.tracker.evaluate(np.stack(cands))
            except BudgetExhausted:
                return np.zeros(0), np.zeros(0, bool), np.zeros((0, 0))
            out = r.step_time_us, r.feasible, r.peak_memory_bytes
        else:
            if self.tracker.done():
                return np.zeros(0), np.zeros(0, bool), np.zeros((0, 0))
            rs = self.inc.evaluate_many([(g, a[g]) if g >= 0 else a for a, g in zip(cands, moved)])
            out = (np.array([r.step_time_us for r in rs]), np.array([r.feasible for r in rs]),
                   np.stack([r.peak_memory_bytes for r in rs]))
            self.tracker.record(np.stack(cands), *out)
        if self.mode == "auto":
            self._note(engine, work_clock() - t0, len(cands))
        return out

    def after_batch(self, n, accepted=None) -> None:
        """A batch of ``n`` was scored; ``accepted`` is the new current assignment, or None."""
        if self.mode == "auto":
            self.accept_rate = 0.95 * self.accept_rate + 0.05 * (accepted is not None) / max(n, 1)
        if accepted is None:
            return
        self.cur = accepted
        if self.inc is None:
            return
        if self.mode == "auto" and self.in_use == "batch":
            self.stale = True  # caught up when the incremental engine scores again
            return
        t0 = work_clock()
        self.inc.commit(accepted)
        self.stale = False
        dt = work_clock() - t0
        self.commit_s = dt if self.commit_s == 0.0 else 0.8 * self.commit_s + 0.2 * dt

    def restart(self, a):
        """Score ``a`` and make it the current assignment: (step, feasible, peak) or None
        when the budget is spent."""
        self.cur = a
        if self.inc is not None and not (self.mode == "auto" and self.in_use == "batch"):
            self.inc.set_base(a)
            self.stale = False
            b = self.inc.base
            self.tracker.record(a[None, :], np.array([b.step_time_us]), np.array([b.feasible]),
                                b.peak_memory_bytes[None, :])
            return b.step_time_us, b.feasible, b.peak_memory_bytes
        self.stale = self.inc is not None
        try:
            r = self.tracker.evaluate(a)
        except BudgetExhausted:
            return None
        return r.step_time_us[0], r.feasible[0], r.peak_memory_bytes[0]

    def metadata(self) -> dict:
        out = {"mode": self.in_use if self.mode == "auto" else self.mode}
        if self.mode == "auto":
            out["us_per_evaluation"] = {k: None if v is None else 1e6 * v for k, v in self.cost.items()}
        return out


class KindOdds:
    """How often ``sa`` draws each kind of guided move: half uniform, half in proportion to
    each kind's recent rate of improving moves (the best of a batch that beat the current
    placement), with a prior of 1 in 20; counts halve every ``1000 * len(kinds)`` proposals
    so the odds follow the search as it moves on."""

    def __init__(self, kinds):
        self.kinds = tuple(kinds)
        self.index = {k: j for j, k in enumerate(self.kinds)}
        self.used = np.zeros(len(self.kinds))
        self.won = np.zeros(len(self.kinds))

    def odds(self) -> np.ndarray:
        rate = (self.won + 1.0) / (self.used + 20.0)
        return 0.5 / len(self.kinds) + 0.5 * rate / rate.sum()

    def as_dict(self) -> dict:
        """The odds by kind, rounded for a result's metadata."""
        return dict(zip(self.kinds, np.round(self.odds(), 3).tolist()))

    def draw(self, rng) -> str:
        return self.kinds[rng.choice(len(self.kinds), p=self.odds())]

    def record(self, kinds, best: str, improved: bool) -> None:
        """A batch of proposals of ``kinds`` whose best, of kind ``best``, did or did not improve."""
        for k in kinds:
            j = self.index.get(k)
            if j is not None:
                self.used[j] += 1
        if improved and best in self.index:
            self.won[self.index[best]] += 1
        if self.used.sum() >= 1000 * len(self.kinds):
            self.used *= 0.5
            self.won *= 0.5


def _start_seed(problem, tracker, start) -> list:
    """``start`` as sa's one seed, [(objective, "start", assignment)], scored once."""
    a = np.asarray(start)
    if a.shape != (problem.n_groups,) or a.dtype.kind not in "iu" or not problem.is_valid(a):
        raise SearchError(f"sa: start must be a valid assignment of the {problem.n_groups} groups")
    a = a.astype(np.int32)
    r = tracker.evaluate(a)
    o = float(objective(r.step_time_us, r.feasible, r.peak_memory_bytes, problem.cost_model.capacity,
                        tracker.best_feasible_us)[0])
    return [(o, "start", a)]


def _default_cycles(problem, budget, start) -> int:
    """How many V-cycles sa runs by default: one per
    :data:`~placetool.search.vcycle.CYCLE_SECONDS` of a seconds budget on problems of
    :data:`CYCLE_MIN_GROUPS` groups or more; none under an evaluation budget, from a
    given ``start`` (islands, the refinement of multilevel) or on smaller problems."""
    from .vcycle import CYCLE_SECONDS

    if start is not None or budget.evals is not None or not budget.seconds or problem.n_groups < CYCLE_MIN_GROUPS:
        return 0
    return int(budget.seconds // CYCLE_SECONDS)


def _after_vcycles(problem, budget, seed, tracker, cycles, batch, seeds_, meta, race: bool = False) -> list:
    """Run ``cycles`` V-cycles from the seeds' best in :data:`CYCLE_SHARE` of what is
    left of the budget (``metadata["levels"]``), with ``race`` only if a first cycle beats
    annealing on the groups (``metadata["race"]``); returns the seeds with the tracker's
    best among them, in order of objective, if it is new."""
    from .vcycle import race as race_cycle, vcycles  # they anneal with this module's anneal

    def left():
        if budget.seconds:
            return max(0.0, 1.0 - tracker.seconds / budget.seconds)
        return max(0.0, 1.0 - tracker.evaluations / budget.evals)

    rows, first = [], 0
    if race:
        share = min(RACE_SHARE * left(), RACE_SECONDS / budget.seconds)
        got = race_cycle(problem, budget, seed, tracker, share, sa_options={"batch": batch})
        row = got.pop("row")
        rows, first = ([row], 1) if row is not None else ([], 0)
        meta["race"] = got
        if got["won"] != "v-cycles":
            cycles = 0
    if cycles > 0 and not tracker.done():
        rows += vcycles(problem, budget, seed, tracker, cycles, CYCLE_SHARE * left(),
                        sa_options={"batch": batch}, first=first)
    meta["levels"] = rows
    best = tracker.best_assignment
    if best is None or any(np.array_equal(best, a) for _, _, a in seeds_):
        return seeds_
    if tracker.best_feasible:  # the cycles scored it: a feasible one's objective is its step
        o = tracker.best_step_us
    else:  # over memory its objective needs its peaks
        try:
            r = tracker.evaluate(best)
        except BudgetExhausted:
            return seeds_
        o = float(objective(r.step_time_us, r.feasible, r.peak_memory_bytes, problem.cost_model.capacity,
                            tracker.best_feasible_us)[0])
    return sorted([(o, "v-cycles", best.copy())] + list(seeds_), key=lambda x: x[0])


def _check_kinds(kinds):
    """The kinds of guided moves sa may draw: all of them for None, a string split at
    commas (``--option kinds=pull,region``); SearchError for any other kind."""
    if kinds is None:
        kinds = CriticalMoves.KINDS
    if isinstance(kinds, str):  # --option kinds=pull,region
        kinds = tuple(k.strip() for k in kinds.split(","))
    if not isinstance(kinds, (tuple, list)) or not kinds or any(k not in CriticalMoves.KINDS for k in kinds):
        raise SearchError(f"sa: kinds must be some of {', '.join(CriticalMoves.KINDS)}, got {kinds!r}")
    return kinds


def _kick_sizes(n_movable: int) -> list:
    """How many random moves kick a restart off the best: the smallest, doubled for each
    restart in a row that found no new best, up to a quarter of the groups, then the
    smallest again (``kicks[stale % len(kicks)]``). Small kicks return to the best's own
    basin; on small problems sa otherwise stays 2-5% above a proven optimum however long
    it runs."""
    kicks = [max(2, n_movable // 50)]
    while kicks[-1] < n_movable // 4:
        kicks.append(min(2 * kicks[-1], n_movable // 4))
    return kicks


class _Neighbours:
    """sa's neighbour proposals: with probability ``guided`` a move of the critical path
    (its kind drawn by ``odds``, else uniformly from ``kinds``), otherwise one random
    group to another device it may use, or with probability ``swap`` the devices of two
    groups exchanged."""

    def __init__(self, problem, rng, movable, swap, guide, guided, kinds, odds):
        self.rng, self.allowed, self.movable, self.swap = rng, problem.allowed, movable, swap
        self.ok_lists = [np.flatnonzero(problem.allowed[k]) for k in range(problem.n_groups)]
        self.guide, self.guided, self.kinds, self.odds = guide, guided, kinds, odds

    def random(self, cur):
        """(new assignment, moved group or -1 for a swap)."""
        rng, movable, allowed = self.rng, self.movable, self.allowed
        a = cur.copy()
        if rng.random() < self.swap and movable.size >= 2:
            for _ in range(8):
                g1, g2 = rng.choice(movable, 2, replace=False)
                d1, d2 = cur[g1], cur[g2]
                if d1 != d2 and allowed[g1, d2] and allowed[g2, d1]:
                    a[g1], a[g2] = d2, d1
                    return a, -1
        g = movable[rng.integers(movable.size)]
        others = self.ok_lists[g][self.ok_lists[g] != cur[g]]
        a[g] = others[rng.integers(others.size)]
        return a, g

    def __call__(self, cur, cp):
        """(new assignment, moved group or -1, kind of move)."""
        rng = self.rng
        if self.guide is not None and cp is not None and rng.random() < self.guided:
            kind = self.odds.draw(rng) if self.odds is not None else self.kinds[rng.integers(len(self.kinds))]
            a = self.guide.propose(cur, cp, kind)
            if a is not None:
                diff = np.flatnonzero(a != cur)
                return a, (int(diff[0]) if diff.size == 1 else -1), kind
        a, g = self.random(cur)
        return a, g, "random"


class _Walk:
    """One sa run between batches: the current placement, its objective and critical
    path, the temperature, the last uphill proposals (1 accepted, 0 rejected) and what
    the restarts go by."""

    def __init__(self, problem, tracker, scorer, propose, rng, meta, cur, cur_obj, ref):
        self.problem, self.tracker, self.scorer, self.propose, self.rng, self.meta = (
            problem, tracker, scorer, propose, rng, meta)
        self.cm = problem.cost_model
        self.cap = self.cm.capacity
        self.guide, self.odds = propose.guide, propose.odds
        self.cur, self.cur_obj = cur, cur_obj
        self.ref = ref  # infeasible placements score at least 1.5x the best feasible seed (see objective)
        self.cp = CriticalPath(self.cm, cur) if self.guide is not None else None
        self.stale, self.bests_at_restart = 0, len(tracker.history)
        self.T = 0.02
        self.hist = []  # uphill proposals: 1 accepted, 0 rejected (the last ``window``)
        self.run_best, self.since_best, self.next_seed = cur_obj, 0, 1

    def step(self, n_batch: int) -> bool:
        """Propose a batch of neighbours, score them together and put the best to the
        Metropolis rule; False when the budget left nothing to score."""
        n = min(n_batch, self.tracker.remaining_evals())
        props = [self.propose(self.cur, self.cp) for _ in range(n)]
        cand = [x[0] for x in props]
        steps, feasible, peak = self.scorer.score(cand, [x[1] for x in props])
        if not len(steps):
            return False
        objs = objective(steps, feasible, peak, self.cap, self.ref)
        # ---- Metropolis on the best neighbour of the batch
        self.meta["proposals"] += len(objs)
        i = int(np.argmin(objs))
        o = objs[i]
        d = (o - self.cur_obj) / max(self.cur_obj, 1e-9)
        acc = bool(np.isfinite(o) and (d <= 0 or self.rng.random() < math.exp(-d / max(self.T, 1e-12))))
        if not d <= 0:  # only uphill steps tell how hot it is
            self.hist.append(1 if acc else 0)
        if self.odds is not None:
            self.odds.record([x[2] for x in props], props[i][2], bool(d < 0))
        if acc:
            self._accept(cand[i], float(objs[i]), float(steps[i]), props[i][2], len(cand))
        else:
            self.scorer.after_batch(len(cand))
        if self.cur_obj < self.run_best * (1 - 1e-12):
            self.run_best, self.since_best = self.cur_obj, 0
        else:
            self.since_best += len(cand)
        return True

    def _accept(self, a, obj: float, step_us: float, kind: str, n: int) -> None:
        """Make ``a`` (objective ``obj``, step time ``step_us``) the current placement."""
        meta = self.meta
        meta["accepted"] += 1
        meta["accepted_by_kind"][kind] = meta["accepted_by_kind"].get(kind, 0) + 1
        moved = np.flatnonzero(a != self.cur)
        prev, self.cur, self.cur_obj = self.cur, a, obj
        self.scorer.after_batch(n, self.cur)
        if self.guide is not None and moved.size:
            # tracing costs a traced simulation and more than the commit: most accepted
            # moves are sideways steps off the path, which leave it where it was
            if self.cp.still_holds(moved, step_us):
                self.cp.moved(moved, prev[moved], self.cur[moved], self.problem.group_time)
            else:
                self.cp = CriticalPath(self.cm, self.cur)

    def cool(self, window: int, accept_start: float, accept_end: float, progress) -> None:
        """Steer the uphill acceptance rate of the last ``window`` uphill proposals towards
        a target falling from ``accept_start`` to ``accept_end`` as ``progress()`` goes
        from 0 to 1."""
        if len(self.hist) >= window:
            rate = sum(self.hist[-window:]) / window
            target = accept_start + (accept_end - accept_start) * min(1.0, progress())
            self.T *= 0.85 if rate > target else 1.15
            self.T = min(max(self.T, 1e-7), 10.0)
            del self.hist[:-window]

    def restart(self, seeds_, kicks) -> None:
        """Start again, re-heated: from the best seen, kicked by a few random moves
        (``kicks``, see :func:`_kick_sizes`); every third time from the next seed."""
        meta, tracker = self.meta, self.tracker
        meta["restarts"] += 1
        self.stale = 0 if len(tracker.history) > self.bests_at_restart else self.stale + 1
        self.bests_at_restart = len(tracker.history)  # one entry per new best
        if self.next_seed < len(seeds_) and meta["restarts"] % 3 == 0:
            cur = seeds_[self.next_seed][2].copy()
            self.next_seed += 1
        else:
            cur = tracker.best_assignment.copy()
            k = kicks[self.stale % len(kicks)]
            meta["widest_kick"] = max(meta["widest_kick"], k)
            for _ in range(k):
                cur = self.propose.random(cur)[0]
        self.cur = cur
        self.cur_obj = self._restart_from(cur)
        self.run_best, self.since_best, self.T = self.cur_obj, 0, max(self.T, 0.02)

    def _restart_from(self, a) -> float:
        """Score ``a`` as the new current placement: its objective, inf when the budget is spent."""
        r = self.scorer.restart(a)
        if r is None:
            return np.inf
        if self.guide is not None:
            self.cp = CriticalPath(self.cm, a)
        return float(objective([r[0]], [r[1]], np.atleast_2d(r[2]), self.cap, self.ref)[0])


@register("sa", summary="Simulated annealing with moves aimed at the simulated critical path, from the seeding "
                       "methods' best placement (on 2,000 groups or more, after V-cycles on clusters of groups "
                       "where a race says they pay)")
def anneal(problem, budget, seed, tracker, moves: str = "critical", mode: str = "auto", batch: Count | None = None,
           guided: Share = 0.7, swap: Share = 0.1, accept_start: Share = 0.05, accept_end: Share = 0.001,
           window: Count = 50, patience: Count | None = None, seeds: Seeds | None = None,
           checkpoints: Count | None = None, threads: Count | None = None, kinds=None, adapt: bool = True,
           start=None, cycles: Size | None = None):
    """Simulated annealing with moves aimed at the simulated critical path (see the
    module docstring); returns metadata. ``start`` (a group assignment, from Python: the
    islands of :mod:`placetool.search.islands` pass the best of the last epoch) replaces
    the seeding methods: the run starts there and restarts from the best seen.
    ``cycles`` V-cycles run between the seeds and the annealing on the groups (default:
    see :func:`_default_cycles`; 0: none)."""
    if mode not in MODES:
        raise SearchError(f"sa: mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if moves not in ("critical", "random"):
        raise SearchError(f"sa: moves must be 'critical' or 'random', got {moves!r}")
    rng = np.random.default_rng(seed)
    cm = problem.cost_model
    movable = np.flatnonzero(problem.allowed.sum(axis=1) >= 2)
    if start is None:
        seeds_, skipped = seed_assignments(problem, budget, seed, tracker, names=seeds)
    else:
        seeds_, skipped = _start_seed(problem, tracker, start), []
    if batch is None:
        # a batch is scored on every thread, and fewer neighbours leave threads idle; but
        # under an evaluation budget the same seed gives the same answer on every machine
        batch = 8 if budget.evals is not None else max(8, threads or numba.get_num_threads())
    meta = {"moves": moves, "mode": mode, "batch": batch, "seeds": list(dict.fromkeys(n for _, n, _ in seeds_)),
            "skipped_seeds": skipped, "proposals": 0, "accepted": 0, "restarts": 0, "widest_kick": 0,
            "accepted_by_kind": {}}
    if movable.size == 0 or not seeds_:
        return meta
    race = cycles is None
    cycles = _default_cycles(problem, budget, start) if cycles is None else int(cycles)
    if cycles > 0 and not tracker.done():
        seeds_ = _after_vcycles(problem, budget, seed, tracker, cycles, batch, seeds_, meta, race=race)
    patience = patience or max(64, 8 * movable.size)
    guide = CriticalMoves(problem, rng) if moves == "critical" else None
    kinds = _check_kinds(kinds)
    odds = KindOdds(kinds) if adapt else None
    propose = _Neighbours(problem, rng, movable, swap, guide, guided, kinds, odds)

    def progress():
        if budget.evals is not None:
            return tracker.evaluations / budget.evals
        return tracker.seconds / budget.seconds

    cur_obj, _, cur = seeds_[0]
    cur = cur.copy()
    ref = tracker.best_feasible_us
    scorer = _Scorer(tracker, cm, cur, mode, checkpoints=checkpoints, threads=threads)
    walk = _Walk(problem, tracker, scorer, propose, rng, meta, cur, cur_obj, ref)
    kicks = _kick_sizes(movable.size)
    n_batch = 1 if mode == "incremental" and guide is None else batch
    while not tracker.done():
        if not walk.step(n_batch):  # propose a batch, score it, Metropolis on its best
            break
        walk.cool(window, accept_start, accept_end, progress)
        if walk.since_best >= patience and not tracker.done():  # stuck: restart
            walk.restart(seeds_, kicks)
    meta["temperature"] = walk.T
    if odds is not None:
        meta["kind_odds"] = odds.as_dict()
    meta.update(scorer.metadata())
    return meta
