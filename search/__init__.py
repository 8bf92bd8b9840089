"""Placement search: baselines, partitioners, list schedulers, annealing, TPE (and RL).

Every method is reached by name through one registry::

    from search import Problem, Budget, run, methods
    result = run("sa", Problem(cost_model), Budget(seconds=10), seed=0)
"""

from .base import (Budget, BudgetExhausted, Problem, SearchError, SearchResult, Tracker, get,
                   methods, register, register_lazy, run)
from . import baselines  # noqa: F401  (registers single, round-robin, random)

# Methods whose modules load on first use (heavy imports, or TensorFlow).
for _name, _module in {
    "expert": "search.expert",
    "metis": "search.partition",
    "mincut": "search.partition",
    "heft": "search.listsched",
    "m-topo": "search.listsched",
    "m-etf": "search.listsched",
    "m-sct": "search.listsched",
    "critical-path": "search.listsched",
    "sa": "search.annealing",
    "tpe": "search.tpe",
    "rl": "rl.method",
}.items():
    register_lazy(_name, _module)

__all__ = ["Budget", "BudgetExhausted", "Problem", "SearchError", "SearchResult", "Tracker", "get",
           "methods", "register", "register_lazy", "run"]
