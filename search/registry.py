"""Every search method by name: :func:`register`, :func:`table`, :func:`run`.

A method is a function ``method(problem, budget, seed, tracker, **options)`` registered
under a name with its facts (:class:`MethodInfo`); :func:`run` builds the
:class:`~placetool.search.tracker.Tracker` (which counts evaluations and time, keeps the
best placement seen and the best-so-far history) and returns a
:class:`~placetool.search.tracker.SearchResult`. Methods only propose group assignments
and ask the tracker to score them; they never see the simulator directly, so budgets and
bookkeeping are honest for all of them.

The table fills on first use: every module of this package is imported (those that
register nothing add nothing; sub-packages such as :mod:`placetool.search.sweeps` hold no
method), then every module named by an entry point of the group ``placetool.methods``
(rl declares its own in pyproject.toml).

>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem, Budget, run
>>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
>>> r = run("single", Problem(cm), Budget(evals=10), seed=0)
>>> r.feasible
True
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from placetool.costmodel.errors import UserError

from .errors import SearchError
from .problem import Problem
from .tracker import Budget, BudgetExhausted, ProgressCallback, SearchResult, Tracker


# ---------------------------------------------------------------- registry
Method = Callable[..., dict | None]


@dataclass(frozen=True)
class MethodInfo:
    """The facts about one method, declared where it is registered."""

    name: str
    fn: Method
    #: one line for ``placetool search --list`` (default: the docstring's first sentence)
    summary: str
    #: what ``placetool search`` runs it with when the user gives no budget
    budget: Budget
    #: rank among the methods whose placements sa, tpe and rl start from (lower ranks,
    #: the cheaper ones, run first: :func:`seed_methods`); None: not a seeding method
    seed_rank: int | None = None

    @property
    def module(self) -> str:
        return self.fn.__module__


DEFAULT_BUDGET = Budget(seconds=20.0)
REGISTRY: dict[str, MethodInfo] = {}
#: the entry-point group naming modules outside this package that register methods
#: (pyproject.toml: ``[project.entry-points."placetool.methods"]``)
ENTRY_POINTS = "placetool.methods"
#: modules whose import found an optional dependency missing, and that dependency: their
#: methods are absent from the table
UNAVAILABLE: dict[str, str] = {}
_discovered = False


def _summary(fn) -> str:
    import inspect

    para = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
    return para.split(". ")[0].rstrip(".")


def register(name: str, *, summary: str | None = None, budget: Budget | None = None,
             seed_rank: int | None = None):
    """Decorator: make a method reachable as ``run(name, ...)`` / ``--method name``.

    ``summary`` (default: the docstring's first sentence), ``budget`` (the default when
    none is given; :data:`DEFAULT_BUDGET` if None) and ``seed_rank`` (None, or this
    method's rank among those whose placements sa, tpe and rl start from, cheapest
    first) are its table row. Adding a method is adding a module to this package (or
    one named by a ``placetool.methods`` entry point) that registers it. A name taken
    by another function is a ValueError; the same function registered again (its
    module imported anew) replaces itself.
    """

    def deco(fn):
        old = REGISTRY.get(name)
        if old is not None and (old.module, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"search method {name!r} of {fn.__module__}.{fn.__qualname__} is already "
                             f"registered by {old.module}.{old.fn.__qualname__}")
        REGISTRY[name] = MethodInfo(name, fn, summary or _summary(fn), budget or DEFAULT_BUDGET, seed_rank)
        return fn

    return deco


_discover_lock = threading.RLock()


def _optional_modules() -> frozenset[str]:
    """Top-level module names of placetool's optional dependencies (its extras)."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("placetool") or []
    except PackageNotFoundError:
        return frozenset()
    names = (re.match(r"[A-Za-z0-9_.-]+", r) for r in reqs if "extra ==" in r)
    return frozenset(m.group(0).lower().replace("-", "_").replace(".", "_") for m in names if m)


def _import(load, where: str, optional: frozenset[str]) -> None:
    """``load()`` a method module; an optional dependency that is missing leaves its
    methods out (noted in :data:`UNAVAILABLE`), any other ImportError is raised."""
    try:
        load()
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top not in optional:
            raise
        UNAVAILABLE[where] = top


