"""Search quality: every method on zoo graphs x clusters, at a fixed budget.

    python benchmarks/search_quality.py                  # full: 60 s per search method
    python benchmarks/search_quality.py --quick          # small graphs, 2 clusters, 5 s
    python benchmarks/search_quality.py --json           # {"rows": [...], "summary": {...}}

Graphs: the zoo graphs ``nmt``, ``gnmt4``, ``inception_v3``, ``rnnlm``, ``transformer``
where ``data/graphs`` has them (``placetool.costmodel.presets.list_graphs()``), synthetic graphs
otherwise. Clusters: ``k80x2``, ``k80x4``, ``k40x4``, ``k40x8``. Every registered method
(``rl`` only with ``--with-rl``) runs on the same Problem with the same budget: search
methods (sa, tpe, random) spend it all, one-shot methods (baselines, partitioners, list
schedulers) stop after their few evaluations. Printed per instance: step time relative
to ``expert`` (< 1 is faster than the expert) and to the lower bound, and seconds spent.
The summary gives each method's geometric mean over instances and checks the issue's
goal that ``sa`` and ``tpe`` are never worse than the best one-shot baseline.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

ZOO = ["nmt", "gnmt4", "inception_v3", "rnnlm", "transformer"]
CLUSTERS = ["k80x2", "k80x4", "k40x4", "k40x8"]
SEARCHERS = {"sa", "tpe", "random", "rl"}  # spend the whole budget


def pick_graphs(requested, quick):
    from placetool.costmodel import presets

    have = set(presets.list_graphs())
    if requested:
        return requested.split(","), []
    zoo = [g for g in ZOO if g in have]
    missing = [g for g in ZOO if g not in have]
    if not zoo:
        zoo = ["synthetic-1k", "synthetic-3000"] if quick else ["synthetic-1k", "synthetic-10k"]
    return zoo, missing


def pick_methods(requested, with_rl):
    from placetool import search

    names = requested.split(",") if requested else [m for m in search.methods() if with_rl or m != "rl"]
    ok, skipped = [], {}
    for m in names:
        try:
            search.get(m)
            ok.append(m)
        except Exception as e:  # noqa: BLE001 - a method not written yet is reported, not fatal
            skipped[m] = f"{type(e).__name__}: {e}"
    # expert first: everything is reported relative to it
    ok.sort(key=lambda m: (m != "expert", m))
    return ok, skipped


def run_instance(graph, cluster, methods, seconds, seed):
    from placetool.costmodel import CostModel, presets
    from placetool.search import Budget, Problem, run

    g = presets.load_graph(graph)
    cm = CostModel(g, presets.load_cluster(cluster))
    problem = Problem(cm)
    lb = problem.lower_bound_us()
    rows = []
    for m in methods:
        t = time.perf_counter()
        try:
            r = run(m, problem, Budget(seconds=seconds), seed=seed)
            step, feas, evals, err = r.step_time_us, r.feasible, r.evaluations, None
        except Exception as e:  # noqa: BLE001 - one failing method must not stop the table
            step, feas, evals, err = math.inf, False, 0, f"{type(e).__name__}: {e}"
        rows.append({"graph": graph, "ops": g.n_ops, "groups": g.n_groups, "cluster": cluster, "method": m,
                     "step_time_us": step, "feasible": feas, "lower_bound_us": lb, "evaluations": evals,
                     "seconds": time.perf_counter() - t, "error": err})
        print(f"  {graph:<14} {cluster:<6} {m:<14} {step / 1e3:10.2f} ms  {'ok' if feas else 'INFEASIBLE'}"
              f"  {rows[-1]['seconds']:6.2f} s", file=sys.stderr, flush=True)
    expert = next((r["step_time_us"] for r in rows if r["method"] == "expert" and r["feasible"]), math.nan)
    for r in rows:
        r["vs_expert"] = r["step_time_us"] / expert if r["feasible"] else math.nan
        r["vs_lower_bound"] = r["step_time_us"] / lb if r["feasible"] and lb > 0 else math.nan
    return rows


def summarise(rows, methods):
    out = {}
    for m in methods:
        v = [r["vs_expert"] for r in rows if r["method"] == m and math.isfinite(r["vs_expert"])]
        lbv = [r["vs_lower_bound"] for r in rows if r["method"] == m and math.isfinite(r["vs_lower_bound"])]
        out[m] = {
            "geomean_vs_expert": math.exp(sum(map(math.log, v)) / len(v)) if v else math.nan,
            "best_vs_expert": min(v) if v else math.nan,
            "geomean_vs_lower_bound": math.exp(sum(map(math.log, lbv)) / len(lbv)) if lbv else math.nan,
            "infeasible": sum(1 for r in rows if r["method"] == m and not r["feasible"]),
            "mean_seconds": sum(r["seconds"] for r in rows if r["method"] == m) / max(1, len(v)),
        }
    goal = {}
    for s in ("sa", "tpe"):
        if s not in methods:
            continue
        worse = []
        for key in {(r["graph"], r["cluster"]) for r in rows}:
            inst = [r for r in rows if (r["graph"], r["cluster"]) == key]
            base = min((r["step_time_us"] for r in inst if r["method"] not in SEARCHERS and r["feasible"]),
                       default=math.inf)
            mine = next(r["step_time_us"] for r in inst if r["method"] == s)
            if mine > base * (1 + 1e-9):
                worse.append(f"{key[0]}/{key[1]}")
        goal[s] = {"never_worse_than_best_baseline": not worse, "worse_on": sorted(worse)}
    return out, goal


def _finite(x):
    """Non-finite floats become null (strict JSON)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def fmt(x, spec=".2f"):
    return "-" if not math.isfinite(x) else format(x, spec)


