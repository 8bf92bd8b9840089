"""Does pre-training pay on graphs it never saw? The shipped dispatching rule against the
same rule untrained (HEFT), the one-shot heuristics, and sa with and without it.

    python benchmarks/transfer.py                              # held-out graphs, seeds 0-2
    python benchmarks/transfer.py --instances inception_v3/k80x4 --seeds 1 --seconds 15,60
    python benchmarks/transfer.py --json

Per held-out instance (graph/cluster; no held-out graph is in the rule's training set,
``data/policies/dispatch/policy.json``'s recipe):

- zero-shot: ``dispatch`` with the pre-trained portfolio (HEFT and the shipped rules,
  the fastest kept) against the same method with an *untrained* portfolio of as many
  rules drawn from the distribution pre-training starts from (one per ``--seeds`` seed:
  the spread), each with its wall time and whether it fits in memory; the best one-shot
  heuristic (heft, critical-path, m-topo, m-etf, m-sct, metis, expert, single) and the
  gdp policy's zero-shot placement, as placed with 10 evaluations;
- for each budget in ``--seconds``: sa from the seeding methods *without* the rule
  ("sa") and as shipped, *with* it at its rank among them ("sa+rule"), per seed, and
  their ratio;
- time-to-quality: the seconds sa+rule's run at the largest budget needed to reach sa's
  result at that budget (median over seeds).

Every row's methods run one after the other in one process; compare ratios within a
row. A quiet machine is assumed: timings and anytime curves move with the load.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from placetool.search import Budget, Problem, run, seed_methods

HELD_OUT = ("inception_v3/k80x4", "transformer/k40x8", "gnmt8/k40x8")
ONE_SHOT = ("heft", "critical-path", "m-topo", "m-etf", "m-sct", "metis", "expert", "single")


def timed(method, p, budget, seed=0, **options):
    t = time.perf_counter()
    r = run(method, p, budget, seed=seed, **options)
    return r, time.perf_counter() - t


def untrained(seed: int) -> str:
    """A rule file of as many rules as the shipped one, drawn as pre-training's first
    generation is (:data:`placetool.rl.rule.INIT_STD`, clipped at 0)."""
    from placetool.rl.rule import INIT_STD
    from placetool.search.dispatch import read_rules, write_rules

    k = read_rules("dispatch").weights.shape
    w = np.maximum(np.random.default_rng(seed).normal(0.0, INIT_STD, size=k), 0.0)
    folder = Path(tempfile.mkdtemp(prefix="untrained-rules-"))
    atexit.register(shutil.rmtree, folder, True)
    return str(write_rules(folder, w, {"untrained_seed": seed}).parent)


def first_reach(history, target: float) -> float | None:
    """Seconds at which a run's best first reached ``target`` (None: never)."""
    for _, s, b in history:
        if b <= target * (1 + 1e-12):
            return float(s)
    return None


def row(instance: str, seconds: list[float], seeds: list[int], gdp: bool) -> dict:
    p = Problem.preset(instance)
    lb = p.lower_bounds()["best"]
    out = {"instance": instance, "ops": p.graph.n_ops, "lower_bound_us": lb, "one_shot": {}}
    for m in ONE_SHOT:
        r, w = timed(m, p, Budget(seconds=60))
        out["one_shot"][m] = {"us": r.step_time_us, "feasible": r.feasible, "s": w}
    feas = {m: v["us"] for m, v in out["one_shot"].items() if v["feasible"]}
    out["best_one_shot"] = min(feas, key=feas.get) if feas else None
    r, w = timed("dispatch", p, Budget(seconds=60))
    out["dispatch"] = {"us": r.step_time_us, "feasible": r.feasible, "s": w, "evaluations": r.evaluations,
                       "picked": r.metadata["picked"]}
    out["untrained"] = []
    for seed in seeds:
        r, w = timed("dispatch", p, Budget(seconds=60), policy=untrained(seed))
        out["untrained"].append({"seed": seed, "us": r.step_time_us, "feasible": r.feasible, "s": w,
                                 "picked": r.metadata["picked"]})
    if gdp:
        r, w = timed("rl", p, Budget(evals=10), init_from="gdp", zero_shot=True)
        out["gdp_zero_shot"] = {"us": r.step_time_us, "feasible": r.feasible, "s": w}
    without = ",".join(n for n in seed_methods() if n != "dispatch")
    out["search"] = []
    for s in seconds:
        for seed in seeds:
            a = run("sa", p, Budget(seconds=s), seed=seed, seeds=without)
            b = run("sa", p, Budget(seconds=s), seed=seed)  # as shipped: dispatch at its rank among the seeds
            out["search"].append({"seconds": s, "seed": seed, "sa_us": a.step_time_us, "sa_rule_us": b.step_time_us,
                                  "ratio": b.step_time_us / a.step_time_us, "sa_seed": a.metadata.get("seeds", [None])[0],
                                  "sa_rule_reaches_sa_s": first_reach(b.history, a.step_time_us),
                                  "sa_reaches_sa_rule_s": first_reach(a.history, b.step_time_us)})
    return out


