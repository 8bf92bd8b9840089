"""Replay recorded split steps on workers of one compute thread, and identify its costs.

Reads the folders that ``timeline_fit.py record DIR`` writes (no TensorFlow) and replays
every traced split step with its own op times under
:func:`placetool.costmodel.workers.simulate_workers`: TensorFlow's run queue (the
thread's own work last in, first out; RecvTensor handlers and ops readied by an arrived
tensor first in, first out behind it) and a grid of per-message costs on the compute
threads, on the calibrated lone-transfer links. Prints:

1. **Per graph, its own best costs** (the grid point with the least median |error| over
   that graph's placements): do fits on different graphs agree? And the best on all
   graphs together (``placetool.costmodel.workers.TESTBED_COSTS``).
2. **Leave one graph out**: the costs best on the other graphs, judged on the held-out
   one, split into designed placements and the search's picks; beside them the
   simulator's own rules (``links.send`` eager and aside, a + k x bytes on both ends,
   fitted the same way), from the same recordings.
3. **Prediction**: every recorded placement (one device included) with the profile's op
   times, against its measured untraced step: the calibrated simulator (``calibrate``'s
   whole-step fit) and the workers with the held-out costs of table 2; median and max
   |error|, Kendall's tau, and the error on each of the search's picks.

    .venv/bin/python benchmarks/replay_workers.py /tmp/tl [--steps 1] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from placetool.costmodel import CostModel, timeline
from placetool.costmodel.workers import WorkerCosts, simulate_workers

#: the grid: request, handler, arrival (µs per message), and µs per MB on each end
REQUEST_US = (0.0, 25.0, 50.0)
HANDLER_US = (25.0, 50.0, 75.0, 100.0)
ARRIVE_US = (0.0, 25.0, 50.0)
US_PER_MB = (150.0, 250.0, 350.0)
#: the simulator's rules, a + k x bytes on both ends: (µs, µs per MB)
SIM_COSTS = tuple(itertools.product((25.0, 50.0, 100.0), (150.0, 250.0, 350.0)))


def grid() -> list[WorkerCosts]:
    return [WorkerCosts(r, h, k * 1e-6, a, k * 1e-6)
            for r, h, a, k in itertools.product(REQUEST_US, HANDLER_US, ARRIVE_US, US_PER_MB)]


def steps_of(data, n_steps):
    """(graph, label, searched?, Recording, Step) of every split step, n_steps per placement."""
    for name, (g, prof, recs, _) in data.items():
        for label, rec in recs:
            if label.startswith("single"):
                continue
            for st in rec.steps[:n_steps]:
                yield name, label, ":" not in label, rec, st


def worker_error(rec, st, links, costs) -> float:
    t = simulate_workers(rec.executed_graph(), np.where(st.traced, st.op_us, 0.0), rec.placement,
                         links.latency_us, links.bandwidth_bytes_per_us, costs)
    return 100.0 * (t.span_us(st.traced) - st.span_us) / st.span_us


def _best(errors: dict, names) -> tuple:
    """The key whose errors, pooled over graphs ``names``, have the least median |error|."""
    def score(k):
        return float(np.median(np.abs(np.concatenate([errors[k][n] for n in names]))))
    return min(errors, key=score)


def _stats(e: np.ndarray) -> dict:
    a = np.abs(e)
    return {"median_pct": float(np.median(e)), "median_abs_pct": float(np.median(a)),
            "p90_abs_pct": float(np.percentile(a, 90)), "max_abs_pct": float(a.max()), "n": int(len(e))}


def run(data, n_steps: int, log=print) -> dict:
    from timeline_fit import lone_links, with_message_costs

    rows = list(steps_of(data, n_steps))
    names = list(data)
    links = {n: lone_links(data[n][1], "eager") for n in names}
    searched = {n: np.array([s for m, _, s, _, _ in rows if m == n]) for n in names}
    workers, sim = {}, {}
    for c in grid():
        workers[c] = {n: np.array([worker_error(r, st, links[n], c) for m, _, _, r, st in rows if m == n])
                      for n in names}
    log(f"{len(rows)} split steps, {len(workers)} worker-cost points")
    for mode, (a, k) in itertools.product(("eager", "aside"), SIM_COSTS):
        sim[(mode, a, k)] = {n: np.array([timeline.replay(r, st, cluster=with_message_costs(
            replace(links[n], link_send=mode), a, k * 1e-6), links=None)["error_pct"]
            for m, _, _, r, st in rows if m == n]) for n in names}
    own = {n: _best(workers, [n]) for n in names}
    pooled = _best(workers, names)
    held = {}
    for n in names:
        rest = [m for m in names if m != n]
        c, s = _best(workers, rest), _best(sim, rest)
        held[n] = {"workers": {"costs": asdict(c), "all": _stats(workers[c][n]),
                               "designed": _stats(workers[c][n][~searched[n]]),
                               "searched": _stats(workers[c][n][searched[n]])},
                   "simulator": {"rule": {"links.send": s[0], "a_us": s[1], "k_us_per_mb": s[2]},
                                 "all": _stats(sim[s][n]), "searched": _stats(sim[s][n][searched[n]])}}
    pred = {n: predictions(data, n, held[n]["workers"]["costs"]) for n in names}
    return {"steps_per_placement": n_steps, "split_steps": len(rows), "prediction": pred,
            "own_best": {n: {"costs": asdict(own[n]), **_stats(workers[own[n]][n])} for n in names},
            "pooled_best": {"costs": asdict(pooled),
                            **_stats(np.concatenate([workers[pooled][n] for n in names]))},
            "held_out": held}


def predictions(data, name, costs: dict) -> dict:
    """Measured untraced steps against the calibrated simulator and the workers model, both
    on the profile's op times plus its step overhead."""
    from scipy.stats import kendalltau
    from timeline_fit import lone_links, predict

    g, prof, recs, _ = data[name]
    sim, meas, labels = predict(data, name, None)
    lone = lone_links(prof, "eager")
    T = CostModel(g, prof.cluster(), profile=prof).T
    c = WorkerCosts(**costs)
    wk = []
    for _, rec in recs:
        p = np.asarray(rec.placement)
        t = simulate_workers(g, T[np.arange(g.n_ops), p], p, lone.latency_us, lone.bandwidth_bytes_per_us, c)
        wk.append(t.span_us() + prof.step_overhead(len(np.unique(p))))
    out = {"labels": labels, "measured_us": meas.tolist()}
    for key, pr in (("simulator", sim), ("workers", np.array(wk))):
        e = 100.0 * (pr - meas) / meas
        out[key] = {"predicted_us": pr.tolist(), "median_abs_pct": float(np.median(np.abs(e))),
                    "max_abs_pct": float(np.abs(e).max()), "kendall_tau": float(kendalltau(pr, meas)[0]),
                    "searched_pct": {lb: float(x) for lb, x in zip(labels, e) if ":" not in lb}}
    return out


