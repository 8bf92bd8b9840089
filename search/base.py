"""The one shape every search method has.

A method is a function ``method(problem, budget, seed, tracker, **options)`` registered
under a name; :func:`run` builds the :class:`Tracker` (which counts evaluations and
time, keeps the best placement seen and the best-so-far history) and returns a
:class:`SearchResult`. Methods only propose group assignments and ask the tracker to
score them; they never see the simulator directly, so budgets and bookkeeping are
honest for all of them.

>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem, Budget, run
>>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
>>> r = run("single", Problem(cm), Budget(evals=10), seed=0)
>>> r.feasible
True
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from placetool.costmodel.errors import UserError
from placetool.costmodel.jitclock import compile_seconds, work_clock


class SearchError(UserError):
    """A search cannot run as asked (unknown method, bad budget, nothing fits)."""


# ----------------------------------------------------------------- problem
class Problem:
    """A placement problem: a CostModel, its groups and which devices each group may use.

    A solution is a *group assignment*: an int array with one device index per group.
    """

    def __init__(self, cost_model):
        self.cost_model = cost_model
        g, cl = cost_model.graph, cost_model.cluster
        self.graph, self.cluster = g, cl
        self.n_groups, self.n_devices = g.n_groups, cl.n_devices
        #: (groups x devices) bool: the device kind can run every op of the group
        self.allowed = np.ascontiguousarray(cost_model.group_device_ok)
        #: persistent bytes of each group (parameters)
        self.group_param_bytes = np.bincount(g.group, weights=g.param_bytes, minlength=self.n_groups).astype(np.int64)
        #: compute time of each group on each device (sum of its ops' T; inf where no kernel)
        T = np.where(np.isfinite(cost_model.T), cost_model.T, 0.0)
        self.group_time = np.zeros((self.n_groups, self.n_devices))
        np.add.at(self.group_time, g.group, T)
        self.group_time[~self.allowed] = np.inf
        self._check_fits()

    def _check_fits(self) -> None:
        cap = self.cost_model.capacity
        reason = self.cost_model.stranded()
        if reason is not None:
            raise SearchError(reason)
        best_cap = np.where(self.allowed, cap[None, :], 0).max(axis=1)
        too_big = np.flatnonzero(self.group_param_bytes > best_cap)
        if too_big.size:
            k = int(too_big[0])
            op = self.graph.names[self.graph.group_ops[k][0]]
            raise SearchError(
                f"cluster {self.cluster.name!r} cannot hold the parameters of the group of op {op!r} "
                f"({int(self.group_param_bytes[k]):,} bytes) on any device it may use"
            )
        if self.group_param_bytes.sum() > cap.sum():
            raise SearchError(
                f"cluster {self.cluster.name!r} has {int(cap.sum()):,} bytes of memory in all, less than "
                f"the graph's {int(self.group_param_bytes.sum()):,} parameter bytes: no placement fits"
            )

    def placement(self, assignment) -> np.ndarray:
        """Per-op placement of a group assignment."""
        return self.graph.to_placement(assignment)

    def is_valid(self, assignment) -> bool:
        """Every group on a device that may run it."""
        a = np.asarray(assignment)
        return a.shape == (self.n_groups,) and bool(np.all(self.allowed[np.arange(self.n_groups), a]))

    def random_assignment(self, rng: np.random.Generator) -> np.ndarray:
        """A uniformly random valid assignment."""
        u = rng.random((self.n_groups, self.n_devices)) * self.allowed
        return np.argmax(u, axis=1).astype(np.int32)

    def lower_bounds(self) -> dict:
        """The lower bounds of :func:`placetool.search.bounds.lower_bound` (µs), computed once."""
        if getattr(self, "_bounds", None) is None:
            from .bounds import lower_bound

            self._bounds = lower_bound(self)
        return self._bounds

    def traffic(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`placetool.search.partition.group_edges` of this problem, computed once
        (read only: the partitioners, the guided moves and rl's prior all read it)."""
        if getattr(self, "_traffic", None) is None:
            from .partition import group_edges

            edges = group_edges(self)
            for x in edges:
                x.flags.writeable = False
            self._traffic = edges
        return self._traffic

    def neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """Each group's neighbours in :meth:`traffic` as CSR, computed once (read only):
        ``nb[nb_ptr[g]:nb_ptr[g + 1]]``, a pair linked both ways listed twice."""
        if getattr(self, "_neighbours", None) is None:
            s, d, _ = self.traffic()
            src, dst = np.concatenate([s, d]), np.concatenate([d, s])
            o = np.argsort(src, kind="stable")
            nb_ptr = np.searchsorted(src[o], np.arange(self.n_groups + 1)).astype(np.int64)
            nb = np.ascontiguousarray(dst[o], np.int64)
            for x in (nb_ptr, nb):
                x.flags.writeable = False
            self._neighbours = nb_ptr, nb
        return self._neighbours

    def lower_bound_us(self) -> float:
        """The best lower bound on the step time of any placement (µs)."""
        return self.lower_bounds()["best"]