def print_tables(rows, methods, summary, goal, seconds):
    insts = []
    for r in rows:
        if (r["graph"], r["cluster"]) not in insts:
            insts.append((r["graph"], r["cluster"]))
    print(f"step time / expert step time (lower is better; '-' = infeasible); budget {seconds:g} s per method")
    head = f"{'graph':<14} {'cluster':<7} {'expert ms':>10} {'LB/exp':>7} " + " ".join(f"{m:>{max(8, len(m))}}" for m in methods)
    print(head)
    print("-" * len(head))
    for g, c in insts:
        inst = {r["method"]: r for r in rows if (r["graph"], r["cluster"]) == (g, c)}
        e = inst.get("expert", {})
        lb_rel = e["lower_bound_us"] / e["step_time_us"] if e.get("feasible") else math.nan
        line = f"{g:<14} {c:<7} {fmt(e.get('step_time_us', math.nan) / 1e3):>10} {fmt(lb_rel):>7} "
        line += " ".join(f"{fmt(inst[m]['vs_expert']):>{max(8, len(m))}}" for m in methods)
        print(line)
    print()
    print(f"{'method':<14} {'geomean/exp':>11} {'best/exp':>9} {'geomean/LB':>10} {'infeasible':>10} {'mean s':>8}")
    for m in methods:
        s = summary[m]
        print(f"{m:<14} {fmt(s['geomean_vs_expert'], '.3f'):>11} {fmt(s['best_vs_expert'], '.3f'):>9} "
              f"{fmt(s['geomean_vs_lower_bound'], '.2f'):>10} {s['infeasible']:>10} {s['mean_seconds']:>8.2f}")
    for s, v in goal.items():
        print(f"goal: {s} never worse than the best one-shot baseline: "
              f"{'yes' if v['never_worse_than_best_baseline'] else 'NO on ' + ', '.join(v['worse_on'])}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", help="comma-separated graph names (default: the zoo, else synthetic)")
    ap.add_argument("--clusters", help=f"comma-separated clusters (default {','.join(CLUSTERS)})")
    ap.add_argument("--methods", help="comma-separated methods (default: every registered one but rl)")
    ap.add_argument("--seconds", type=float, default=None, help="budget per method (default 60, 5 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="2 clusters, smaller graphs, 5 s budget")
    ap.add_argument("--with-rl", action="store_true", help="include the rl method (TensorFlow)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--save", metavar="FILE", help="also write the JSON object to FILE")
    a = ap.parse_args(argv)
    seconds = a.seconds or (5.0 if a.quick else 60.0)
    graphs, missing = pick_graphs(a.graphs, a.quick)
    clusters = a.clusters.split(",") if a.clusters else (["k80x2", "k80x4"] if a.quick else CLUSTERS)
    methods, skipped = pick_methods(a.methods, a.with_rl)
    if missing:
        print(f"note: zoo graphs not in data/graphs: {', '.join(missing)}", file=sys.stderr)
    for m, why in skipped.items():
        print(f"note: method {m} skipped ({why})", file=sys.stderr)
    rows = []
    for g in graphs:
        for c in clusters:
            rows += run_instance(g, c, methods, seconds, a.seed)
    summary, goal = summarise(rows, methods)
    doc = json.dumps(_finite({"seconds": seconds, "graphs": graphs, "clusters": clusters, "methods": methods,
                              "skipped_methods": skipped, "missing_graphs": missing, "rows": rows,
                              "summary": summary, "goal": goal}), allow_nan=False, default=float)
    if a.save:
        from placetool.costmodel.errors import atomic_write

        atomic_write(a.save, doc + "\n")
    if a.json:
        print(doc)
    else:
        print_tables(rows, methods, summary, goal, seconds)


if __name__ == "__main__":
    main()
