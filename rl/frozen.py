"""A frozen network plus a per-problem residual table: the closed-form numpy policy the
trainer (:mod:`placetool.rl.trainer`) samples and updates when the network's learning rate
is 0, and the mode of such a policy (:func:`frozen_mode`).
"""

from __future__ import annotations

import numpy as np


def frozen_mode(net, table, allowed) -> np.ndarray:
    """The mode of a frozen network's logits ``net`` plus a residual ``table`` (atoms x
    devices): each atom's allowed device of the highest sum."""
    return np.argmax(np.where(allowed, net + table, -np.inf), axis=1).astype(np.int32)


class _FrozenNetTable:
    """A policy whose network is frozen (``lr == 0``): its logits are the network's,
    computed once, plus the per-problem residual table, so sampling and the REINFORCE
    step on the table are closed-form numpy (d log pi(a) / d logits = onehot(a) - p) —
    an order of magnitude more samples per second than a TensorFlow pass per step."""

    #: sample() draws one uniform per atom and sample when a sample leaves the mode on
    #: more than this share of the atoms on average (cheaper than a few draws per atom then)
    dense = 0.25

    def __init__(self, policy, task):
        self.net = np.asarray(policy.net_logits(task.obs), np.float64)
        self.var = task.residual_vars[0]
        self.table = self.var.numpy().astype(np.float64)
        self.mask = task.atoms.allowed
        self.T = policy.temperature
        self.n, self.D = self.mask.shape
        #: an exploration prior added to the sampling logits (see :mod:`placetool.rl.guide`);
        #: the mode is the argmax without it
        self.prior = None
        self._p = self._mode = None  # probs() and greedy() until the table or prior changes
        #: exploration floor: samples leave the mode on at least this many atoms on average
        #: (each atom's learnt chance to leave scaled up alike, to at most 1/2); the update
        #: keeps the policy's own score function, as with epsilon-greedy exploration
        self.floor = 0.0

    @property
    def prior(self):
        return self._prior

    @prior.setter
    def prior(self, value):
        self._prior = value
        self._p = None

    def logits(self):
        lg = (self.net + self.table) / self.T
        if self.prior is not None:
            lg = lg + self.prior
        return np.where(self.mask, lg, -np.inf)

    def probs(self):
        """The sampling distribution (atoms x devices; read only: it is kept until the
        table or the prior changes, as sampling and the update of one step share it)."""
        if self._p is None:
            lg = self.logits()
            e = np.exp(lg - lg.max(axis=1, keepdims=True))
            e /= e.sum(axis=1, keepdims=True)
            e.flags.writeable = False
            self._p = e
        return self._p

    def sample(self, K: int, seed) -> np.ndarray:
        """K draws (K x atoms) from the policy, exactly, in two stages: each atom stays on
        its most likely device r with probability p[r], else it goes to another device d
        with probability p[d] / (1 - p[r]). With a ``floor``, the chances to leave are
        scaled up to it first (see ``floor``).

        Which atoms leave in which samples: a warm-started policy moves a few atoms per
        sample, so each atom draws how many of the K samples it leaves in (binomial) and
        which (a uniform subset), a few draws per atom; a policy that moves many atoms
        draws one uniform per atom and sample. (Gumbel-max drew K x atoms x devices: 60%
        of a step's time on gnmt4's 12k groups on 9 devices.)"""
        rng = np.random.default_rng(seed)
        p = self.probs()
        rows = np.arange(self.n)
        r = np.argmax(p, axis=1)
        out = np.broadcast_to(r.astype(np.int32), (K, self.n)).copy()
        leave = 1.0 - p[rows, r]
        if self.floor > 0:
            tot = float(leave.sum())
            if 0 < tot < self.floor:
                leave = np.minimum(leave * (self.floor / tot), 0.5)
        if float(leave.sum()) > self.dense * self.n:
            ks, gs = np.nonzero(rng.random((K, self.n)) < leave[None, :])
        else:
            count = rng.binomial(K, np.clip(leave, 0.0, 1.0))
            movers = np.flatnonzero(count)
            c = count[movers]
            # the samples an atom leaves in: the first c of a random order of the K
            order = np.argsort(rng.random((movers.size, K)), axis=1)
            which = np.repeat(np.arange(movers.size), c)
            ks = order[which, np.arange(which.size) - np.repeat(np.cumsum(c) - c, c)]
            gs = movers[which]
        if gs.size:
            q = p[gs]
            q[np.arange(gs.size), r[gs]] = 0.0
            cdf = np.cumsum(q, axis=1)
            v = rng.random(gs.size) * cdf[:, -1]
            out[ks, gs] = np.minimum((cdf <= v[:, None]).sum(axis=1), self.D - 1)
        return out

    def greedy(self) -> np.ndarray:
        if self._mode is None:
            self._mode = frozen_mode(self.net, self.table, self.mask)[None]
            self._mode.flags.writeable = False
        return self._mode

    def update(self, acts, adv, lr: float, ent_w: float) -> float:
        """One gradient-ascent step of mean_k(A_k log pi(a_k)) + ent_w * H on the table;
        returns the mean entropy per group before the step."""
        p = self.probs()
        K = len(acts)
        adv = np.asarray(adv, np.float64)
        # sum_k adv_k onehot(a_k) as the sum on a reference row (the first sample) plus each
        # sample's departures from it: samples leave the mode on a few atoms each, so this
        # touches K x (a few) entries where a one-hot sum touches K x atoms
        ref = acts[0]
        rows = np.arange(self.n)
        g = np.zeros((self.n, self.D))
        g[rows, ref] = adv.sum()
        ks, gs = np.nonzero(acts[1:] != ref[None, :])
        ks += 1
        np.add.at(g, (gs, acts[ks, gs]), adv[ks])
        np.add.at(g, (gs, ref[gs]), -adv[ks])
        g = g / K - float(np.mean(adv)) * p
        logp = np.log(np.maximum(p, 1e-30))
        ent = -(p * logp).sum(axis=1)
        if ent_w:
            g += ent_w * (-p * (logp + ent[:, None])) / self.n
        self.table += lr * np.where(self.mask, g, 0.0) / self.T
        self._p = self._mode = None
        return float(ent.mean())

    def adopt(self, a) -> int:
        """Make ``a`` (one device per atom) the mode: on each atom where it differs, the
        logits of the old and the new mode's device trade places, so the chances to leave
        and where to go keep their shape around the new mode. Returns how many atoms moved."""
        a, old = np.asarray(a), self.greedy()[0]
        g = np.flatnonzero((a != old) & self.mask[np.arange(self.n), a])
        if g.size:
            lg = self.net[g] + self.table[g]
            d = lg[np.arange(g.size), old[g]] - lg[np.arange(g.size), a[g]]
            self.table[g, a[g]] += d
            self.table[g, old[g]] -= d
            self._p = self._mode = None
        return int(g.size)

    def sync(self) -> None:
        self.var.assign(self.table.astype(np.float32))