# ------------------------------------------------------------------ budget
@dataclass(frozen=True)
class Budget:
    """How much a method may spend: evaluations, seconds, or both (whichever ends first)."""

    evals: int | None = None
    seconds: float | None = None

    def __post_init__(self):
        if self.evals is None and self.seconds is None:
            raise SearchError("a budget needs evaluations or seconds")
        if self.evals is not None and (not isinstance(self.evals, (int, np.integer)) or self.evals <= 0):
            raise SearchError(f"budget evaluations must be a positive integer, got {self.evals!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise SearchError(f"budget seconds must be positive, got {self.seconds!r}")


class ProgressCallback(Protocol):
    def __call__(self, evaluations: int, seconds: float, best_step_us: float) -> None: ...


# ----------------------------------------------------------------- tracker
class BudgetExhausted(Exception):
    """Raised inside a method when it asks for more evaluations than the budget holds."""


class Tracker:
    """Scores assignments for a method, counts them and remembers the best.

    The best is the fastest *feasible* assignment; until one is seen, the fastest
    infeasible one. ``history`` holds (evaluations, seconds, best step time) each time
    the best improves.

    Its seconds leave out the time numba spends compiling kernels on their first call
    on a machine (:mod:`placetool.costmodel.jitclock`), so a budget of seconds buys the
    same search on a cold start as later; ``compile_seconds`` is that time.
    """

    def __init__(self, problem: Problem, budget: Budget, progress: ProgressCallback | None = None,
                 keep_top: int = 0):
        self.problem = problem
        #: keep the ``keep_top`` best distinct assignments seen (feasible first, then by step
        #: time) in ``top`` as (step_us, feasible, assignment): what ``--verify-top K`` runs
        #: on hardware, since the simulator's best is not always the measured best.
        self.keep_top = int(keep_top)
        self.top: list[tuple[float, bool, np.ndarray]] = []
        self.budget = budget
        self.progress = progress
        self.t0 = work_clock()
        self._c0 = compile_seconds()
        self.evaluations = 0
        self.best_assignment: np.ndarray | None = None
        self.best_step_us = np.inf
        self.best_feasible = False
        self.history: list[tuple[int, float, float]] = []
        self._deadline = np.inf  # of the innermost sub_budget, in work_clock seconds
        self._captures: list[list] = []

    @property
    def seconds(self) -> float:
        """Seconds since the start, compiling left out."""
        return work_clock() - self.t0

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling kernels since the start."""
        return compile_seconds() - self._c0

    @property
    def best_feasible_us(self) -> float:
        """The fastest feasible step time seen (µs); inf until a feasible one is."""
        return self.best_step_us if self.best_feasible else np.inf

    def remaining_evals(self) -> int:
        """Evaluations left (a large number when only seconds bound the search)."""
        if self.budget.evals is None:
            return 1 << 62
        return max(0, self.budget.evals - self.evaluations)

    def done(self) -> bool:
        """True once the budget is spent."""
        if self.budget.evals is not None and self.evaluations >= self.budget.evals:
            return True
        now = work_clock()
        return now >= self._deadline or (self.budget.seconds is not None and now - self.t0 >= self.budget.seconds)

    def deadline(self) -> float:
        """The :func:`~placetool.costmodel.jitclock.work_clock` reading at which the
        innermost :meth:`sub_budget` ends (or the budget, if sooner); inf outside a
        sub-budget, where a one-shot method always answers. A long compiled loop, which
        cannot ask :meth:`done`, is given it to stop at: a seeding method must not eat
        the search's own share."""
        if self._deadline == np.inf:
            return np.inf
        if self.budget.seconds is not None:
            return min(self._deadline, self.t0 + self.budget.seconds)
        return self._deadline

    @contextmanager
    def sub_budget(self, seconds: float):
        """A share of the budget: inside the ``with``, :meth:`done` is also true once
        ``seconds`` have passed. Yields a list that collects every scored batch as an
        :class:`EvalResult`, also those a one-shot method scores after the share is spent
        (see :func:`placetool.search.partition.score`), so none is lost."""
        outer = self._deadline
        self._deadline = min(outer, work_clock() + float(seconds))
        rows: list[EvalResult] = []
        self._captures.append(rows)
        try:
            yield rows
        finally:
            self._captures.pop()
            self._deadline = outer

    def evaluate(self, assignments) -> "EvalResult":
        """Score a (B x groups) batch (or one assignment); truncated to the budget left.

        Raises :class:`BudgetExhausted` if no evaluation is left at all.
        """
        A = np.atleast_2d(np.asarray(assignments, dtype=np.int32))
        if self.done():
            raise BudgetExhausted
        A = A[: self.remaining_evals()]
        r = self.problem.cost_model.simulate_batch(A)
        self.record(A, r.step_time_us, r.feasible, r.peak_memory_bytes)
        return EvalResult(A, r.step_time_us, r.feasible, r.peak_memory_bytes)

    def record(self, A, step, feasible, peak=None, count: int | None = None) -> None:
        """Count evaluations scored elsewhere (e.g. by an incremental simulator);
        ``peak`` (B x devices bytes) lets seeding tell how far over memory a row is;
        ``count``: how many evaluations the rows stand for (default one each; an island
        of :mod:`placetool.search.islands` reports its best of many)."""
        A = np.atleast_2d(A)
        if count is not None:
            self.evaluations += max(0, int(count) - len(A))
        if self._captures:
            P = np.zeros((len(A), self.problem.n_devices), np.int64) if peak is None else np.atleast_2d(peak)
            self._captures[-1].append(EvalResult(np.array(A, np.int32), np.asarray(step, float),
                                                 np.asarray(feasible, bool), P))
        self.evaluations += len(A)
        if self.keep_top > 0:
            self._keep_top(A, step, feasible)
        for i in range(len(A)):
            better = (feasible[i] and (not self.best_feasible or step[i] < self.best_step_us)) or (
                not self.best_feasible and not feasible[i] and step[i] < self.best_step_us
            )
            if better:
                self.best_assignment = np.array(A[i], np.int32)
                self.best_step_us = float(step[i])
                self.best_feasible = bool(feasible[i])
                self.history.append((self.evaluations - len(A) + i + 1, self.seconds, self.best_step_us))
        if self.progress is not None:
            self.progress(self.evaluations, self.seconds, self.best_step_us)

    def _keep_top(self, A, step, feasible) -> None:
        seen = {a.tobytes() for _, _, a in self.top}
        for i in range(len(A)):
            key = A[i].tobytes()
            if key not in seen and np.isfinite(step[i]):
                seen.add(key)
                self.top.append((float(step[i]), bool(feasible[i]), np.array(A[i], np.int32)))
        self.top.sort(key=lambda t: (not t[1], t[0]))
        del self.top[self.keep_top:]


@dataclass
class EvalResult:
    assignments: np.ndarray
    step_time_us: np.ndarray
    feasible: np.ndarray
    peak_memory_bytes: np.ndarray


# ------------------------------------------------------------------ result
@dataclass
class SearchResult:
    """What every method returns."""

    method: str
    assignment: np.ndarray
    placement: np.ndarray
    step_time_us: float
    feasible: bool
    evaluations: int
    seconds: float  # of search, compiling left out
    lower_bound_us: float
    history: list = field(default_factory=list)
    metadata: dict = field(default_factory=dict)
    #: the best distinct (step_us, feasible, assignment) seen, when run(keep_top=K) asked
    top: list = field(default_factory=list)
    #: seconds numba spent compiling kernels during the run (on a machine's first runs only)
    compile_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "step_time_us": float(self.step_time_us),
            "feasible": bool(self.feasible),
            "lower_bound_us": float(self.lower_bound_us),
            "evaluations": int(self.evaluations),
            "seconds": float(self.seconds),
            "compile_seconds": float(self.compile_seconds),
            "history": [{"evaluations": e, "seconds": s, "best_step_us": b} for e, s, b in self.history],
            "metadata": self.metadata,
        }


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
    #: position among the placements sa, tpe and rl start from (cheap ones first);
    #: None: not a seed
    seed: int | None = None

    @property
    def module(self) -> str:
        return self.fn.__module__