def fmt(us) -> str:
    return f"{us / 1e3:,.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", default=",".join(HELD_OUT))
    ap.add_argument("--seconds", default="15,60", help="sa budgets, comma-separated")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-gdp", action="store_true", help="leave out the gdp policy's zero-shot placement")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    seconds = [float(x) for x in a.seconds.split(",") if x]
    # numba's compilation is not charged to the first instance
    warm = Problem.preset("synthetic-200/k80x4")
    for m in ("sa", "dispatch", "heft"):
        run(m, warm, Budget(evals=50), seed=0)
    rows = []
    for inst in [s for s in a.instances.split(",") if s]:
        print(f"{inst} ...", file=sys.stderr)
        rows.append(row(inst, seconds, list(range(a.seeds)), not a.no_gdp))
    if a.json:
        print(json.dumps(rows, default=float, indent=1))
        return 0
    print(f"{'instance':<20} {'lower bound':>11} {'best one-shot':>22} {'heft':>8} {'untrained, per seed':>26} "
          f"{'pre-trained':>11} {'/best':>6} {'/untr.':>6} {'s':>5} {'gdp zero-shot':>13}")
    for r in rows:
        b = r["best_one_shot"]
        bo = r["one_shot"][b]["us"] if b else float("nan")
        d = r["dispatch"]
        un = [u["us"] for u in r["untrained"]]
        gz = f"{fmt(r['gdp_zero_shot']['us'])}{'' if r['gdp_zero_shot']['feasible'] else ' OOM'}" \
            if "gdp_zero_shot" in r else "-"
        print(f"{r['instance']:<20} {fmt(r['lower_bound_us']):>11} {b + ' ' + fmt(bo):>22} "
              f"{fmt(r['one_shot']['heft']['us']):>8} {' / '.join(fmt(u) for u in un):>26} "
              f"{fmt(d['us']) + ('' if d['feasible'] else ' OOM'):>11} {d['us'] / bo:>6.3f} "
              f"{d['us'] / float(np.median(un)):>6.3f} {d['s']:>5.1f} {gz:>13}")
    print(f"\n{'instance':<20} {'budget':>6} {'sa (ms), per seed':>28} {'sa+rule (ms)':>28} {'ratios':>22} "
          f"{'rule reaches sa at (s)':>24}")
    for r in rows:
        for s in seconds:
            xs = [x for x in r["search"] if x["seconds"] == s]
            sa = " / ".join(fmt(x["sa_us"]) for x in xs)
            sr = " / ".join(fmt(x["sa_rule_us"]) for x in xs)
            ra = " / ".join(f"{x['ratio']:.3f}" for x in xs)
            reach = [x["sa_rule_reaches_sa_s"] for x in xs]
            rs = " / ".join("-" if v is None else f"{v:.1f}" for v in reach)
            print(f"{r['instance']:<20} {s:>6g} {sa:>28} {sr:>28} {ra:>22} {rs:>24}")
        top = max(seconds)
        xs = [x for x in r["search"] if x["seconds"] == top]
        med = float(np.median([x["ratio"] for x in xs]))
        print(f"{'':<20} median sa+rule / sa at {top:g} s: {med:.3f} (range {min(x['ratio'] for x in xs):.3f}-"
              f"{max(x['ratio'] for x in xs):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
