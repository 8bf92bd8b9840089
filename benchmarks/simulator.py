"""Simulator speed: compiled kernel vs the reference, one core and batches across cores.

    python benchmarks/simulator.py            # table
    python benchmarks/simulator.py --json     # {"rows": [...], "first_call": {...}}
    python benchmarks/simulator.py --callgrind --graphs synthetic-10k   # instructions per placement
    python benchmarks/simulator.py --threads 1,2,4,8,16 --batch 256     # batch scaling with cores
    python benchmarks/simulator.py --graphs inception_v3,nmt              # zoo graphs

Per graph (synthetic-1k/10k/50k on k80x4, random group assignments), measured side by
side in one run: ms per placement of ``CostModel.simulate`` (compiled) and of the
plain-Python reference, their ratio, and ``simulate_batch`` throughput with 1 thread and
with every core. CPU time (``process_time``) is used for the single-placement figures so
that other load on the machine does not inflate them; throughput is wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def first_call_seconds(cache_dir: str) -> float:
    """Seconds from a fresh interpreter to the first simulated placement."""
    code = (
        "import time; t=time.perf_counter();"
        "from placetool.costmodel import CostModel, presets;"
        "cm=CostModel(presets.load_graph('synthetic-1k'), presets.load_cluster('k80x2'));"
        "cm.simulate(cm.single_device(1)); cm.simulate_batch(cm.single_device(1)[None]);"
        "print(time.perf_counter()-t)"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


CALLGRIND_SETUP = """
import numpy as np
from placetool.costmodel import CostModel, presets
from placetool.search import Problem
cm = CostModel(presets.load_graph({graph!r}), presets.load_cluster({cluster!r}))
pr = Problem(cm)
rng = np.random.default_rng(0)
P = [cm.graph.to_placement(pr.random_assignment(rng)) for _ in range(8)]
cm.simulate(P[0])
"""


def callgrind_instructions(setup: str, body: str, reps: int) -> float:
    """Instructions per repetition of ``body`` (``i`` counts repetitions), counted by
    callgrind with instrumentation switched on only around the loop (``callgrind_control
    -i on``), so interpreter start, imports and the numba cache load are not counted.
    Instruction counts do not depend on other load on the machine, unlike times."""
    return callgrind_counts(setup, body, reps, simulate=False)["Ir"]


def callgrind_counts(setup: str, body: str, reps: int, simulate: bool = True) -> dict:
    """Callgrind's counts per repetition of ``body`` (see :func:`callgrind_instructions`);
    with ``simulate`` also cache and branch misses (``D1mr``, ``Bcm``, ...)."""
    ctl = "import os, subprocess\ndef _cg(on):\n    subprocess.run(['callgrind_control', '-i', on, str(os.getpid())], check=True, capture_output=True)\n"
    loop = f"_cg('on')\nfor i in range({reps}):\n" + "\n".join("    " + ln for ln in body.splitlines()) + "\n_cg('off')\n"
    sims = ["--cache-sim=yes", "--branch-sim=yes"] if simulate else []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        env = dict(os.environ, NUMBA_NUM_THREADS="1")
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", *sims, f"--callgrind-out-file={out}",
                        sys.executable, "-c", setup + ctl + loop], env=env, check=True, capture_output=True)
        with open(out) as f:
            lines = f.read().splitlines()
    events = next(ln for ln in lines if ln.startswith("events:")).split()[1:]
    totals = [ln for ln in lines if ln.startswith(("summary:", "totals:"))][-1].split()[1:]
    return {e: int(v) / reps for e, v in zip(events, totals)}


def timed(fn, reps: int, clock=time.process_time) -> float:
    ts = []
    for _ in range(reps):
        t = clock()
        fn()
        ts.append(clock() - t)
    return float(np.median(ts))


def bench_graph(name: str, cluster: str, ref_reps: int, reps: int, batch: int, threads=()) -> dict:
    import numba

    from placetool.costmodel import CostModel, presets, reference
    from placetool.search import Problem

    g = presets.load_graph(name)
    cl = presets.load_cluster(cluster)
    cm = CostModel(g, cl)
    pr = Problem(cm)
    rng = np.random.default_rng(0)
    A = np.stack([pr.random_assignment(rng) for _ in range(batch)])
    P = np.stack([g.to_placement(a) for a in A])
    cm.simulate(P[0])
    cm.simulate_batch(P[:2])

    it = iter(range(10**9))
    compiled = timed(lambda: cm.simulate(P[next(it) % batch]), reps)
    ref = timed(lambda: reference.simulate(g, cm.T, P[0], cl), ref_reps)
    r0 = cm.simulate(P[0])
    assert r0.step_time_us == reference.simulate(g, cm.T, P[0], cl).step_time_us

    cores = numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(1)
    one = timed(lambda: cm.simulate_batch(P), 3, time.perf_counter)
    numba.set_num_threads(cores)
    allc = timed(lambda: cm.simulate_batch(P), 3, time.perf_counter)
    by_threads = {}
    for t in threads:  # scaling with cores, on a machine with more than two
        numba.set_num_threads(min(t, cores))
        by_threads[min(t, cores)] = batch / timed(lambda: cm.simulate_batch(P), 3, time.perf_counter)
    numba.set_num_threads(cores)
    return {
        "graph": name,
        "ops": g.n_ops,
        "edges": g.n_edges,
        "compiled_ms_per_placement": compiled * 1e3,
        "reference_ms_per_placement": ref * 1e3,
        "speedup_vs_reference": ref / compiled,
        "batch_placements_per_s_1_thread": batch / one,
        "batch_placements_per_s": batch / allc,
        "batch_threads": cores,
        "batch_placements_per_s_by_threads": by_threads,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--graphs", default="synthetic-1k,synthetic-10k,synthetic-50k")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--callgrind", action="store_true",
                    help="count instructions per simulated placement with callgrind instead (slow)")
    ap.add_argument("--callgrind-reps", type=int, default=20)
    ap.add_argument("--threads", default="",
                    help="also batch throughput at these thread counts, e.g. 1,2,4,8,16 (scaling with cores)")
    args = ap.parse_args(argv)
    from placetool.costmodel import presets

    if args.callgrind:
        for name in args.graphs.split(","):
            setup = CALLGRIND_SETUP.format(graph=name, cluster=args.cluster)
            per = callgrind_instructions(setup, "cm.simulate(P[i % 8])", args.callgrind_reps)
            n = presets.load_graph(name).n_ops
            print(json.dumps({"graph": name, "cluster": args.cluster, "instructions_per_placement": per,
                              "instructions_per_op": per / n}))
        return

    with tempfile.TemporaryDirectory() as cache:
        compile_s = first_call_seconds(cache)  # empty cache: compiles
        cached_s = first_call_seconds(cache)  # cache written by the first run: loads
    rows = []
    for name in args.graphs.split(","):
        n = presets.load_graph(name).n_ops  # any graph: a preset (synthetic-10k, inception_v3) or a file
        rows.append(bench_graph(name, args.cluster, ref_reps=1 if n > 20_000 else 3,
                                reps=50 if n <= 10_000 else 10, batch=args.batch,
                                threads=[int(t) for t in args.threads.split(",") if t]))
    first = {"compile_s": compile_s, "cache_load_s": cached_s}
    if args.json:
        print(json.dumps({"rows": rows, "first_call": first}, indent=2))
        return
    print(f"simulator on {args.cluster}, random group assignments ({os.cpu_count()} cores)")
    print(f"{'graph':<15}{'ops':>7}{'edges':>8}{'compiled ms':>13}{'reference ms':>14}{'speedup':>9}"
          f"{'batch/s 1 thr':>15}{'batch/s all':>13}")
    for r in rows:
        print(f"{r['graph']:<15}{r['ops']:>7}{r['edges']:>8}{r['compiled_ms_per_placement']:>13.3f}"
              f"{r['reference_ms_per_placement']:>14.1f}{r['speedup_vs_reference']:>8.0f}x"
              f"{r['batch_placements_per_s_1_thread']:>15.0f}{r['batch_placements_per_s']:>13.0f}")
    for r in rows:
        if r["batch_placements_per_s_by_threads"]:
            one = r["batch_placements_per_s_1_thread"]
            print(f"{r['graph']}: batch/s by threads " + ", ".join(
                f"{t}: {v:.0f} ({v / one:.1f}x)" for t, v in r["batch_placements_per_s_by_threads"].items()))
    print(f"first call in a fresh process: {compile_s:.1f} s compiling, {cached_s:.1f} s with the numba cache")


if __name__ == "__main__":
    main()
