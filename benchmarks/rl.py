"""RL placers against simulated annealing and TPE at equal evaluation budgets.

    python benchmarks/rl.py                                  # nmt, inception_v3, gnmt4 on k80x4
    python benchmarks/rl.py --evals 3000 --seconds 90 --json
    python benchmarks/rl.py --graphs synthetic-1k --plot rl.png

For each graph (zoo graphs where ``data/graphs`` has them, else synthetic ones), in one
run side by side: the expert and m-etf placements (one evaluation each) for scale, then
``sa``, ``tpe`` and ``rl`` with each policy (seq2seq, hierarchical, gdp) under the same
budget (``--evals`` placements, capped at ``--seconds``). Each row gives the best step
time at 25%, 50% and 100% of the evaluations, the seconds taken, and the best relative
to the best non-neural result on that graph. Methods not installed are skipped.

GDP transfer: a GDP policy is pre-trained (``--pretrain-seconds``) on the zoo graphs not
in the test set, then placed zero-shot (its greedy placement, 1 evaluation) and
fine-tuned (the same budget as the others) on each test graph.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from placetool.costmodel import CostModel, presets  # noqa: E402
from placetool.search import Budget, Problem, SearchError, run  # noqa: E402

DEFAULT_GRAPHS = ("nmt", "inception_v3", "gnmt4")
FALLBACK = {"nmt": "synthetic-2000", "inception_v3": "synthetic-5000", "gnmt4": "synthetic-10k"}
PRETRAIN = ("rnnlm", "resnet50", "transformer", "wavenet")


def best_at(history, evals) -> float:
    """Best step time after ``evals`` evaluations (inf before the first feasible one)."""
    b = np.inf
    for e, _, s in history:
        if e <= evals:
            b = s
    return b


def one(method, problem, budget, seed, **opts) -> dict | None:
    try:
        t = time.perf_counter()
        r = run(method, problem, budget, seed=seed, **opts)
        wall = time.perf_counter() - t
    except (SearchError, ImportError) as e:
        print(f"  skip {method} {opts}: {e}", file=sys.stderr)
        return None
    E = r.evaluations
    return {"best": r.step_time_us, "feasible": r.feasible, "evals": E, "seconds": wall,
            "at25": best_at(r.history, E // 4), "at50": best_at(r.history, E // 2),
            "history": [(int(e), float(s), float(b)) for e, s, b in r.history]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", default=",".join(DEFAULT_GRAPHS))
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--evals", type=int, default=3000, help="evaluations per method and graph")
    ap.add_argument("--seconds", type=float, default=90.0, help="time cap per method and graph")
    ap.add_argument("--policies", default="seq2seq,hierarchical,gdp")
    ap.add_argument("--pretrain-seconds", type=float, default=90.0, help="0: skip the GDP transfer part")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, help="write best-vs-evaluations curves to this PNG")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    have = set(presets.list_graphs())
    graphs = [g if g in have else FALLBACK.get(g, g) for g in a.graphs.split(",") if g]
    cl = presets.load_cluster(a.cluster)
    budget = Budget(evals=a.evals, seconds=a.seconds)
    rows, curves = [], {}

    policy_dir = None
    if a.pretrain_seconds > 0:
        from placetool.cli.main import main as cli_main

        train = [g for g in PRETRAIN if g in have and g not in graphs] or ["synthetic-500", "synthetic-800"]
        policy_dir = tempfile.mkdtemp(prefix="gdp-")
        print(f"pre-training gdp on {', '.join(train)} for {a.pretrain_seconds:g} s", file=sys.stderr)
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the table / JSON
            try:
                cli_main(["rl", "pretrain", "--graphs", ",".join(train), "--clusters", a.cluster, "--out", policy_dir,
                          "--seconds", str(a.pretrain_seconds), "--json"])
            except SystemExit as e:
                if e.code:
                    raise

    for gname in graphs:
        p = Problem(CostModel(presets.load_graph(gname), cl))
        print(f"{gname}: {p.graph.n_ops} ops, {p.n_groups} groups", file=sys.stderr)
        res = {}
        for m in ("expert", "m-etf"):
            r = one(m, p, Budget(evals=1, seconds=a.seconds), a.seed)
            if r:
                res[m] = r
        for m in ("sa", "tpe"):
            r = one(m, p, budget, a.seed)
            if r:
                res[m] = r
        for pol in [s for s in a.policies.split(",") if s]:
            r = one("rl", p, budget, a.seed, policy=pol)
            if r:
                res[f"rl-{pol}"] = r
        if policy_dir:
            r = one("rl", p, Budget(evals=1), a.seed, init_from=policy_dir)
            if r:
                res["gdp zero-shot"] = r
            r = one("rl", p, budget, a.seed, init_from=policy_dir)
            if r:
                res["gdp fine-tuned"] = r
        ref_names = [m for m in ("expert", "m-etf", "sa", "tpe") if m in res and res[m]["feasible"]]
        ref = min((res[m]["best"] for m in ref_names), default=np.nan)
        for m, r in res.items():
            rows.append({"graph": gname, "method": m, **{k: v for k, v in r.items() if k != "history"},
                         "vs_best_non_neural": r["best"] / ref if np.isfinite(ref) else None})
            curves[(gname, m)] = r["history"]

    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(graphs), figsize=(5 * len(graphs), 4), squeeze=False)
        for ax, gname in zip(axes[0], graphs):
            for (g, m), h in curves.items():
                if g == gname and len(h) > 1:
                    e, _, b = zip(*h)
                    ax.step(e, np.array(b) / 1e3, where="post", label=m)
            ax.set_title(gname)
            ax.set_xlabel("evaluations")
            ax.set_ylabel("best step time (ms)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)

    if a.json:
        print(json.dumps({"cluster": a.cluster, "evals": a.evals, "seconds": a.seconds, "rows": rows,
                          "curves": {f"{g}/{m}": h for (g, m), h in curves.items()}}, default=float))
        return 0
    print(f"cluster {a.cluster}, budget {a.evals} evaluations (capped at {a.seconds:g} s) per method")
    print(f"{'graph':<14} {'method':<18} {'evals':>6} {'secs':>6} {'best@25%':>10} {'best@50%':>10} "
          f"{'best (ms)':>10} {'vs best non-neural':>19}")
    for r in rows:
        def ms(x):
            return f"{x / 1e3:10.2f}" if np.isfinite(x) else f"{'-':>10}"
        vs = f"{r['vs_best_non_neural']:.3f}" if r["vs_best_non_neural"] else "-"
        print(f"{r['graph']:<14} {r['method']:<18} {r['evals']:>6} {r['seconds']:>6.1f} {ms(r['at25'])} "
              f"{ms(r['at50'])} {ms(r['best'])} {vs:>19}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
