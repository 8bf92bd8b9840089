"""Measured step time of what placetool recommends, against the baselines, on real devices.

Per graph (the same defaults as ``accuracy.py``), the way a user gets there:

1. trace the model and save the graph file (as ``placetool import`` does);
2. calibrate on the devices (``placetool calibrate``: op profile, lone transfers, designed
   split placements for the device-side transfer costs);
3. ``placetool search -m sa --budget-seconds S --verify-top 3`` on the calibrated
   cluster and profile (the real command, in a subprocess), which measures the 3 best
   placements found beside the single device and the best one-shot baseline and writes
   the recommended (measured best) placement with ``--out``;
4. one more interleaved run, side by side: the single device, the expert placement
   (where the graph has layer tags), the best one-shot baseline and the recommendation.

It prints the step 4 times (median ± half the range of the round medians), the
recommendation's gain over the single device and over the best baseline, and what
``--verify-top`` concluded.

    .venv/bin/python benchmarks/hardware_speedup.py                 # 2-worker CPU testbed
    .venv/bin/python benchmarks/hardware_speedup.py --json --graph models:towers@256
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from accuracy import DEFAULT_GRAPHS, calibrate_for, devices, trace_graph  # the script beside this one


def placetool(*args, cwd):
    r = subprocess.run([sys.executable, "-m", "placetool.cli.main", *args], capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise SystemExit(f"placetool {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return r


def _fresh(c: dict) -> dict:
    """A fresh confirmation run of ``--verify-top``, without its round medians by row index."""
    out = {key: c[key] for key in ("confirmed", "gain_pct", "ratios", "rounds", "rounds_run", "rounds_faster",
                                   "noise_floor_pct", "kept", "ratio_to_single") if key in c}
    if c.get("against_single"):
        out["against_single"] = {key: c["against_single"][key] for key in ("confirmed", "gain_pct", "ratios")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="append", help="SOURCE[@BATCH]; repeatable (default: as accuracy.py)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--cluster-spec", default=None, help="a running TF cluster instead of a local testbed")
    ap.add_argument("--search-seconds", type=float, default=15.0, help="sa budget")
    ap.add_argument("--refine", type=int, default=0, help="search --refine R: measure, refit and search again")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--trace-steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-transfer", type=int, default=4 * 2 ** 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--link-send", choices=["auto", "workers", "idle", "eager"], default="auto",
                    help="calibrate --link-send: the cluster's links.send rule (auto: workers, TensorFlow's run "
                         "queue, its costs identified from the session's traced split steps)")
    ap.add_argument("--workers-rule", action="store_const", const="workers", dest="link_send",
                    help=argparse.SUPPRESS)  # the dated commands in benchmarks/README.md
    ap.add_argument("--keep", metavar="DIR", default=None,
                    help="keep each graph's files here (graph, profile, cluster, recommendation); default: a "
                         "temporary folder, removed at the end")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    a.local = False
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if a.json else (lambda m: print(m, flush=True))

    from placetool.cli.verifytop import baselines
    from placetool.costmodel import CostModel
    from placetool.costmodel.tf.runner import measure_interleaved
    from placetool.search import Budget, Problem, run

    rows = []
    t_start = time.perf_counter()
    spec, tb = devices(a, log)
    work = a.keep or tempfile.mkdtemp(prefix="placetool-speedup-")
    os.makedirs(work, exist_ok=True)
    spec_file = os.path.join(work, "spec.json")
    with open(spec_file, "w") as f:
        json.dump(spec.cluster_def(), f)
    try:
        for k, s in enumerate(a.graph or DEFAULT_GRAPHS):
            t = trace_graph(s, log)
            gpath, prof, ctoml, rec = (os.path.join(work, f"{k}.{x}") for x in ("npz", "json", "toml", "rec.json"))
            t.graph.save(gpath)
            profile, cl = calibrate_for(t, spec, a, log, link_send=a.link_send)
            profile.save(prof)
            cl.save(ctoml)
            log(f"{s}: placetool search -m sa --budget-seconds {a.search_seconds:g} --verify-top 3 ...")
            r = placetool("search", "-g", gpath, "-c", ctoml, "--profile", prof, "-m", "sa", "--budget-seconds",
                          str(a.search_seconds), "--seed", str(a.seed), "--verify-top", "3", "--cluster-spec",
                          spec_file, "--out", rec, "--json", "--no-progress",
                          *(["--refine", str(a.refine)] if a.refine else []),
                          "--trust-graph-source", cwd=work)  # this script wrote the graph file itself
            found = json.loads(r.stdout)
            v = found["verified"]
            cm = CostModel(t.graph, cl, profile=profile)
            prob = Problem(cm)
            cands = [(label, p) for _, label, p in baselines(prob, a.seed)]
            one_shot = cands[-1][0]  # the best one-shot method's name (or single, if none ran)
            try:
                cands.insert(1, ("expert", run("expert", prob, Budget(evals=8), seed=a.seed).placement))
            except Exception as e:  # noqa: BLE001 - a graph without layer tags has no expert placement
                log(f"  (no expert placement: {str(e).splitlines()[0][:100] if str(e) else type(e).__name__})")
            with open(rec) as f:
                recommended = cm.placement_array(json.load(f)["devices"])
            cands.append((f"recommended ({v['recommended_label']})", recommended))
            log(f"{s}: measuring {len(cands)} placements side by side, {a.rounds} rounds of {a.steps} steps ...")
            reps = measure_interleaved(t, [p for _, p in cands], spec, rounds=a.rounds, steps=a.steps, warmup=2)
            meas = {label: m for (label, _), m in zip(cands, reps)}
            single, best_base = reps[0], min((m for (label, _), m in zip(cands, reps)
                                              if not label.startswith("recommended")), key=lambda m: m.step_us)
            recm = reps[-1]
            rows.append({
                "graph": s, "ops": t.graph.n_ops, "link_send": cl.link_send,
                "measured": {label: m.to_dict() for label, m in meas.items()},
                "predicted_us": {label: float(cm.simulate(p).step_time_us + profile.step_overhead(len(np.unique(p))))
                                 for label, p in cands},
                "baseline": one_shot,
                "recommended": v["recommended_label"],
                "gain_vs_single_pct": 100 * (single.step_us - recm.step_us) / single.step_us,
                "gain_vs_best_baseline_pct": 100 * (best_base.step_us - recm.step_us) / best_base.step_us,
                "noise_floor_pct": float(np.median([m.spread_pct for m in reps])),
                "verify_top": {key: v[key] for key in ("confirmed", "gain_pct", "noise_floor_pct", "message")},
                # the fresh runs that confirmed (or not) the pick: per-round ratios, rounds kept
                "confirmations": {key: _fresh(v[key]) for key in ("confirmation", "baseline_confirmation")
                                  if v.get(key)},
                "verify_top_rows": [{key: x[key] for key in ("label", "predicted_us", "measured_us", "spread_pct")}
                                    for x in v["rows"]],
                "sa_predicted_us": found["step_time_us"],
                "refine": v.get("refine"),
            })
            log(f"  {v['message']}")
    finally:
        if tb is not None:
            tb.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    out = {"rows": rows, "devices": spec.tf_devices, "seconds": time.perf_counter() - t_start,
           "settings": {"search_seconds": a.search_seconds, "rounds": a.rounds, "steps": a.steps, "seed": a.seed,
                        "link_send": a.link_send}}
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print()
    for r in rows:
        print(f"{r['graph']} ({r['ops']} ops; noise floor ±{r['noise_floor_pct']:.1f}%)")
        for label, m in r["measured"].items():
            print(f"  {label:<34} measured {m['measured_us'] / 1e3:9.2f} ms ±{m['spread_pct']:4.1f}%   "
                  f"predicted {r['predicted_us'][label] / 1e3:9.2f} ms")
        print(f"  recommended vs single: {r['gain_vs_single_pct']:+.1f}%, vs best baseline: "
              f"{r['gain_vs_best_baseline_pct']:+.1f}%; --verify-top: {r['verify_top']['message']}")
    print(f"({out['seconds']:.0f} s; devices: {len(spec.tf_devices)} x {spec.kinds[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
