"""The sentinel's arithmetic (noise floor, drift, flagged rounds, paired ratios) and,
with real workers, a measurement with the sentinel between rounds."""

from __future__ import annotations

import numpy as np
import pytest

from placetool.costmodel import noise


def test_noise_floor_and_drift():
    assert noise.noise_floor_pct([100, 104, 98, 102, 100]) == pytest.approx(3.0)  # (104 - 98) / 2 / 100
    assert noise.noise_floor_pct([100]) == 0.0
    assert noise.drift_pct([110, 95], [100, 90, 105]).tolist() == pytest.approx([10.0, -5.0])


def test_flagged_rounds_take_the_sentinel_before_and_after():
    base = [100, 101, 99, 100]
    # after round 0: 101 (fine); after round 1: 130 (drifted) -> rounds 1 and 2 ran next to it
    assert noise.flag_rounds([101, 130, 100, 100], base, 5.0) == [1, 2]
    assert noise.flag_rounds([101, 102, 100], base, 5.0) == []
    # the baseline's own last value leads into round 0: 120 against a median of 100
    assert noise.flag_rounds([100, 100], [100, 100, 120], 5.0) == [0]


def test_paired_ratios_cancel_load_that_hits_a_whole_round():
    single = [100, 140, 100]        # round 1 is 40% slower for everyone
    split = [80, 112, 80]
    other = [120, 140, 90]
    out = noise.paired_ratios([single, split, other], ref=0)
    assert out[0] == {"ratio": 1.0, "ratios": [1.0, 1.0, 1.0], "spread_pct": 0.0}
    assert out[1]["ratio"] == pytest.approx(0.8) and out[1]["spread_pct"] == pytest.approx(0.0)
    assert out[2]["ratios"] == pytest.approx([1.2, 1.0, 0.9])
    assert out[2]["ratio"] == pytest.approx(1.0) and out[2]["spread_pct"] == pytest.approx(15.0)
    # flagged rounds left out
    assert noise.paired_ratios([single, other], ref=0, keep=[0, 2])[1]["ratios"] == pytest.approx([1.2, 0.9])
    with pytest.raises(ValueError):
        noise.paired_ratios([single], ref=3)


class Scripted:
    """A sentinel whose timings are given: what the monitor does with them is the test."""

    def __init__(self, times):
        self.times = list(times)

    def time(self) -> float:
        return self.times.pop(0)


def test_monitor_reruns_a_drifting_round_then_flags_when_no_redo_is_left():
    from placetool.costmodel.tf.sentinel import Monitor

    # calibration 100, 102, 98 (floor 2%, limit max(2 x 2, 2) = 4%); after round 0: 101 (fine);
    # after round 1: 120 (drift 20%: run again), then 103 (fine); after round 2: 130 with
    # no redo left: kept, and flagged
    m = Monitor(Scripted([100, 102, 98, 101, 120, 103, 130]), rounds=3, calibrate=3, max_redo=1)
    m.start()
    assert m.floor == pytest.approx(2.0) and m.limit == pytest.approx(4.0)
    assert [m.again(0), m.again(1), m.again(1), m.again(2)] == [False, True, False, False]
    rep = m.report()
    assert rep["redone"] == 1 and rep["after_round_us"] == [101, 103, 130]
    assert rep["flagged_rounds"] == [2] and rep["paired_rounds"] == rep["kept_rounds"] == [0, 1]


def test_monitor_keeps_no_round_when_the_sentinel_flags_every_one():
    """Every round drifted (120, 60, 125 against a floor of 2%) and no redo is allowed:
    none is kept, so nothing can be confirmed from the run; the ratios shown fall back to
    every round."""
    from placetool.costmodel.tf.sentinel import Monitor

    m = Monitor(Scripted([100, 102, 98, 120, 60, 125]), rounds=3, calibrate=3, max_redo=0)
    m.start()
    assert [m.again(r) for r in range(3)] == [False] * 3
    rep = m.report()
    assert rep["flagged_rounds"] == [0, 1, 2] and rep["kept_rounds"] == [] and rep["paired_rounds"] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_measure_with_sentinel_on_a_testbed():
    from placetool.costmodel.tf.importer import trace
    from placetool.costmodel.tf.sentinel import measure_with_sentinel
    from placetool.costmodel.tf.testbed import Testbed

    t = trace("mlp", batch=16)
    g = t.graph
    single = np.zeros(g.n_ops, np.int32)
    split = g.to_placement((np.arange(g.n_groups) % 2).astype(np.int32))
    with Testbed.start(2, timeout_s=120) as tb:
        reps, rep = measure_with_sentinel(t, [single, split, single.copy()], tb.spec, rounds=3, steps=2, warmup=1,
                                          calibrate=3, max_redo=2, sentinel_kw={"steps": 3})
    assert reps[0] == reps[2] and all(len(r.round_us) == 3 for r in reps)
    assert len(rep["baseline_us"]) == 3 and min(rep["baseline_us"]) > 0
    assert rep["noise_floor_pct"] == pytest.approx(noise.noise_floor_pct(rep["baseline_us"]))
    assert rep["limit_pct"] >= 2.0 and rep["redone"] <= 2
    assert rep["flagged_rounds"] == noise.flag_rounds(rep["after_round_us"], rep["baseline_us"], rep["limit_pct"])
    assert rep["paired"][0]["ratio"] == 1.0
    kept = rep["paired_rounds"]
    assert rep["paired"][1]["ratio"] == pytest.approx(
        float(np.median([reps[1].round_us[r] / reps[0].round_us[r] for r in kept])))


def test_tau_ceiling_falls_as_the_rounds_get_noisier_and_ignores_load_on_a_whole_round():
    """Placements 2% apart: with rounds 0.5% off each other a perfect ranking shows; at
    4% off it cannot; a round that slows every placement alike changes nothing."""
    rng = np.random.default_rng(1)
    truth = 100.0 * 1.02 ** np.arange(12)

    def rounds(noise_pct):
        return truth[:, None] * np.exp(rng.normal(0.0, noise_pct / 100, (12, 3)))

    quiet, noisy = noise.tau_ceiling(rounds(0.5)), noise.tau_ceiling(rounds(4.0))
    assert quiet["median"] > 0.9 > noisy["median"] and quiet["p10"] <= quiet["median"] <= quiet["p90"]
    assert noisy["round_noise_pct"] == pytest.approx(4.0, rel=0.5)
    r = rounds(2.0)
    slowed = r * np.array([1.0, 1.4, 1.0])  # an episode that hit round 1 everywhere
    assert noise.tau_ceiling(slowed) == pytest.approx(noise.tau_ceiling(r))
    # the medians of more rounds wander less: the ceiling they allow is higher
    assert noise.tau_ceiling(r, rounds=9)["median"] > noise.tau_ceiling(r)["median"]
    with pytest.raises(ValueError, match="2 or more round medians"):
        noise.tau_ceiling([[100.0], [101.0]])
