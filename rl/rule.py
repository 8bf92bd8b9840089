"""Pre-training dispatching rules (:mod:`placetool.search.dispatch`) over many problems.

A rule is six weights; the method places with a small *portfolio* of rules and keeps the
placement the simulator finds fastest, plain HEFT (all weights 0) always among them. The
portfolio is learnt greedily, one rule at a time, by the cross-entropy method: each
generation draws ``population`` weight vectors from a diagonal Gaussian (clipped at 0:
every term is a cost), schedules every training problem with each (HEFT's order, the
rule's device choice, both device sets as the method does), simulates the placements and
refits the Gaussian to the ``elite`` best. A candidate's score is the mean over problems
of log(best of the portfolio so far and the candidate / HEFT), a placement over memory
penalised as search does (:func:`placetool.search.seeding.objective`): a rule is worth
what it adds where the others do badly, so later rules specialise. A single rule trained
on the plain mean (no portfolio) gained 7.7% over HEFT on its training set and lost 43%
on a held-out convolution network; in a portfolio a rule that does not suit a graph is
simply not picked. No TensorFlow: a generation on 50 problems takes tens of seconds.

Example (a tiny budget, so the result is not worth shipping)::

    >>> from placetool.costmodel import CostModel, presets
    >>> from placetool.search import Problem
    >>> from placetool.rl.rule import pretrain
    >>> p = Problem(CostModel(presets.load_graph("synthetic-300"), presets.load_cluster("k80x2")))
    >>> rules, summary = pretrain([p], rules=2, generations=2, population=4, seed=0)
    >>> rules.shape[1], len(rules) <= 2, summary["vs_heft"] <= 1.0  # never worse than HEFT on its training set
    (6, True, True)
"""

from __future__ import annotations

import time

import numpy as np

from placetool.search.dispatch import TERMS
from placetool.search.listsched import _Data, _variants
from placetool.search.seeding import objective

#: the cross-entropy method's starting spread per weight (dimensionless: every term is in µs)
INIT_STD = 0.3
#: how much of the old Gaussian a generation keeps (smoothing, as usual for the method)
SMOOTHING = 0.3


class _Problems:
    """The training problems with their schedulers' data built once, and HEFT's score."""

    def __init__(self, problems):
        self.items = []  # (problem, [data per device set])
        for p in problems:
            self.items.append((p, [_Data(p, gpu_only) for gpu_only in _variants(p)]))
        self.evaluations = 0
        self.base = self._objectives(np.zeros(len(TERMS)), ref=None)

    def _objectives(self, w, ref) -> np.ndarray:
        out = np.empty(len(self.items))
        for i, (p, datas) in enumerate(self.items):
            cm = p.cost_model
            best = np.inf
            for data in datas:
                gdev, _ = data.eft(data.rank_u(), rule=w)
                sim = cm.simulate(p.graph.to_placement(gdev.astype(np.int32)))
                self.evaluations += 1
                r = np.inf if ref is None else ref[i]
                o = float(objective([sim.step_time_us], [sim.feasible], sim.peak_memory_bytes[None, :],
                                    cm.capacity, r)[0])
                best = min(best, o)
            out[i] = best
        return out

    def score(self, w, best) -> tuple[float, np.ndarray]:
        """Mean log ratio to plain HEFT of the better of ``best`` (the portfolio's
        objectives so far) and rule ``w``'s; and ``w``'s objectives."""
        o = self._objectives(w, self.base)
        return float(np.mean(np.log(np.minimum(best, o) / self.base))), o


def pretrain(problems, rules: int = 3, seconds: float | None = None, evals: int | None = None,
             generations: int | None = None, population: int = 16, elite: int | None = None, seed: int = 0,
             progress=None):
    """Learn a portfolio of up to ``rules`` rules on ``problems`` (see the module
    docstring). The budget is shared evenly by the rules: ``seconds`` and ``evals``
    (simulated placements) in all, or ``generations`` per rule; at least one must be
    given, and a generation under way finishes. ``elite``: how many of a generation's
    rules the next is fitted to (default a quarter). ``progress(rule, generation,
    summary)`` is called after each generation.

    Returns (rules as a (K x N_RULE) array, K <= ``rules``: a rule that adds nothing is
    left out; summary), the summary with each problem's step time under the portfolio
    over HEFT's (``per_problem``) and its geometric mean (``vs_heft``)."""
    elite = max(2, population // 4) if elite is None else elite
    if seconds is None and evals is None and generations is None:
        raise ValueError("pretrain needs seconds, evals or generations")
    if not 2 <= elite < population:
        raise ValueError(f"elite must be at least 2 and below population ({population}), got {elite}")
    if rules < 1:
        raise ValueError(f"rules must be at least 1, got {rules}")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    train = _Problems(problems)
    k = len(TERMS)
    chosen, per_rule = [], []
    best = train.base.copy()  # the portfolio's objectives: HEFT alone at first
    for r in range(rules):
        t_rule, e_rule = time.perf_counter(), train.evaluations
        mean, std = np.zeros(k), np.full(k, INIT_STD)
        score0 = float(np.mean(np.log(best / train.base)))
        top_w, top, top_o = None, score0, None
        history, gen = [], 0
        while True:
            ws = np.maximum(rng.normal(mean, std, size=(population, k)), 0.0)
            ws[0] = mean  # the current centre is always scored again
            scored = [train.score(w, best) for w in ws]
            scores = np.array([x[0] for x in scored])
            order = np.argsort(scores, kind="stable")
            if scores[order[0]] < top - 1e-12:
                top, top_w, top_o = float(scores[order[0]]), ws[order[0]].copy(), scored[order[0]][1]
            elites = ws[order[:elite]]
            mean = SMOOTHING * mean + (1 - SMOOTHING) * elites.mean(axis=0)
            std = SMOOTHING * std + (1 - SMOOTHING) * elites.std(axis=0)
            gen += 1
            history.append(round(top, 5))
            summary = {"rule": r + 1, "generations": gen, "evaluations": train.evaluations,
                       "seconds": round(time.perf_counter() - t0, 1), "score": top, "problems": len(train.items)}
            if progress is not None:
                progress(r + 1, gen, summary)
            if ((generations is not None and gen >= generations)
                    or (evals is not None and train.evaluations - e_rule >= evals / rules)
                    or (seconds is not None and time.perf_counter() - t_rule >= seconds / rules)):
                break
        per_rule.append({"generations": gen, "score_before": score0, "score": top, "history": history,
                         "added": top_w is not None})
        if top_w is not None:
            chosen.append(top_w)
            best = np.minimum(best, top_o)
    ratio = best / train.base
    summary = {"rules": len(chosen), "evaluations": train.evaluations, "seconds": round(time.perf_counter() - t0, 1),
               "problems": len(train.items), "vs_heft": float(np.exp(np.mean(np.log(ratio)))),
               "per_rule": per_rule,
               "per_problem": {f"{p.graph.name}@{p.cluster.name}": round(float(x), 4)
                               for (p, _), x in zip(train.items, ratio)}}
    return np.array(chosen, np.float64).reshape(len(chosen), k), summary
