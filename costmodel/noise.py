"""Measuring through the noise (no TensorFlow here).

A shared machine has episodes where everything slows by 20-40%. Two tools:

- a *sentinel*: a fixed reference step timed before the first round and after every
  round of an interleaved measurement; its spread before the rounds is the noise floor,
  and a round after which it drifted beyond that floor is flagged (and can be run again):
  :func:`noise_floor_pct`, :func:`drift_pct`, :func:`flag_rounds`;
- *paired ratios*: each placement's round median over the reference placement's (one
  device) median of the same round, so load that hits a whole round cancels;
  :func:`paired_ratios`.

And one yardstick: how far a model's ranking can agree with measurements this noisy
(:func:`tau_ceiling`).
"""

from __future__ import annotations

import numpy as np


def noise_floor_pct(samples) -> float:
    """Half the range of repeated measurements of one thing, % of their median (the
    spread of :class:`~placetool.costmodel.tf.runner.Repeated`, for the sentinel)."""
    x = np.asarray(samples, np.float64)
    if x.size < 2 or np.median(x) <= 0:
        return 0.0
    return float(100.0 * (x.max() - x.min()) / 2.0 / np.median(x))


def drift_pct(values, baseline) -> np.ndarray:
    """How far each value lies from the baseline's median, % (signed)."""
    b = float(np.median(np.asarray(baseline, np.float64)))
    return 100.0 * (np.asarray(values, np.float64) - b) / b


def flag_rounds(after_round, baseline, limit_pct: float) -> list[int]:
    """Rounds during which the sentinel drifted beyond ``limit_pct``: round r is flagged
    when the sentinel timed before it (the baseline's last for round 0, else after
    round r - 1) or after it lies further than that from the baseline's median."""
    d = np.abs(drift_pct(after_round, baseline))
    before = np.r_[np.abs(drift_pct([baseline[-1]], baseline)), d[:-1]] if d.size else d
    return [int(r) for r in np.flatnonzero(np.maximum(d, before) > limit_pct)]


def paired_ratios(round_us, ref: int, keep=None) -> list[dict]:
    """Per placement: its round medians over the reference placement's, round by round.

    ``round_us``: one list of round medians per placement (equal lengths); ``keep``:
    rounds to use (default all). Returns per placement {ratio (median of the per-round
    ratios), ratios, spread_pct (half their range, % of the ratio)}; the reference's
    ratio is 1 with no spread.
    """
    R = np.asarray(round_us, np.float64)
    if R.ndim != 2 or not 0 <= ref < len(R):
        raise ValueError("round_us is one row of round medians per placement; ref indexes a row")
    rounds = np.arange(R.shape[1]) if keep is None else np.asarray(list(keep), np.int64)
    if rounds.size == 0:
        rounds = np.arange(R.shape[1])
    Q = R[:, rounds] / R[ref, rounds][None, :]
    out = []
    for q in Q:
        m = float(np.median(q))
        out.append({"ratio": m, "ratios": [float(v) for v in q],
                    "spread_pct": float(100.0 * (q.max() - q.min()) / 2.0 / m) if q.size > 1 and m > 0 else 0.0})
    return out


def tau_ceiling(round_us, rounds: int | None = None, draws: int = 400, seed: int = 0) -> dict:
    """How high Kendall's tau can go against these measurements: the tau of a model that
    knew every placement's step exactly, scored against medians of as many rounds (or of
    ``rounds``), as noisy as these.

    ``round_us``: one row of round medians per placement (equal lengths, 2 rounds or
    more). The round effect (load that hits every placement of a round alike) is taken
    out and the rest, pooled, is one round's noise (log scale). Each placement's median
    stands in for its true step; it carries noise too, which spreads the placements
    wider than they are, so the ceiling is, if anything, high. Returns {median, p10, p90
    (over ``draws`` simulated measurements), round_noise_pct}.

    >>> tau_ceiling([[100, 101, 99], [120, 119, 121], [140, 141, 139]])["median"]
    1.0
    >>> # ten placements 1% apart, each round +-2-3% off: no model can rank them all
    >>> c = tau_ceiling([[100 + k, 100 + k + (3 if k % 2 else -3), 100 + k + (-2 if k % 3 else 2)]
    ...                  for k in range(10)])
    >>> 0.6 < c["median"] < 0.9, round(c["round_noise_pct"], 1)
    (True, 2.1)
    """
    from scipy.stats import kendalltau

    L = np.log(np.asarray(round_us, np.float64))
    if L.ndim != 2 or L.shape[1] < 2 or L.shape[0] < 2:
        raise ValueError("round_us is one row of 2 or more round medians per placement, 2 placements or more")
    L = L - L.mean(axis=0, keepdims=True)
    resid = L - L.mean(axis=1, keepdims=True)
    P, R = L.shape
    sd = float(np.sqrt((resid ** 2).sum() / ((P - 1) * (R - 1))))
    truth = np.median(L, axis=1)
    rng = np.random.default_rng(seed)
    n = R if rounds is None else max(int(rounds), 1)
    taus = np.array([kendalltau(truth, np.median(truth[:, None] + rng.normal(0.0, sd, (P, n)), axis=1)).statistic
                     for _ in range(max(draws, 1))])
    return {"median": float(np.median(taus)), "p10": float(np.percentile(taus, 10)),
            "p90": float(np.percentile(taus, 90)), "round_noise_pct": 100.0 * (float(np.exp(sd)) - 1.0)}