def _costs(c: dict) -> str:
    return (f"{c['request_us']:.0f} / {c['handler_us']:.0f} / {c['arrive_us']:.0f} / "
            f"{c['send_us_per_byte'] * 1e6:.0f}")


def print_tables(r: dict) -> None:
    print("\nPer graph, its own best worker costs (request / handler / arrival µs / µs per MB):")
    print(f"{'graph':32s} {'costs':>22s} {'median':>8s} {'med |e|':>8s} {'p90':>6s} {'max':>6s}")
    for n, o in r["own_best"].items():
        print(f"{n[:32]:32s} {_costs(o['costs']):>22s} {o['median_pct']:+7.1f}% {o['median_abs_pct']:7.1f}% "
              f"{o['p90_abs_pct']:5.1f}% {o['max_abs_pct']:5.1f}%")
    o = r["pooled_best"]
    print(f"{'all graphs':32s} {_costs(o['costs']):>22s} {o['median_pct']:+7.1f}% {o['median_abs_pct']:7.1f}% "
          f"{o['p90_abs_pct']:5.1f}% {o['max_abs_pct']:5.1f}%")
    print("\nLeave one graph out (costs best on the other graphs), |error| median / p90 / max:")
    print(f"{'held out':32s} {'worker costs':>22s} {'workers, all':>18s} {'designed':>18s} {'searched':>18s}"
          f" {'simulator rule':>18s} {'simulator, all':>18s} {'searched':>18s}")
    for n, h in r["held_out"].items():
        w, s = h["workers"], h["simulator"]

        def f(x):
            return f"{x['median_abs_pct']:4.1f} / {x['p90_abs_pct']:4.1f} / {x['max_abs_pct']:4.1f}"
        rule = f"{s['rule']['links.send']} {s['rule']['a_us']:.0f}+{s['rule']['k_us_per_mb']:.0f}/MB"
        print(f"{n[:32]:32s} {_costs(w['costs']):>22s} {f(w['all']):>18s} {f(w['designed']):>18s} "
              f"{f(w['searched']):>18s} {rule:>18s} {f(s['all']):>18s} {f(s['searched']):>18s}")


    print("\nPrediction (profile op times), against measured untraced steps: med |e| / max / tau; "
          "the search's picks")
    for n, pr in r["prediction"].items():
        for key in ("simulator", "workers"):
            x = pr[key]
            picks = "  ".join(f"{lb} {v:+.0f}%" for lb, v in x["searched_pct"].items())
            print(f"{n[:32]:32s} {key:10s} {x['median_abs_pct']:5.1f}% {x['max_abs_pct']:5.1f}% "
                  f"{x['kendall_tau']:5.2f}   {picks}")


def main(argv=None) -> int:
    from timeline_fit import load_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=1, help="traced steps replayed per placement")
    ap.add_argument("--graph-order", action="store_true",
                    help="ready each op's consumers in the model graph's order, not in the executor's order that "
                         "the recordings hold (out_order)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    data = {d.name: load_dir(d) for d in sorted(Path(a.dir).iterdir()) if (d / "profile.json").exists()}
    if not data:
        raise SystemExit(f"{a.dir}: no recorded graphs (run timeline_fit.py record first)")
    if a.graph_order:
        for _, _, recs, _ in data.values():
            for _, rec in recs:
                rec.out_order = None
    r = run(data, a.steps, log=lambda m: print(m, file=sys.stderr))
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print_tables(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
