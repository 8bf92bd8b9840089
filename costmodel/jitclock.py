"""A clock that stands still while numba compiles.

Each kernel compiles on its first call on a machine; later processes load it from
numba's cache in well under a second. A first search on a new machine compiles about a
hundred kernels (the simulator, the list schedulers that seed a search, the critical
path), which takes one to two minutes on two cores: more than a short budget. Budgets
(:class:`placetool.search.Tracker`), ``sa``'s timing of its two engines and the rl
trainer read :func:`work_clock`, so a first run searches as long and as well as any
later one, and the compile time is reported on its own (:func:`compile_seconds`).

Example::

    >>> import time
    >>> wall0, t0, c0 = time.perf_counter(), work_clock(), compile_seconds()
    >>> # ... code whose first call compiles ...
    >>> wall = time.perf_counter() - wall0
    >>> abs(work_clock() - t0 + (compile_seconds() - c0) - wall) < 0.01   # work + compiling == wall
    True
"""

from __future__ import annotations

import os
import threading
import time

from numba.core import event


class _Compiles(event.Listener):
    """The union of the time spans in which some thread compiles: a kernel's callees
    compile inside its own compile, and threads that call a kernel being compiled wait
    on numba's compiler lock, so spans only ever nest; they are counted once."""

    def __init__(self):
        # reentrant: a signal handler (a sweep run's timeout) may read the clock in the
        # thread that holds the lock, between two of its bytecodes
        self._lock = threading.RLock()
        self._active = 0
        self._since = 0.0
        self._total = 0.0

    def on_start(self, ev):
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1

    def on_end(self, ev):  # numba sends the end of a compile that raised too
        with self._lock:
            if self._active == 0:
                # an end without its start: a Ctrl-C raised in on_start before it counted
                # (an open span would stop the clock, and a budget of seconds, for good)
                return
            self._active -= 1
            if self._active == 0:
                self._total += time.perf_counter() - self._since

    def read(self) -> tuple[float, float]:
        """(perf_counter now, seconds compiled up to now, a compile under way included)."""
        with self._lock:
            now = time.perf_counter()
            return now, self._total + (now - self._since if self._active else 0.0)

    def forget_other_threads(self) -> None:
        """In a forked child, which has only the forking thread: no compile is under
        way there, and a lock held by another thread at the fork would never be freed."""
        self._lock = threading.RLock()
        if self._active:
            self._total += time.perf_counter() - self._since
            self._active = 0


_COMPILES = _Compiles()
event.register("numba:compile", _COMPILES)
os.register_at_fork(after_in_child=_COMPILES.forget_other_threads)


def compile_seconds() -> float:
    """Seconds this process has spent compiling numba kernels so far (any thread)."""
    return _COMPILES.read()[1]


def work_clock() -> float:
    """``time.perf_counter()`` less :func:`compile_seconds`: the difference of two
    readings is the seconds of work between them, compiling left out."""
    now, compiling = _COMPILES.read()
    return now - compiling