def _discover() -> None:
    """Import every method module once: each module of this package (sub-packages
    left out) and each module a ``placetool.methods`` entry point names. None imports
    TensorFlow at import time.

    Under a lock, and marked done only when done: a worker running searches in
    several threads must not see a half-filled table."""
    global _discovered
    if _discovered:
        return
    with _discover_lock:
        if _discovered:
            return
        import importlib
        import pkgutil
        from importlib.metadata import entry_points

        pkg = __name__.rsplit(".", 1)[0]
        optional = _optional_modules()
        for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__):
            if not m.ispkg and not m.name.startswith("_"):
                mod = f"{pkg}.{m.name}"
                _import(lambda: importlib.import_module(mod), mod, optional)
        for ep in entry_points(group=ENTRY_POINTS):
            _import(ep.load, ep.value, optional)
        _discovered = True


def table() -> dict[str, MethodInfo]:
    """Every registered method's facts, by name."""
    _discover()
    return dict(sorted(REGISTRY.items()))


def methods() -> list[str]:
    """All method names."""
    return list(table())


def info(name: str) -> MethodInfo:
    """The facts of method ``name``; SearchError naming the known ones if there is none."""
    t = table()
    if name not in t:
        raise SearchError(f"unknown method {name!r} (known: {', '.join(t)})")
    return t[name]


def get(name: str) -> Method:
    """The function of method ``name``."""
    return info(name).fn


def seed_methods() -> tuple[str, ...]:
    """Methods whose placements sa, tpe and rl start from, cheapest first."""
    t = table()
    return tuple(sorted((n for n, i in t.items() if i.seed_rank is not None), key=lambda n: (t[n].seed_rank, n)))


def seed_names(seeds) -> tuple[str, ...]:
    """The seeding methods a ``seeds`` option names: None for all of them, a list of
    names, or one string of comma-separated names (as ``--option seeds=heft,m-sct``
    gives it); SearchError for a name that is no method, or none at all."""
    if seeds is None:
        return seed_methods()
    names = [s.strip() for s in seeds.split(",")] if isinstance(seeds, str) else list(seeds)
    names = [n for n in names if n != ""]
    if not names or not all(isinstance(n, str) for n in names):
        raise SearchError(f"option 'seeds' must name seeding methods (e.g. heft,m-sct; known: "
                          f"{', '.join(seed_methods())}), got {seeds!r}")
    unknown = [n for n in names if n not in table()]
    if unknown:
        raise SearchError(f"option 'seeds' names no method {unknown[0]!r} (seeding methods: "
                          f"{', '.join(seed_methods())})")
    return tuple(names)


#: Annotations of method options that :func:`check_options` reads beyond ``bool``,
#: ``int``, ``float``, ``str`` and ``None``: a count (an int >= 1), a size (an int >= 0),
#: a share (a number in [0, 1]), a positive number, a number >= 0 and seeding methods
#: (:func:`seed_names`).
Count = int
Size = int
Share = float
Positive = float
NonNegative = float
Seeds = str


def _seeds(v) -> bool:
    try:
        seed_names(v)
    except SearchError:
        return False
    return v is not None


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))


_KINDS = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("an integer", _integer),
    "Count": ("an integer >= 1", lambda v: _integer(v) and v >= 1),
    "Size": ("an integer >= 0", lambda v: _integer(v) and v >= 0),
    "float": ("a number", _number),
    "Share": ("a number from 0 to 1", lambda v: _number(v) and 0 <= v <= 1),
    "Positive": ("a number > 0", lambda v: _number(v) and v > 0),
    "NonNegative": ("a number >= 0", lambda v: _number(v) and v >= 0),
    "str": ("text", lambda v: isinstance(v, str)),
    "Seeds": ("seeding methods, comma-separated (" + "{seeds}" + ")", _seeds),
    "None": ("none", lambda v: v is None),
}


