"""Search quality: every method on zoo graphs x clusters, at a fixed budget, over seeds.

    python benchmarks/search_quality.py                  # full: 4 graphs x 2 clusters, 60 s, seeds 0-2
    python benchmarks/search_quality.py --graphs nmt,inception_v3 --clusters k80x4 --seconds 30 --seeds 1
    python benchmarks/search_quality.py --quick          # small graphs, 2 clusters, 5 s, 1 seed
    python benchmarks/search_quality.py --json           # {"rows": [...], "summary": {...}}

Graphs: ``nmt``, ``inception_v3``, ``gnmt4``, ``transformer`` where ``data/graphs`` has
them (``placetool.costmodel.presets.list_graphs()``), synthetic graphs otherwise.
Clusters: ``k80x4``, ``k40x8``. Every registered method but ``rl`` (``--with-rl``) and
``exact`` (meant for small graphs; ``--methods`` can name it) runs on the same Problem
with the same budget, once per seed: search methods (sa, tpe, random) spend it all,
one-shot methods (baselines, partitioners, list schedulers) stop after their few
evaluations. Per instance the median over seeds is printed: step time relative to
``expert`` (< 1 is faster than the expert) and to the lower bound
(:mod:`placetool.search.bounds`); per method evaluations per second, the gap to the
lower bound, for the list schedulers their planned vs simulated makespan, for the
searchers the best step time at a quarter and half of the budget (quality vs time), and
where a peer's placement is known (Baechi's m-ETF/m-SCT scored in this simulator) the
best result against it. The summary checks that ``sa`` and ``tpe`` are never worse than
the best one-shot method.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

ZOO = ["nmt", "inception_v3", "gnmt4", "transformer"]
CLUSTERS = ["k80x4", "k40x8"]
SEARCHERS = {"sa", "tpe", "random", "rl", "exact"}  # spend the whole budget
NOT_BY_DEFAULT = {"rl", "exact"}
#: one-shot methods that ignore the seed: run once, not once per seed
DETERMINISTIC = {"single", "round-robin", "expert", "heft", "critical-path", "m-topo", "m-etf", "m-sct"}
#: an independent implementation's placements (Baechi's own m-ETF and m-SCT over
#: networkx, same graphs and op times), scored in this simulator before the timeline
#: and bound changes (µs)
PEER = {("nmt", "k80x4"): {"peer m-etf": 231.8e3, "peer m-sct": 283.6e3},
        ("inception_v3", "k80x4"): {"peer m-etf": 420.6e3, "peer m-sct": 371.0e3}}


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

    names = requested.split(",") if requested else [
        m for m in search.methods() if m not in NOT_BY_DEFAULT or (with_rl and m == "rl")]
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


def _at(history, seconds):
    """Best step time reached within ``seconds`` (inf before the first)."""
    best = math.inf
    for _, s, b in history:
        if s <= seconds:
            best = b
    return best


def run_instance(graph, cluster, methods, seconds, seeds):
    from placetool.costmodel import CostModel, presets
    from placetool.search import Budget, Problem, run

    g = presets.load_graph(graph)
    cm = CostModel(g, presets.load_cluster(cluster))
    problem = Problem(cm)
    bounds = problem.lower_bounds()
    lb = bounds["best"]
    rows = []
    for m in methods:
        for seed in seeds[:1] if m in DETERMINISTIC else seeds:
            t = time.perf_counter()
            meta = {}
            try:
                r = run(m, problem, Budget(seconds=seconds), seed=seed)
                step, feas, evals, err, meta, hist = (r.step_time_us, r.feasible, r.evaluations, None, r.metadata,
                                                      r.history)
                took = r.seconds
            except Exception as e:  # noqa: BLE001 - one failing method must not stop the table
                step, feas, evals, err, hist, took = math.inf, False, 0, f"{type(e).__name__}: {e}", [], 0.0
            rows.append({"graph": graph, "ops": g.n_ops, "groups": g.n_groups, "cluster": cluster, "method": m,
                         "seed": seed, "step_time_us": step, "feasible": feas, "lower_bound_us": lb,
                         "lower_bounds_us": bounds, "evaluations": evals, "seconds": time.perf_counter() - t,
                         "evals_per_second": evals / took if took > 0 else math.nan,
                         "planned_us": meta.get("planned_us", math.nan),
                         "simulated_us": meta.get("simulated_us", math.nan),
                         "memory_fit": meta.get("memory_fit"),
                         "best_at_quarter_us": _at(hist, seconds / 4), "best_at_half_us": _at(hist, seconds / 2),
                         "error": err})
            print(f"  {graph:<14} {cluster:<6} {m:<14} seed {seed} {step / 1e3:10.2f} ms  "
                  f"{'ok' if feas else 'INFEASIBLE'}  {rows[-1]['seconds']:6.2f} s  {evals} evals",
                  file=sys.stderr, flush=True)
    med = {}
    for m in methods:
        v = sorted(r["step_time_us"] for r in rows if r["method"] == m and r["feasible"])
        med[m] = v[len(v) // 2] if v else math.nan
    expert = med.get("expert", math.nan)
    for r in rows:
        r["vs_expert"] = r["step_time_us"] / expert if r["feasible"] else math.nan
        r["vs_lower_bound"] = r["step_time_us"] / lb if r["feasible"] and lb > 0 else math.nan
    return rows


def medians(rows, key):
    """{(graph, cluster, method): median of ``key`` over seeds (feasible rows)}."""
    out = {}
    for r in rows:
        out.setdefault((r["graph"], r["cluster"], r["method"]), []).append(r[key] if r["feasible"] else math.nan)
    res = {}
    for k, v in out.items():
        v = sorted(x for x in v if isinstance(x, (int, float)) and math.isfinite(x))
        res[k] = v[len(v) // 2] if v else math.nan
    return res


def summarise(rows, methods):
    vs_exp, vs_lb = medians(rows, "vs_expert"), medians(rows, "vs_lower_bound")
    eps = medians(rows, "evals_per_second")
    insts = sorted({(r["graph"], r["cluster"]) for r in rows})
    out = {}
    for m in methods:
        v = [vs_exp[g, c, m] for g, c in insts if math.isfinite(vs_exp.get((g, c, m), math.nan))]
        lbv = [vs_lb[g, c, m] for g, c in insts if math.isfinite(vs_lb.get((g, c, m), math.nan))]
        e = [eps[g, c, m] for g, c in insts if math.isfinite(eps.get((g, c, m), math.nan))]
        out[m] = {
            "geomean_vs_expert": math.exp(sum(map(math.log, v)) / len(v)) if v else math.nan,
            "best_vs_expert": min(v) if v else math.nan,
            "geomean_vs_lower_bound": math.exp(sum(map(math.log, lbv)) / len(lbv)) if lbv else math.nan,
            "infeasible": sum(1 for r in rows if r["method"] == m and not r["feasible"]),
            "mean_seconds": sum(r["seconds"] for r in rows if r["method"] == m)
            / max(1, sum(1 for r in rows if r["method"] == m)),
            "median_evals_per_second": sorted(e)[len(e) // 2] if e else math.nan,
        }
    step = medians(rows, "step_time_us")
    goal = {}
    for s in ("sa", "tpe"):
        if s not in methods:
            continue
        worse = []
        for g, c in insts:
            base = min((step[g, c, m] for m in methods if m not in SEARCHERS
                        and math.isfinite(step.get((g, c, m), math.nan))), default=math.inf)
            if step.get((g, c, s), math.inf) > base * (1 + 1e-9):
                worse.append(f"{g}/{c}")
        goal[s] = {"never_worse_than_best_baseline": not worse, "worse_on": sorted(worse)}
    for (g, c), peers in PEER.items():
        if (g, c) not in insts:
            continue
        ours = min((step[g, c, m] for m in methods if math.isfinite(step.get((g, c, m), math.nan))),
                   default=math.nan)
        goal[f"{g}/{c}"] = {"best_ms": ours / 1e3, **{k: v / 1e3 for k, v in peers.items()},
                            "beats_peer_m_sct": ours < peers["peer m-sct"]}
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
    vs_exp, step = medians(rows, "vs_expert"), medians(rows, "step_time_us")
    for g, c in insts:
        e = step.get((g, c, "expert"), math.nan)
        lb = next(r["lower_bound_us"] for r in rows if (r["graph"], r["cluster"]) == (g, c))
        line = f"{g:<14} {c:<7} {fmt(e / 1e3):>10} {fmt(lb / e):>7} "
        line += " ".join(f"{fmt(vs_exp.get((g, c, m), math.nan)):>{max(8, len(m))}}" for m in methods)
        print(line)
    print()
    print(f"{'method':<14} {'geomean/exp':>11} {'best/exp':>9} {'geomean/LB':>10} {'infeasible':>10} {'mean s':>8}")
    for m in methods:
        s = summary[m]
        print(f"{m:<14} {fmt(s['geomean_vs_expert'], '.3f'):>11} {fmt(s['best_vs_expert'], '.3f'):>9} "
              f"{fmt(s['geomean_vs_lower_bound'], '.2f'):>10} {s['infeasible']:>10} {s['mean_seconds']:>8.2f}")
    print()
    print("per instance and method, medians over seeds: step ms, gap to the lower bound, evaluations/s,")
    print("planned/simulated makespan (list schedulers), best ms at 1/4 and 1/2 of the budget (searchers)")
    step, eps = medians(rows, "step_time_us"), medians(rows, "evals_per_second")
    plan, sim = medians(rows, "planned_us"), medians(rows, "simulated_us")
    q1, q2 = medians(rows, "best_at_quarter_us"), medians(rows, "best_at_half_us")
    for g, c in insts:
        lb = next(r["lower_bound_us"] for r in rows if (r["graph"], r["cluster"]) == (g, c))
        print(f"{g}/{c}: lower bound {lb / 1e3:.1f} ms")
        for m in methods:
            k = (g, c, m)
            extra = ""
            if math.isfinite(plan.get(k, math.nan)):
                extra = f"  planned {plan[k] / 1e3:8.1f} ms ({plan[k] / sim[k]:.2f} of simulated)"
            elif m in SEARCHERS:
                extra = f"  at 1/4: {fmt(q1[k] / 1e3, '.1f')} ms, at 1/2: {fmt(q2[k] / 1e3, '.1f')} ms"
            print(f"  {m:<14} {fmt(step[k] / 1e3, '.1f'):>9} ms  {fmt(step[k] / lb):>6}x LB "
                  f"{fmt(eps[k], '.0f'):>9} evals/s{extra}")
    within = {}
    for g, c in insts:
        for m in methods:
            k = (g, c, m)
            if math.isfinite(plan.get(k, math.nan)) and sim.get(k, 0) > 0:
                within.setdefault(m, []).append(abs(plan[k] / sim[k] - 1) <= 0.10)
    if within:
        print("plan within 10% of the simulation: " + ", ".join(
            f"{m} {sum(v)}/{len(v)}" for m, v in within.items()))
    for s, v in goal.items():
        if "never_worse_than_best_baseline" in v:
            print(f"goal: {s} never worse than the best one-shot baseline: "
                  f"{'yes' if v['never_worse_than_best_baseline'] else 'NO on ' + ', '.join(v['worse_on'])}")
        else:
            print(f"peer {s}: ours {v['best_ms']:.1f} ms vs peer m-SCT {v['peer m-sct']:.1f} ms, "
                  f"m-ETF {v['peer m-etf']:.1f} ms: {'beaten' if v['beats_peer_m_sct'] else 'NOT beaten'}")


SA_VARIANTS = {"default": {},
               "five-kinds-uniform": dict(kinds="pull,neighbour,chain,offload,swap", adapt=False),
               "critical/batch": dict(moves="critical", mode="batch"),
               "critical/incremental": dict(moves="critical", mode="incremental"),
               "random/incremental": dict(moves="random", mode="incremental"),
               "random/batch": dict(moves="random", mode="batch")}


def sa_variants(graphs, clusters, seconds, seeds, variants=None):
    """Evaluations per second and best step time vs time of sa's move and scoring modes
    (``variants``: names from :data:`SA_VARIANTS`, default all)."""
    from placetool.costmodel import CostModel, presets
    from placetool.search import Budget, Problem, run

    print(f"sa variants, {seconds:g} s each: best ms at 1/4, 1/2, all of the budget; evaluations/s over the "
          "whole run (seeding included)")
    out = []
    for gname in graphs:
        for c in clusters:
            p = Problem(CostModel(presets.load_graph(gname), presets.load_cluster(c)))
            for name in variants or SA_VARIANTS:
                opts = SA_VARIANTS[name]
                for seed in seeds:
                    r = run("sa", p, Budget(seconds=seconds), seed=seed, **opts)
                    row = {"graph": gname, "cluster": c, "variant": name, "seed": seed,
                           "at_quarter_ms": _at(r.history, seconds / 4) / 1e3,
                           "at_half_ms": _at(r.history, seconds / 2) / 1e3, "final_ms": r.step_time_us / 1e3,
                           "evaluations": r.evaluations, "evals_per_second": r.evaluations / r.seconds,
                           "proposals": r.metadata.get("proposals"),
                           "accepted_by_kind": r.metadata.get("accepted_by_kind")}
                    out.append(row)
                    print(f"  {gname:<13} {c:<6} {name:<21} seed {seed} {row['at_quarter_ms']:8.1f} "
                          f"{row['at_half_ms']:8.1f} {row['final_ms']:8.1f} ms  {r.evaluations:6d} evals "
                          f"({row['evals_per_second']:.0f}/s overall)  accepted {row['accepted_by_kind']}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", help="comma-separated graph names (default: the zoo, else synthetic)")
    ap.add_argument("--clusters", help=f"comma-separated clusters (default {','.join(CLUSTERS)})")
    ap.add_argument("--methods", help="comma-separated methods (default: every registered one but rl)")
    ap.add_argument("--seconds", type=float, default=None, help="budget per method (default 60, 5 with --quick)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 per method (default 3, 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="2 clusters, smaller graphs, 5 s budget, 1 seed")
    ap.add_argument("--with-rl", action="store_true", help="include the rl method (TensorFlow)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--save", metavar="FILE", help="also write the JSON object to FILE")
    ap.add_argument("--sa-variants", action="store_true",
                    help="instead: sa's move/scoring modes, evaluations/s and quality vs time (default graphs "
                         "inception_v3,gnmt8 on k80x4)")
    ap.add_argument("--variants", help=f"with --sa-variants: comma-separated, of {', '.join(SA_VARIANTS)} "
                                       "(default all)")
    a = ap.parse_args(argv)
    if a.sa_variants:
        variants = [v.strip() for v in a.variants.split(",")] if a.variants else None
        unknown = [v for v in variants or () if v not in SA_VARIANTS]
        if unknown:
            ap.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(SA_VARIANTS)})")
        rows = sa_variants((a.graphs or "inception_v3,gnmt8").split(","), (a.clusters or "k80x4").split(","),
                           a.seconds or 30.0, list(range(a.seeds or 1)), variants)
        if a.save:
            from placetool.costmodel.errors import atomic_write

            atomic_write(a.save, json.dumps(_finite({"sa_variants": rows}), default=float) + "\n")
        return
    seconds = a.seconds or (5.0 if a.quick else 60.0)
    graphs, missing = pick_graphs(a.graphs, a.quick)
    clusters = a.clusters.split(",") if a.clusters else (["k80x2", "k80x4"] if a.quick else CLUSTERS)
    seeds = list(range(a.seeds or (1 if a.quick else 3)))
    methods, skipped = pick_methods(a.methods, a.with_rl)
    if missing:
        print(f"note: zoo graphs not in data/graphs: {', '.join(missing)}", file=sys.stderr)
    for m, why in skipped.items():
        print(f"note: method {m} skipped ({why})", file=sys.stderr)
    rows = []
    for g in graphs:
        for c in clusters:
            rows += run_instance(g, c, methods, seconds, seeds)
    summary, goal = summarise(rows, methods)
    doc = json.dumps(_finite({"seconds": seconds, "seeds": seeds, "graphs": graphs, "clusters": clusters, "methods": methods,
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
