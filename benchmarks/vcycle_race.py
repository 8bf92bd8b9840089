"""Does sa's race between a V-cycle and annealing on the groups pay? sa as shipped
("race": a short cycle against as long an annealing on the groups, the cycles run on
only where the cycle won) against sa with its cycles always ("before": ``cycles=`` the
count sa's default runs) and without them ("groups only": ``cycles=0``).

    python benchmarks/vcycle_race.py                                  # 8 zoo graphs, 15 s, seeds 0-1
    python benchmarks/vcycle_race.py --seconds 60 --seeds 0 --variants race,before
    python benchmarks/vcycle_race.py --json

Per instance and seed the variants run one after the other in one process, their order
rotated by seed; ratios are paired per seed. A quiet machine is assumed.
"""

from __future__ import annotations

import argparse
import json
import statistics

from placetool.search import Budget, Problem, run
from placetool.search.annealing import _default_cycles

INSTANCES = ("transformer/k40x8", "inception_v3/k80x4", "nmt/k80x4", "xception/k80x4", "mobilenet_v2/k80x4",
             "resnet50/k80x4", "gnmt4/k80x4", "densenet121/k80x4")
VARIANTS = ("race", "before", "groups only")


def row(instance: str, seconds: float, seeds: list[int], variants: list[str]) -> dict:
    p = Problem.preset(instance)
    budget = Budget(seconds=seconds)
    cycles = {"race": None, "before": _default_cycles(p, budget, None), "groups only": 0}
    out = {"instance": instance, "seconds": seconds, "lower_bound_us": p.lower_bounds()["best"],
           **{v: [] for v in variants}, "race_detail": []}
    for seed in seeds:
        order = variants[seed % len(variants):] + variants[:seed % len(variants)]
        for v in order:
            r = run("sa", p, budget, seed=seed, cycles=cycles[v])
            out[v].append(r.step_time_us)
            if v == "race":
                out["race_detail"].append(r.metadata.get("race"))
    return out


def summary(rows: list[dict], variants: list[str]) -> str:
    def ms(xs):
        return " / ".join(f"{x / 1e3:,.1f}" for x in xs)

    def ratio(a, b):
        r = [x / y for x, y in zip(a, b)]
        return f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})" if r else "-"

    others = [v for v in variants if v != "race"]
    head = ["instance", *variants, *(f"race / {v}" for v in others), "race won by"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    paired = {v: [] for v in others}
    for d in rows:
        won = ", ".join((g or {}).get("won", "-") for g in d["race_detail"])
        cells = [d["instance"], *(ms(d[v]) for v in variants)]
        for v in others:
            cells.append(ratio(d["race"], d[v]) if "race" in variants else "-")
            paired[v] += [x / y for x, y in zip(d.get("race", []), d[v])]
        lines.append("| " + " | ".join(cells + [won]) + " |")
    for v, r in paired.items():
        if r:
            lines.append(f"\nrace / {v}, all runs: median {statistics.median(r):.3f} "
                         f"({min(r):.3f}-{max(r):.3f}), {len(r)} paired runs")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", default=",".join(INSTANCES))
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--seeds", default="0,1", help="comma-separated")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)}")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    variants = [v.strip() for v in a.variants.split(",")]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "race" not in variants:
        ap.error(f"--variants must include race and name only {', '.join(VARIANTS)}")
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for inst in a.instances.split(","):
        rows.append(row(inst.strip(), a.seconds, seeds, variants))
        if a.json:
            print(json.dumps(rows[-1]), flush=True)
    if not a.json:
        print(summary(rows, variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
