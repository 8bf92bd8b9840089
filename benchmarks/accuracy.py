"""Cost-model accuracy on real devices: predicted vs measured step times.

For each graph: trace it once, calibrate just before measuring it (per-op profile on
one worker, transfer, dispatch and step-overhead fits, latency fit to 3 split steps of
another seed), then measure >= N placements — every single
device, the partitioner / list-scheduler / expert outputs that exist in ``search``, and
random group assignments — and compare with the calibrated simulator's prediction
(simulated makespan + the measured fixed per-step overhead). Per graph it prints the
median and max absolute error %, Kendall's tau between predicted and measured, and
whether the predicted best is the measured best.

    .venv/bin/python benchmarks/accuracy.py                      # 2-worker CPU testbed
    .venv/bin/python benchmarks/accuracy.py --json
    .venv/bin/python benchmarks/accuracy.py --workers 4 --device gpu --graph inception_v3@32
                                         # a 4-GPU machine: one worker per GPU

A graph is ``NAME[:key=value,...][@BATCH]`` (zoo name, builder options, batch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

# Small versions of zoo models: a step takes tens of ms on one contended core.
DEFAULT_GRAPHS = [
    "mlp:hidden=1024,depth=4,features=1024@256",
    "rnnlm:layers=2,hidden=256,vocab=4000,seq_len=6@32",
    "transformer:layers=1,d_model=128,heads=4,d_ff=512,vocab=2000,seq_len=16@16",
]
METHODS = ["expert", "metis", "heft", "m-etf", "m-topo", "critical-path"]


def parse_graph(s: str):
    name, _, batch = s.partition("@")
    name, _, opts = name.partition(":")
    kw = {}
    for it in filter(None, opts.split(",")):
        k, _, v = it.partition("=")
        try:
            kw[k] = int(v)
        except ValueError:
            try:
                kw[k] = float(v)
            except ValueError:
                kw[k] = v
    return name, kw, (int(batch) if batch else None)


def candidate_placements(cm, n_random: int, seed: int, log):
    """[(label, per-op placement)]: single devices, search methods, random assignments."""
    from placetool.search import Budget, Problem, run

    g, cl = cm.graph, cm.cluster
    out, seen = [], set()

    def add(label, p):
        p = np.ascontiguousarray(p, np.int32)
        key = p.tobytes()
        if key not in seen and cm.violation(p) is None:
            seen.add(key)
            out.append((label, p))

    for d in range(cl.n_devices):
        add(f"single:{cl.names[d]}", cm.single_device(d))
    prob = Problem(cm)
    for m in METHODS:
        try:
            r = run(m, prob, Budget(evals=200, seconds=20), seed=seed)
            add(m, r.placement)
        except Exception as e:  # a method that is missing or fails is skipped, and said so
            log(f"  (method {m} skipped: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
    rng = np.random.default_rng(seed)
    tries = 0
    while len(out) < n_random + cl.n_devices and tries < 50 * n_random:
        tries += 1
        k = len(out)
        # vary how much is split: from "mostly one device" to uniform
        frac = rng.uniform(0.02, 0.5)
        a = np.where(rng.random(g.n_groups) < frac, rng.integers(0, cl.n_devices, g.n_groups),
                     rng.integers(0, cl.n_devices))
        a = np.where(prob.allowed[np.arange(g.n_groups), a], a, np.argmax(prob.allowed, axis=1))
        add(f"random:{k}", g.to_placement(a))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="append", help="NAME[:k=v,...][@BATCH]; repeatable (default: 3 small zoo models)")
    ap.add_argument("--placements", type=int, default=30, help="random placements per graph (on top of singles/methods)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--cluster-spec", default=None, help="use a running TF cluster instead of a local testbed")
    ap.add_argument("--local", action="store_true", help="this process's CPU + GPUs (in-process) instead of workers")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--trace-steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibrate-once", action="store_true",
                    help="one calibration for all graphs up front (default: one per graph, just before it)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rows-out", default=None, help="also write every (graph, placement) row as JSON here")
    a = ap.parse_args(argv)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if a.json else (lambda m: print(m, flush=True))

    import keras
    from scipy.stats import kendalltau

    from placetool.costmodel import CostModel
    from placetool.costmodel.tf.calibrate import calibrate
    from placetool.costmodel.tf.importer import trace
    from placetool.costmodel.tf.runner import measure
    from placetool.costmodel.tf.testbed import ClusterSpec, Testbed

    graphs = a.graph or DEFAULT_GRAPHS
    traced = []
    for s in graphs:
        name, kw, batch = parse_graph(s)
        keras.backend.clear_session()
        t0 = time.perf_counter()
        t = trace(name, batch=batch, **kw)
        log(f"traced {s}: {t.graph.n_ops} ops, {t.graph.n_groups} groups ({time.perf_counter() - t0:.1f} s)")
        traced.append((s, t))

    rows, detail = [], []
    t_start = time.perf_counter()
    tb = None
    try:
        if a.cluster_spec:
            spec = ClusterSpec.load(a.cluster_spec)
        elif a.local:
            from placetool.costmodel.tf.runner import local_spec

            spec = local_spec()
        else:
            tb = Testbed.start(a.workers, device=a.device, timeout_s=180)
            spec = tb.spec
        log(f"devices: {', '.join(spec.tf_devices)}")
        profiles = []
        for s, t in traced:
            if a.calibrate_once:
                if not profiles:
                    profiles.append(calibrate([t for _, t in traced], spec, trace_steps=a.trace_steps, log=log))
                profile, cl = profiles[0]
            else:
                # calibrate right before measuring: on a shared machine the load drifts
                # over minutes, and a profile taken long before is a profile of another load
                profile, cl = calibrate([t], spec, trace_steps=a.trace_steps, log=log)
                profiles.append((profile, cl))
            g = t.graph
            cm = CostModel(g, cl, profile=profile)
            cands = candidate_placements(cm, a.placements, a.seed, log)
            log(f"{s}: measuring {len(cands)} placements ...")
            pred, meas = [], []
            for label, p in cands:
                sim = cm.simulate(p).step_time_us
                pr = sim + profile.step_overhead(len(np.unique(p)))
                m = measure(t, p, spec, warmup=a.warmup, steps=a.steps)
                pred.append(pr)
                meas.append(m.step_us)
                detail.append({"graph": s, "placement": label, "devices_used": int(len(np.unique(p))),
                               "predicted_us": pr, "simulated_us": sim, "measured_us": m.step_us,
                               "error_pct": 100 * (pr - m.step_us) / m.step_us})
                log(f"  {label:<16} predicted {pr / 1e3:9.2f} ms  measured {m.step_us / 1e3:9.2f} ms  "
                    f"error {detail[-1]['error_pct']:+7.1f}%")
            pred, meas = np.array(pred), np.array(meas)
            err = np.abs(pred - meas) / meas * 100
            tau = float(kendalltau(pred, meas).statistic)
            rows.append({
                "graph": s, "ops": g.n_ops, "placements": len(cands),
                "median_abs_error_pct": float(np.median(err)), "max_abs_error_pct": float(np.max(err)),
                "kendall_tau": tau,
                "best_agrees": bool(int(np.argmin(pred)) == int(np.argmin(meas))),
                "measured_best_us": float(meas.min()),
                "measured_of_predicted_best_us": float(meas[int(np.argmin(pred))]),
            })
    finally:
        if tb is not None:
            tb.stop()
    secs = time.perf_counter() - t_start
    out = {"rows": rows, "devices": spec.tf_devices, "seconds": secs,
           "calibrations": [{"links": [{k: l[k] for k in ("src", "dst", "latency_us", "bandwidth_bytes_per_us")}
                                       for l in p.links],
                             "step_overhead_us": p.step_overhead_us, "dispatch_us": p.dispatch_us}
                            for p, _ in profiles]}
    if a.rows_out:
        with open(a.rows_out, "w") as f:
            json.dump({"summary": out, "placements": detail}, f, indent=1)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print()
    print(f"{'graph':<58} {'ops':>5} {'pl':>4} {'med|err|%':>9} {'max|err|%':>9} {'tau':>6} {'best':>5}")
    for r in rows:
        print(f"{r['graph']:<58} {r['ops']:>5} {r['placements']:>4} {r['median_abs_error_pct']:>9.1f} "
              f"{r['max_abs_error_pct']:>9.1f} {r['kendall_tau']:>6.2f} {('yes' if r['best_agrees'] else 'no'):>5}")
    print(f"({secs:.0f} s; devices: {len(spec.tf_devices)} x {spec.kinds[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
