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
import time

import numpy as np

from placetool.costmodel import noise

from .runner import PlacedStep, Repeated, _tf_errors, check_placement
from .session import import_tf, session_config


class Sentinel:
    """The reference step opened on ``spec``'s devices: ``with Sentinel(spec) as s: s.time()``."""

    def __init__(self, spec, size: int = 128, chain: int = 8, steps: int = 5, timeout_s: float = 120.0):
        self.spec, self.size, self.chain, self.steps, self.timeout_s = spec, size, chain, steps, timeout_s
        self.sess = None

    def __enter__(self):
        tf = import_tf()
        tf1 = tf.compat.v1
        g = tf.Graph()
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
            self.target = x.op
        threads = 1 if self.spec.workers else max(2, len(self.spec.tf_devices))
        with _tf_errors(self.timeout_s):
            self.sess = tf1.Session(self.spec.target, graph=g,
                                    config=session_config(self.timeout_s, threads, isolate=True))
            self.sess.run(self.target)  # registration
        return self

    def time(self) -> float:
        """Median wall time of ``steps`` sentinel steps, µs."""
        out = []
        with _tf_errors(self.timeout_s):
            for _ in range(max(self.steps, 1)):
                s = time.perf_counter()
                self.sess.run(self.target)
                out.append((time.perf_counter() - s) * 1e6)
        return float(statistics.median(out))

    def close(self) -> None:
        if self.sess is not None:
            self.sess.close()
            self.sess = None

    def __exit__(self, *exc):
        self.close()
        return False


def measure_with_sentinel(traced, placements, spec, rounds: int = 3, steps: int = 3, warmup: int = 2,
                          reference: int = 0, calibrate: int = 5, limit_factor: float = 2.0,
                          min_limit_pct: float = 2.0, max_redo: int | None = None, timeout_s: float = 120.0,
                          log=None, sentinel_kw: dict | None = None):
    """:func:`~placetool.costmodel.tf.runner.measure_interleaved` with a sentinel between rounds.

    Placements are opened at once and run ``steps`` steps each per round, the order
    rotating every round. The sentinel is timed ``calibrate`` times first; its noise
    floor (half range, % of median) sets the drift limit, ``max(limit_factor x floor,
    min_limit_pct)``; a round during which it drifted beyond that is run again, at most
    ``max_redo`` times over the whole run (default: ``rounds``), else flagged.

    Returns (one :class:`Repeated` per placement, in the order given; a report: {noise_floor_pct,
    baseline_us, limit_pct, after_round_us, drift_pct, redone, flagged_rounds, paired}, where
    ``paired`` holds each placement's per-round ratios to placement ``reference`` over
    the unflagged rounds (all, if every round is flagged)).
    """
    P = [check_placement(traced.graph, p, spec) for p in placements]  # all refused before any runs
    if not 0 <= reference < len(P):
        raise ValueError(f"reference {reference} is not one of the {len(P)} placements")
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    R = max(rounds, 1)
    max_redo = R if max_redo is None else max_redo
    keys, uniq = [], {}
    for p in P:
        keys.append(uniq.setdefault(p.tobytes(), len(uniq)))
    first = {j: P[i] for i, j in reversed(list(enumerate(keys)))}
    opened: list[PlacedStep] = []
    times = [[[] for _ in range(R)] for _ in range(len(uniq))]
    with Sentinel(spec, timeout_s=timeout_s, **(sentinel_kw or {})) as sent:
        try:
            for j in range(len(uniq)):
                opened.append(PlacedStep(traced, first[j], spec, timeout_s).__enter__())
                for _ in range(max(warmup - 1, 0)):
                    opened[-1].step()
            baseline = [sent.time() for _ in range(max(calibrate, 2))]
            floor = noise.noise_floor_pct(baseline)
            limit = max(limit_factor * floor, min_limit_pct)
            after = [float("nan")] * R
            redone = 0
            r = 0
            while r < R:
                order = list(range(len(opened)))
                order = order[r % len(order):] + order[:r % len(order)]
                for j in order:
                    times[j][r] = [opened[j].step() for _ in range(max(steps, 1))]
                after[r] = sent.time()
                before = baseline[-1] if r == 0 else after[r - 1]
                drift = max(abs(noise.drift_pct([before], baseline)[0]), abs(noise.drift_pct([after[r]], baseline)[0]))
                if drift > limit and redone < max_redo:
                    redone += 1
                    if log:
                        log(f"  round {r + 1}/{R}: the sentinel drifted {drift:.1f}% (limit {limit:.1f}%), again")
                    continue
                if log:
                    log(f"  round {r + 1}/{R} done (sentinel drift {drift:.1f}%)")
                r += 1
        finally:
            for st in opened:
                st.close()
    flagged = noise.flag_rounds(after, baseline, limit)
    reps = []
    for j in keys:
        rs = times[j]
        flat = [t for rr in rs for t in rr]
        reps.append(Repeated(float(statistics.median(flat)), [float(statistics.median(rr)) for rr in rs], flat))
    keep = [r for r in range(R) if r not in flagged]
    paired = noise.paired_ratios([m.round_us for m in reps], reference, keep=keep)
    report = {"noise_floor_pct": floor, "baseline_us": baseline, "limit_pct": limit, "after_round_us": after,
              "drift_pct": [float(x) for x in noise.drift_pct(after, baseline)], "redone": redone,
              "flagged_rounds": flagged, "paired_rounds": keep or list(range(R)), "paired": paired}
    return reps, report