def check_options(name: str, options: dict, spell: Callable[[str], str] = repr) -> dict:
    """``options`` of method ``name`` checked against its signature before it runs:
    each must be a keyword the method takes and of the kind its annotation names
    (``bool``, ``int``, ``float``, ``str``, :data:`Count`, :data:`Size`, :data:`Share`,
    :data:`Positive`, :data:`NonNegative`, :data:`Seeds`, ``X | None``, read as written: the modules
    use ``from __future__ import annotations``; options without one are the method's to
    check). Returns them, ints made floats where a number is asked for; SearchError names
    the method, the option (as ``spell`` writes it: a command line names its flag) and
    the value.

    >>> check_options("sa", {"batch": 4, "guided": 1})
    {'batch': 4, 'guided': 1.0}
    """
    import inspect

    params = inspect.signature(get(name)).parameters
    mine = [p for p in list(params.values())[4:] if p.kind is not inspect.Parameter.VAR_KEYWORD]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    out = dict(options)
    for key, value in options.items():
        p = params.get(key)
        if p is None or p not in mine:
            if takes_any and p is None:
                continue  # passed on (e.g. rl's policy settings), checked there
            listed = ", ".join(q.name for q in mine) or "none"
            raise SearchError(f"method {name!r} takes no option {spell(key)} (its options: {listed})")
        if p.annotation is not inspect.Parameter.empty:
            out[key] = check_value(f"method {name!r}: option {spell(key)}", p.annotation, value)
    return out


def check_value(what: str, annotation: str, value):
    """``value`` checked against an option's ``annotation`` (as :func:`check_options`
    reads it; an annotation of other kinds passes anything): the value, an int made a
    float where a number is asked for; SearchError "``what`` must be ..." if it does
    not fit."""
    kinds = [k.strip() for k in str(annotation).split("|")]
    if not all(k in _KINDS for k in kinds):
        return value
    if not any(_KINDS[k][1](value) for k in kinds):
        kind = " or ".join(_KINDS[k][0] for k in kinds).replace("{seeds}", ", ".join(seed_methods()))
        raise SearchError(f"{what} must be {kind}, got {value!r}")
    if _integer(value) and not {"int", "Count", "Size"} & set(kinds):
        return float(value)  # 1 where a share or a number is asked for
    return value


def run(name: str, problem: Problem, budget: Budget, seed: int = 0,
        progress: ProgressCallback | None = None, keep_top: int = 0, **options) -> SearchResult:
    """Run method ``name`` on ``problem`` within ``budget``; same seed, same answer.

    The method may return a dict of metadata. If it scored nothing, its result is
    whatever it left in the tracker; a method that scores nothing at all is an error.
    An interrupt or an unexpected exception from the method is raised again with the
    best placement found before it as its ``partial_result`` (when there is one).
    """
    method = get(name)
    options = check_options(name, options)
    tracker = Tracker(problem, budget, progress, keep_top=keep_top)
    meta = None
    try:
        meta = method(problem, budget, seed, tracker, **options)
    except BudgetExhausted:
        pass
    except (KeyboardInterrupt, SystemExit) as e:
        # interrupted (Ctrl-C, or a SIGTERM handler that raises one): the caller can still
        # save the best found so far, from ``e.partial_result``
        if tracker.best_assignment is not None:
            e.partial_result = _result(name, problem, tracker, {"interrupted": True})
        raise
    except UserError:
        raise
    except Exception as e:
        # a fault in the method itself: what it found before is as good as ever, so the
        # caller can keep it too (``e.partial_result``) while it reports the fault
        if tracker.best_assignment is not None:
            e.partial_result = _result(name, problem, tracker, {"failed": f"{type(e).__name__}: {e}"})
        raise
    if tracker.best_assignment is None:
        raise SearchError(f"method {name!r} evaluated no placement within the budget")
    return _result(name, problem, tracker, meta)


def _result(name: str, problem: Problem, tracker: Tracker, meta) -> SearchResult:
    a = tracker.best_assignment
    return SearchResult(
        method=name,
        assignment=a,
        placement=problem.placement(a),
        step_time_us=tracker.best_step_us,
        feasible=tracker.best_feasible,
        evaluations=tracker.evaluations,
        seconds=tracker.seconds,
        lower_bound_us=problem.lower_bound_us(),
        history=tracker.history,
        metadata={**dict(meta or {}), "lower_bounds_us": problem.lower_bounds()},
        top=list(tracker.top),
        compile_seconds=tracker.compile_seconds,
    )