DEFAULT_BUDGET = Budget(seconds=20.0)
REGISTRY: dict[str, MethodInfo] = {}
#: modules outside this package that register methods (imported when the table is read)
EXTERNAL_METHOD_MODULES = ("placetool.rl.method",)
#: modules of this package that hold no method (never imported to fill the table)
_NOT_METHODS = {"base", "bounds", "critical", "report", "store", "sweep"}
_discovered = False


def _summary(fn) -> str:
    import inspect

    para = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
    return para.split(". ")[0].rstrip(".")


def register(name: str, *, summary: str | None = None, budget: Budget | None = None, seed: int | None = None):
    """Decorator: make a method reachable as ``run(name, ...)`` / ``--method name``.

    ``summary`` (default: the docstring's first sentence), ``budget`` (the default when
    none is given; :data:`DEFAULT_BUDGET` if None) and ``seed`` (None, or the position of
    this method's placement among those sa, tpe and rl start from) are its table row.
    Adding a method is adding a module to this package that registers it.
    """

    def deco(fn):
        REGISTRY[name] = MethodInfo(name, fn, summary or _summary(fn), budget or DEFAULT_BUDGET, seed)
        return fn

    return deco


_discover_lock = threading.RLock()


def _discover() -> None:
    """Import every method module once (none imports TensorFlow at import time).

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

        pkg = __name__.rsplit(".", 1)[0]
        names = [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__)
                 if m.name not in _NOT_METHODS and not m.name.startswith("_")]
        for mod in names + list(EXTERNAL_METHOD_MODULES):
            try:
                importlib.import_module(mod)
            except ImportError:  # an optional part that is not installed: its methods are absent
                pass
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
    return tuple(sorted((n for n, i in t.items() if i.seed is not None), key=lambda n: (t[n].seed, n)))


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
