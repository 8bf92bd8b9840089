"""Exploration aimed where the step time is decided: a logit prior from the simulated
critical path of the policy's mode.

A warm-started policy samples placements that leave its mode on about ``explore`` groups
(see :func:`placetool.rl.method.warm_margin`). On graphs of thousands of groups, groups
drawn uniformly almost never touch the few dozen on the critical path, so most samples
score the same as the mode and teach nothing. :class:`CriticalPrior` turns the traced
simulation of the mode into a logit term added to the policy's (like GDP's compute-time
prior, but state-dependent, as Placeto's features of the current placement are):

- groups on the critical path are ``weight`` times as likely to leave the mode as the
  others, and the others less likely, so that a sample moves as many groups as before;
- a group that leaves goes preferably where its graph neighbours are (``log(1 +
  affinity * neighbours on the device)``, normalised over the devices it may go to), so
  a move tends to remove a transfer instead of adding one.

The mode's own logit is left alone: the prior changes where samples go, never which
placement is the mode. REINFORCE still learns the residual table; the prior is
recomputed whenever the mode changes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placetool.search.critical import CriticalPath


@njit(cache=True)
def _prior(nb_ptr, nb, mode, allowed, log_w, affinity, out):
    """Fill ``out`` (groups x devices) with the prior of :class:`CriticalPrior`: row g is
    ``log_w[g]`` plus, on each device g may leave to, ``log(1 + affinity * its neighbours
    there)`` less that term's log-mean over those devices; 0 on g's mode device."""
    n, D = out.shape
    cnt = np.zeros(D)
    for g in range(n):
        for d in range(D):
            cnt[d] = 0.0
        for j in range(nb_ptr[g], nb_ptr[g + 1]):
            cnt[mode[nb[j]]] += 1.0
        m = mode[g]
        k = 0
        s = 0.0
        for d in range(D):
            if allowed[g, d] and d != m:
                k += 1
                s += affinity * cnt[d]
        # less the log-mean of (1 + affinity * count) over the devices it may leave to, so
        # moves go elsewhere, not more often (most have no neighbour there: no log1p(0))
        norm = np.log1p(s / k) if k > 0 and s > 0 else 0.0
        for d in range(D):
            v = log_w[g]
            if d != m and allowed[g, d]:
                if cnt[d] > 0:
                    v += np.log1p(affinity * cnt[d])
                v -= norm
            out[g, d] = v
        out[g, m] = 0.0


class CriticalPrior:
    """Logit prior (groups x devices) from the critical path of a group assignment.

    >>> from placetool.costmodel import CostModel, presets
    >>> from placetool.search import Problem
    >>> p = Problem(CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x2")))
    >>> import numpy as np
    >>> mode = np.argmax(p.allowed, axis=1)  # every group on its first device
    >>> B = CriticalPrior(p)(mode)
    >>> B.shape == (p.n_groups, p.n_devices), bool(np.all(B[np.arange(p.n_groups), mode] == 0))
    (True, True)
    """

    def __init__(self, problem, weight: float = 16.0, affinity: float = 1.0):
        if not weight >= 1.0:
            raise ValueError(f"critical weight must be >= 1, got {weight!r}")
        if not affinity >= 0.0:
            raise ValueError(f"affinity must be >= 0, got {affinity!r}")
        self.problem = problem
        self.weight, self.affinity = float(weight), float(affinity)
        self.nb_ptr, self.nb = problem.neighbours()
        self.allowed = np.ascontiguousarray(problem.allowed)
        self.movable = self.allowed.sum(axis=1) >= 2
        #: the traced critical path of the mode of the last call (compound moves follow it)
        self.path = None

    def __call__(self, mode: np.ndarray) -> np.ndarray:
        """The prior for group assignment ``mode``: 0 on each group's mode device."""
        p = self.problem
        n, D = p.n_groups, p.n_devices
        mode = np.ascontiguousarray(mode, np.int64)
        self.path = CriticalPath(p.cost_model, mode)
        on = self.path.on_group & self.movable
        # leave-probabilities scaled by w, with the mean over movable groups kept at 1
        w = np.where(on, self.weight, 1.0)
        if self.movable.any():
            w /= w[self.movable].mean()
        B = np.empty((n, D))
        _prior(self.nb_ptr, self.nb, mode, self.allowed, np.log(w), self.affinity, B)
        return B
