"""Time of one list schedule (HEFT, a learnt dispatching rule, m-ETF) per instance.

    python benchmarks/list_schedulers.py                       # this checkout
    python benchmarks/list_schedulers.py --against /tmp/old    # paired with another
    python benchmarks/list_schedulers.py --json

Per instance and device set (all devices; GPUs only) it times the compiled schedule
alone (:meth:`placetool.search.listsched._Data.eft` / ``etf``, capacities as the
cluster's, no deadline): the fastest of ``--reps`` after one untimed call.

``--against DIR``: DIR is a folder from which ``import placetool`` gives another
version (e.g. a git worktree with a ``placetool`` package beside it, as the wheel lays
it out). Each round then measures both in fresh processes, one after the other,
alternating which goes first, and the table gives the median of the per-round ratios
(this checkout / the other) with their range: on a VM whose speed drifts for seconds
at a time, ratios of neighbours are what can be compared. The schedules are also
checked to place every op the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

INSTANCES = ["gnmt8:k40x8", "nmt:k80x4", "inception_v3:k80x4"]
KINDS = ["heft", "rule", "m-etf"]


def measure(instances, reps: int) -> dict:
    """{"instance/devices/kind": {"ms": fastest time, "place": op -> device}}."""
    import numpy as np

    from placetool.costmodel import CostModel, presets
    from placetool.search import Problem
    from placetool.search.dispatch import read_rules
    from placetool.search.listsched import _Data

    rule = read_rules("dispatch").weights[0]
    out = {}
    for spec in instances:
        gname, cname = spec.split(":")
        cm = CostModel(presets.load_graph(gname), presets.load_cluster(cname))
        problem = Problem(cm)
        for gpu_only in (False, True):
            data = _Data(problem, gpu_only, "queued")
            data.cap = cm.capacity.astype(float)
            rank = data.rank_u()
            calls = {"heft": lambda: data.eft(rank), "rule": lambda: data.eft(rank, rule=rule),
                     "m-etf": lambda: data.etf(rank)}
            for kind, call in calls.items():
                res = call()
                best = float("inf")
                for _ in range(reps):
                    t = time.perf_counter()
                    res = call()
                    best = min(best, time.perf_counter() - t)
                key = f"{spec}/{'gpus' if gpu_only else 'all'}/{kind}"
                out[key] = {"ms": 1e3 * best, "place": np.asarray(res[1][0]).tolist()}
    return out


def child(pythonpath: str | None, instances, reps: int) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, __file__, "--child", "--reps", str(reps), "--instances", ",".join(instances)]
    # run outside this checkout, so that `import placetool` finds what PYTHONPATH names
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/" if pythonpath else None, check=True)
    return json.loads(r.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", default=",".join(INSTANCES), help="GRAPH:CLUSTER,... (bundled names)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per schedule (the fastest is kept)")
    ap.add_argument("--against", metavar="DIR", help="another version to pair with (PYTHONPATH for it)")
    ap.add_argument("--rounds", type=int, default=5, help="--against: rounds of one measurement each")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    instances = a.instances.split(",")
    if a.child:
        print(json.dumps(measure(instances, a.reps)))
        return 0
    if not a.against:
        rows = {k: {"ms": v["ms"]} for k, v in measure(instances, a.reps).items()}
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            for k, v in rows.items():
                print(f"{k:<40} {v['ms']:8.1f} ms")
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ratios, ms, same = {}, {}, {}
    for k in range(a.rounds):
        order = [here, a.against] if k % 2 == 0 else [a.against, here]
        got = {p: child(p if p == a.against else None, instances, a.reps) for p in order}
        new, old = got[here], got[a.against]
        for key in new:
            ratios.setdefault(key, []).append(new[key]["ms"] / old[key]["ms"])
            ms.setdefault(key, []).append((new[key]["ms"], old[key]["ms"]))
            same[key] = same.get(key, True) and new[key]["place"] == old[key]["place"]
        print(f"round {k + 1}/{a.rounds} done", file=sys.stderr)
    rows = {key: {"ratio_median": statistics.median(r), "ratio_min": min(r), "ratio_max": max(r),
                  "ms_this": statistics.median(x for x, _ in ms[key]),
                  "ms_other": statistics.median(y for _, y in ms[key]), "same_placement": same[key]}
            for key, r in ratios.items()}
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'instance/devices/schedule':<40} {'this ms':>8} {'other ms':>8} {'ratio':>6} {'range':>13} same")
    for key, r in rows.items():
        print(f"{key:<40} {r['ms_this']:8.1f} {r['ms_other']:8.1f} {r['ratio_median']:6.3f} "
              f"{r['ratio_min']:6.3f}-{r['ratio_max']:5.3f} {'yes' if r['same_placement'] else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
