"""What a method may spend and what it found: :class:`Budget`, :class:`Tracker`,
:class:`SearchResult`.

A method proposes group assignments and asks the :class:`Tracker` to score them; the
tracker counts evaluations and time (compiling left out), keeps the best placement seen
and the best-so-far history, and raises :class:`BudgetExhausted` once the budget is spent.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from placetool.costmodel.jitclock import compile_seconds, work_clock

from .errors import SearchError
from .problem import Problem


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
        # the innermost sub_budget's end once a feasible placement is scored in it, when
        # it may run on until one is (sub_budget's until_feasible); inf otherwise
        self._soft_end = np.inf
        self._soft_met = False

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
        return work_clock() >= self._clock_end()

    def _clock_end(self) -> float:
        """The work_clock reading at which the clock ends the search: the innermost
        :meth:`sub_budget` (its share, or while it waits for a feasible placement its
        longer limit) or the budget's seconds, whichever comes first (inf: neither)."""
        end = min(self._deadline, self._soft_end) if self._soft_met else self._deadline
        if self.budget.seconds is not None:
            return min(end, self.t0 + self.budget.seconds)
        return end

    def seconds_left(self) -> float:
        """Seconds until :meth:`done` turns true by the clock (the innermost
        :meth:`sub_budget` or the budget); inf when no clock bounds the search."""
        end = self._clock_end()
        return end - work_clock() if end != np.inf else np.inf

    def deadline(self) -> float:
        """The :func:`~placetool.costmodel.jitclock.work_clock` reading at which the
        innermost :meth:`sub_budget` ends (or the budget, if sooner); inf outside a
        sub-budget, where a one-shot method always answers. A long compiled loop, which
        cannot ask :meth:`done`, is given it to stop at: a seeding method must not eat
        the search's own share."""
        return np.inf if self._deadline == np.inf else self._clock_end()

    @contextmanager
    def sub_budget(self, seconds: float, until_feasible: float | None = None):
        """A share of the budget: inside the ``with``, :meth:`done` is also true once
        ``seconds`` have passed. Yields a list that collects every scored batch as an
        :class:`EvalResult`, also those a one-shot method scores after the share is spent
        (see :func:`score`), so none is lost.

        With ``until_feasible`` (seconds, more than ``seconds``), a share that has scored
        no feasible placement by its end runs on until one is scored or that limit
        passes: a memory-constrained scheduler whose first fitting schedule comes late
        (gnmt8's comes after 2.4 s of a 2.5 s share) still gives the search a start that
        fits, where one moment of a slow machine would otherwise leave it none."""
        outer, outer_soft = self._deadline, (self._soft_end, self._soft_met)
        bound = min(outer, self._soft_end) if self._soft_met else outer  # where the enclosing share ends
        now = work_clock()
        if until_feasible is not None and until_feasible > seconds:
            self._deadline = min(bound, now + float(until_feasible))
            self._soft_end, self._soft_met = now + float(seconds), False
        else:
            self._deadline = min(bound, now + float(seconds))
            self._soft_end, self._soft_met = np.inf, False
        rows: list[EvalResult] = []
        self._captures.append(rows)
        try:
            yield rows
        finally:
            self._captures.pop()
            self._deadline = outer
            # a feasible placement scored in here was scored in the enclosing share too
            self._soft_end = outer_soft[0]
            self._soft_met = outer_soft[1] or any(bool(np.any(r.feasible)) for r in rows)

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

    def evaluate_traced(self, assignment):
        """Score one assignment as :meth:`evaluate` does, with its trace: (EvalResult,
        :class:`~placetool.costmodel.simulate.SimResult`). A search that traces the
        critical path of what it keeps then needs no second simulation of it."""
        a = np.asarray(assignment, dtype=np.int32)
        if self.done():
            raise BudgetExhausted
        cm = self.problem.cost_model
        s = cm.simulate(self.problem.placement(a), trace=True)
        step, ok, peak = np.array([s.step_time_us]), np.array([s.feasible]), s.peak_memory_bytes[None, :]
        self.record(a[None, :], step, ok, peak)
        return EvalResult(a[None, :], step, ok, peak), s

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
            self._soft_met = self._soft_met or bool(np.any(feasible))
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

    def record_top(self, top, count: int) -> None:
        """Record what a search on its own tracker found, standing for its ``count``
        evaluations: ``top``, its best distinct (step_us, feasible, assignment) rows (its
        ``top``, or its best alone where it kept none), so that ``--verify-top`` here
        sees them all."""
        self.record(np.stack([t[2] for t in top]), np.array([t[0] for t in top]), np.array([t[1] for t in top]),
                    count=count)

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


def score(tracker, assignments):
    """Score a one-shot method's final candidates.

    Like ``tracker.evaluate``, except that a method whose computation outlasted a
    seconds budget still gets its answer scored (and counted) rather than none at all:
    the overshoot shows in the result's seconds. An evaluation budget is never exceeded.
    """
    A = np.atleast_2d(np.asarray(assignments, dtype=np.int32))
    if not tracker.done():
        return tracker.evaluate(A)
    A = A[: tracker.remaining_evals()]
    if not len(A):
        return tracker.evaluate(A)  # raises BudgetExhausted
    r = tracker.problem.cost_model.simulate_batch(A)
    tracker.record(A, r.step_time_us, r.feasible, r.peak_memory_bytes)
    return EvalResult(A, r.step_time_us, r.feasible, r.peak_memory_bytes)
