"""Placement search: baselines, partitioners, list schedulers, annealing, TPE, exact (and RL).

Every method is reached by name through one registry (:mod:`.registry`); each method's
module declares its facts (summary, default budget, its rank among the placements
sa/tpe/rl start from) where it registers it, and :func:`table` lists them::

    from placetool.search import Problem, Budget, run, methods
    result = run("sa", Problem(cost_model), Budget(seconds=10), seed=0)

The layers, each importing only those above it: :mod:`.errors`, :mod:`.problem` (the
problem and its groups' facts), :mod:`.tracker` (budget, scoring, result),
:mod:`.registry` (names, options, :func:`run`), :mod:`.seeding` (where the searchers
start), then the method modules. Experiment tooling (sweeps, their store and reports)
lives in :mod:`.sweeps`.
"""

from .errors import SearchError
from .problem import Problem
from .registry import DEFAULT_BUDGET, MethodInfo, check_options, get, info, methods, register, run, seed_methods, table
from .tracker import Budget, BudgetExhausted, SearchResult, Tracker

__all__ = ["DEFAULT_BUDGET", "Budget", "BudgetExhausted", "MethodInfo", "Problem", "SearchError", "SearchResult",
           "Tracker", "check_options", "get", "info", "methods", "register", "run", "seed_methods", "table"]
