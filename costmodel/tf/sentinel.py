"""A fixed reference step (the sentinel) timed between rounds of an interleaved measurement.

The sentinel is the same small graph on every run: on each device in turn a chain of
``chain`` ``size x size`` float32 MatMuls, the running product handed to the next device
(one transfer per hop), so it feels what slows compute and what slows gRPC. It is timed
``calibrate`` times before the first round (its spread then is the noise floor) and once
after every round; a round during which it drifted further than ``limit_pct`` from its
median is run again (up to ``max_redo`` times in all) or, when no redo is left, flagged.
Placements are then compared by paired per-round ratios against a reference placement
(one device): :func:`placetool.costmodel.noise.paired_ratios`.

>>> # reps, report = measure_with_sentinel(traced, [single, split], spec, rounds=5)
>>> # report["noise_floor_pct"], report["flagged_rounds"], report["paired"][1]["ratio"]
"""

from __future__ import annotations

import statistics

import numpy as np

from placetool.costmodel import noise

from .runner import PlacedStep, any_silent, check_placement, measure_interleaved
from .session import import_tf


class Sentinel(PlacedStep):
    """The reference step opened on ``spec``'s devices: ``with Sentinel(spec) as s: s.time()``.

    A :class:`~placetool.costmodel.tf.runner.PlacedStep` of its own graph, so a worker
    lost while it runs is found as in any measured step."""

    def __init__(self, spec, size: int = 128, chain: int = 8, steps: int = 5, timeout_s: float = 120.0):
        self.spec, self.size, self.chain, self.steps, self.timeout_s = spec, size, chain, steps, timeout_s
        self.sess = None
        self.abandoned = self.failed = False

    def _graph(self):
        tf1 = import_tf().compat.v1
        g = tf1.Graph()
        rng = np.random.default_rng(0)
        with g.as_default():
            x = None
            for dev in self.spec.tf_devices:
                with tf1.device(dev):
                    if x is None:
                        x = tf1.constant(rng.standard_normal((self.size, self.size)).astype(np.float32))
                    # orthogonal weights: the product neither blows up nor vanishes
                    q, _ = np.linalg.qr(rng.standard_normal((self.size, self.size)))
                    w = tf1.constant(q.astype(np.float32))
                    for _ in range(self.chain):
                        x = tf1.matmul(x, w)
        return g, [x.op.name], [], None

    def time(self) -> float:
        """Median wall time of ``steps`` sentinel steps, µs."""
        return float(statistics.median(self.step() for _ in range(max(self.steps, 1))))


class Monitor:
    """Times the sentinel between the rounds of :func:`~placetool.costmodel.tf.runner.measure_interleaved`.

    :meth:`start` times it ``calibrate`` times (its noise floor, half range % of median,
    sets the drift limit ``max(limit_factor x floor, min_limit_pct)``); :meth:`again`
    times it after a round and says whether the round should be run again: the sentinel
    drifted beyond the limit during it and fewer than ``max_redo`` rounds were redone.
    :meth:`report` is the account: {noise_floor_pct, baseline_us, limit_pct,
    after_round_us, drift_pct, redone, flagged_rounds, kept_rounds (those not flagged,
    possibly none), paired_rounds (the kept ones, or every round if none was kept: ratios
    to show, not to confirm with)}.
    """

    def __init__(self, sentinel: Sentinel, rounds: int, calibrate: int = 5, limit_factor: float = 2.0,
                 min_limit_pct: float = 2.0, max_redo: int | None = None):
        self.sent, self.rounds, self.calibrate = sentinel, max(rounds, 1), max(calibrate, 2)
        self.limit_factor, self.min_limit_pct = limit_factor, min_limit_pct
        self.max_redo = self.rounds if max_redo is None else max_redo
        self.baseline: list[float] = []
        self.after = [float("nan")] * self.rounds
        self.floor = self.limit = 0.0
        self.redone = 0

    def start(self) -> None:
        self.baseline = [self.sent.time() for _ in range(self.calibrate)]
        self.floor = noise.noise_floor_pct(self.baseline)
        self.limit = max(self.limit_factor * self.floor, self.min_limit_pct)

    def again(self, r: int, log=None) -> bool:
        self.after[r] = self.sent.time()
        before = self.baseline[-1] if r == 0 else self.after[r - 1]
        drift = float(np.abs(noise.drift_pct([before, self.after[r]], self.baseline)).max())
        if drift > self.limit and self.redone < self.max_redo:
            self.redone += 1
            if log:
                log(f"  round {r + 1}/{self.rounds}: the sentinel drifted {drift:.1f}% "
                    f"(limit {self.limit:.1f}%), again")
            return True
        return False

    def report(self) -> dict:
        flagged = noise.flag_rounds(self.after, self.baseline, self.limit)
        keep = [r for r in range(self.rounds) if r not in flagged]
        return {"noise_floor_pct": self.floor, "baseline_us": self.baseline, "limit_pct": self.limit,
                "after_round_us": self.after, "drift_pct": [float(x) for x in noise.drift_pct(self.after, self.baseline)],
                "redone": self.redone, "flagged_rounds": flagged, "kept_rounds": keep,
                "paired_rounds": keep or list(range(self.rounds))}


def measure_with_sentinel(traced, placements, spec, rounds: int = 3, steps: int = 3, warmup: int = 2,
                          reference: int = 0, calibrate: int = 5, limit_factor: float = 2.0,
                          min_limit_pct: float = 2.0, max_redo: int | None = None, timeout_s: float = 120.0,
                          log=None, sentinel_kw: dict | None = None):
    """:func:`~placetool.costmodel.tf.runner.measure_interleaved` with the sentinel timed
    between rounds (:class:`Monitor`), and placements compared by paired per-round
    ratios to placement ``reference`` over the rounds not flagged (all, if every round is).

    Returns (one :class:`Repeated` per placement, in the order given; :meth:`Monitor.report`
    plus ``paired``: each placement's :func:`~placetool.costmodel.noise.paired_ratios`).
    """
    P = [check_placement(traced.graph, p, spec) for p in placements]  # all refused before any runs
    if not 0 <= reference < len(P):
        raise ValueError(f"reference {reference} is not one of the {len(P)} placements")
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    with Sentinel(spec, timeout_s=timeout_s, **(sentinel_kw or {})) as sent:
        mon = Monitor(sent, rounds, calibrate, limit_factor, min_limit_pct, max_redo)
        try:
            reps = measure_interleaved(traced, P, spec, rounds=rounds, steps=steps, warmup=warmup,
                                       timeout_s=timeout_s, log=log, monitor=mon)
        except BaseException:
            # its session talks to the same workers: a lost one is not waited for at closing
            sent.abandoned = sent.abandoned or any_silent(spec)
            sent.failed = True
            raise
    report = mon.report()
    report["paired"] = noise.paired_ratios([m.round_us for m in reps], reference, keep=report["paired_rounds"])
    return reps, report
