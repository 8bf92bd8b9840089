"""Placement search: baselines, partitioners, list schedulers, annealing, TPE, exact (and RL).

Every method is reached by name through one registry; each method's module declares
its facts (summary, default budget, whether sa/tpe/rl start from it) where it
registers it, and :func:`table` lists them::

    from placetool.search import Problem, Budget, run, methods
    result = run("sa", Problem(cost_model), Budget(seconds=10), seed=0)
"""

from .base import (DEFAULT_BUDGET, Budget, BudgetExhausted, MethodInfo, Problem, SearchError, SearchResult,
                   Tracker, check_options, get, info, methods, register, run, seed_methods, table)

__all__ = ["DEFAULT_BUDGET", "Budget", "BudgetExhausted", "MethodInfo", "Problem", "SearchError", "SearchResult",
           "Tracker", "check_options", "get", "info", "methods", "register", "run", "seed_methods", "table"]
