"""Placement search: baselines, partitioners, list schedulers, annealing, TPE (and RL).

Every method is reached by name through one registry::

    from placetool.search import Problem, Budget, run, methods
    result = run("sa", Problem(cost_model), Budget(seconds=10), seed=0)
"""

from .base import (Budget, BudgetExhausted, Problem, SearchError, SearchResult, Tracker, get,
                   methods, register, register_lazy, run)
from . import baselines  # noqa: F401  (registers single, round-robin, random)

# Methods whose modules load on first use (heavy imports, or TensorFlow).
for _name, _module in {
    "expert": "placetool.search.expert",
    "metis": "placetool.search.partition",
    "mincut": "placetool.search.partition",
    "heft": "placetool.search.listsched",
    "m-topo": "placetool.search.listsched",
    "m-etf": "placetool.search.listsched",
    "m-sct": "placetool.search.listsched",
    "critical-path": "placetool.search.listsched",
    "sa": "placetool.search.annealing",
    "tpe": "placetool.search.tpe",
    "rl": "placetool.rl.method",
}.items():
    register_lazy(_name, _module)

__all__ = ["Budget", "BudgetExhausted", "Problem", "SearchError", "SearchResult", "Tracker", "get",
           "methods", "register", "register_lazy", "run"]
