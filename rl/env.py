"""The placement problem as a ``gymnasium.Env``, for other RL libraries.

One episode places every colocation group once, in topological order: **one step per
group**. The observation at step t is the group's features (:mod:`placetool.rl.features`), the
fraction of the graph's compute time placed on each device so far, and t / groups. The
action is a device index; ``info["action_mask"]`` says which devices the group may use
(for maskable algorithms). Rewards are 0 until the last step, which gets
``-sqrt(step_time / lower_bound)`` from the simulator (``-penalty`` when out of memory).
A disallowed action ends the episode at once with ``-penalty``.

>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem
>>> env = PlacementEnv(Problem(CostModel(presets.load_graph("synthetic-200"), presets.load_cluster("k80x2"))))
>>> obs, info = env.reset(seed=0)
>>> obs.shape == env.observation_space.shape
True
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from .features import COL_TOPO, group_features


class PlacementEnv(gym.Env):
    """Place the groups of ``problem`` (a :class:`placetool.search.Problem`) one by one."""

    metadata = {"render_modes": []}

    def __init__(self, problem, penalty: float = 10.0):
        self.problem = problem
        self.penalty = float(penalty)
        self.atoms = group_features(problem)
        self.order = np.argsort(self.atoms.x[:, COL_TOPO], kind="stable")
        self.n, self.D = problem.n_groups, problem.n_devices
        self.scale = max(problem.lower_bound_us(), 1e-9)
        tmin = np.where(problem.allowed, problem.group_time, np.inf).min(axis=1)
        self._work = tmin / max(tmin.sum(), 1e-9)
        # bounds of what _obs can return: the features' range over this problem's groups
        # (a feature alike in every group gets a unit-wide range), load fractions and
        # t / groups in [0, 1]
        x = self.atoms.x.astype(np.float32)
        lo, hi = x.min(axis=0), x.max(axis=0)
        low = np.concatenate([lo, np.zeros(self.D + 1, np.float32)])
        high = np.concatenate([np.where(hi > lo, hi, lo + 1), np.ones(self.D + 1, np.float32)])
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.D)
        self.assignment = np.zeros(self.n, np.int32)
        self.t = 0
        self._load = np.zeros(self.D)

    def _obs(self):
        k = self.order[min(self.t, self.n - 1)]
        return np.concatenate([self.atoms.x[k], self._load, [self.t / self.n]]).astype(np.float32)

    def _info(self, **kw):
        k = self.order[min(self.t, self.n - 1)]
        return {"action_mask": self.problem.allowed[k].astype(np.int8), **kw}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.assignment[:] = 0
        self.t = 0
        self._load[:] = 0
        return self._obs(), self._info()

    def step(self, action):
        a = int(action)
        k = self.order[self.t]
        if not (0 <= a < self.D) or not self.problem.allowed[k, a]:
            return self._obs(), -self.penalty, True, False, self._info(invalid=True)
        self.assignment[k] = a
        self._load[a] += self._work[k]
        self.t += 1
        if self.t < self.n:
            return self._obs(), 0.0, False, False, self._info()
        r = self.problem.cost_model.simulate(self.assignment)
        reward = -np.sqrt(r.step_time_us / self.scale) if r.feasible else -self.penalty
        return self._obs(), float(reward), True, False, self._info(step_time_us=r.step_time_us,
                                                                    feasible=r.feasible)
