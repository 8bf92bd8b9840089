"""Where the compiled simulator spends its time, instruction by instruction.

    python benchmarks/kernel_profile.py                       # perf samples (real time)
    python benchmarks/kernel_profile.py --callgrind --by Bcm   # instructions, branch and cache misses
    python benchmarks/kernel_profile.py --graph synthetic-50k --top 40 --out prof/

numba's machine code has no symbols a profiler can read, so the script finds it
itself: a child process simulates random group assignments of ``--graph`` on
``--cluster`` in a loop, writes a copy of the machine code of the compiled
``simulate_full`` and of each function it calls (the event loop ``_run`` is the one
that runs the most), and runs under ``perf record -e cpu-clock`` (sampling real time,
so cache and branch misses show where they stall) or under callgrind with cache and
branch simulation (counts that do not depend on other load on the machine). The
samples that fall inside the function are matched to its disassembly (``objdump``);
the hottest instructions are printed with the code around them, and the whole
annotated listing is written to ``--out``. Read an instruction's source line off
the arrays it loads (see ``Net`` and ``Work`` in ``costmodel/engine/state.py``); a load
that misses the cache is charged to the instruction after it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import ctypes, json, sys, time
import numpy as np
from placetool.costmodel import CostModel, engine, presets
from placetool.search import Problem
graph, cluster, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
cm = CostModel(presets.load_graph(graph), presets.load_cluster(cluster))
rng = np.random.default_rng(0)
P = [cm.graph.to_placement(Problem(cm).random_assignment(rng)) for _ in range(8)]
cm.simulate(P[0])
# The event loop (engine._run) is a function of its own that simulate_full calls, and
# code loaded from numba's cache has no symbol names to look up (nor does numba fill
# _run's dispatcher then): take every absolute target that simulate_full loads by movabs
# and that lies in executable memory, and dump each up to the next (or {size} bytes).
# The parent profiles them all and annotates the one that runs the most: the loop.
import re, subprocess
(cres,) = engine.simulate_full.overloads.values()
entry = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
open(out + "/entry.bin", "wb").write(ctypes.string_at(entry, 0x4000))
dis = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "-M", "intel", "--no-show-raw-insn",
                      out + "/entry.bin"], check=True, capture_output=True, text=True).stdout
maps = [(int(a, 16), int(b, 16)) for a, b, perm in
        (ln.split()[0].split("-") + [ln.split()[1]] for ln in open("/proc/self/maps")) if "x" in perm]
starts = sorted({{entry}} | {{int(m, 16) for m in re.findall(r"movabs\s+\w+,0x([0-9a-f]+)", dis)}})
starts = [a for a in starts if any(lo <= a < hi for lo, hi in maps)]
regions = []
for j, a in enumerate(starts):
    hi = next(h for lo, h in maps if lo <= a < h)
    end = min(a + {size}, hi, starts[j + 1] if j + 1 < len(starts) else hi)
    open(out + f"/code{{j}}.bin", "wb").write(ctypes.string_at(a, end - a))
    regions.append({{"addr": a, "size": end - a, "file": f"code{{j}}.bin"}})
json.dump(regions, open(out + "/regions.json", "w"))
t, k = time.perf_counter(), 0
if {callgrind}:  # a few runs, counted from here on
    import os, subprocess
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    t = time.perf_counter()
    for k in range(1, 5):
        cm.simulate(P[k % 8])
else:
    while time.perf_counter() - t < seconds:
        cm.simulate(P[k % 8])
        k += 1
print(json.dumps({{"runs": k, "ms_per_run": (time.perf_counter() - t) / k * 1e3}}))
"""

CALLGRIND_EVENTS = ("Ir", "Bcm", "D1mr", "DLmr")


def disassemble(code: Path) -> list[tuple[int, str]]:
    """(offset, instruction) of a raw x86-64 code dump."""
    out = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "--no-show-raw-insn", "-M", "intel",
                          str(code)], check=True, capture_output=True, text=True).stdout
    rows = []
    for ln in out.splitlines():
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", ln)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip()))
    return rows


def perf_costs(work: Path, addr: int, size: int) -> dict[int, list[int]]:
    """Samples per instruction offset, from ``perf script``."""
    ips = subprocess.run(["perf", "script", "-i", str(work / "perf.data"), "-F", "ip"], check=True,
                         capture_output=True, text=True).stdout.split()
    cost = collections.defaultdict(lambda: [0])
    for s in ips:
        ip = int(s, 16)
        if addr <= ip < addr + size:
            cost[ip - addr][0] += 1
    return cost


def callgrind_costs(work: Path, addr: int, size: int) -> dict[int, list[int]]:
    """Ir, conditional-branch misses, L1 and last-level read misses per instruction offset,
    from a callgrind file written with ``--dump-instr=yes``."""
    lines = (work / "callgrind.out").read_text().splitlines()
    events = next(ln for ln in lines if ln.startswith("events:")).split()[1:]
    pick = [events.index(e) for e in CALLGRIND_EVENTS]
    cost = collections.defaultdict(lambda: [0] * len(pick))
    last, skip_next = 0, False
    for ln in lines:
        if ln.startswith("calls="):
            skip_next = True  # the next cost line is the call's inclusive cost
            continue
        m = re.match(r"^(0x[0-9a-f]+|[+-]\d+|\*)\s+\S+\s*(.*)$", ln)  # positions: instr line
        if not m:
            continue
        p = m.group(1)
        last = int(p, 16) if p.startswith("0x") else last if p == "*" else last + int(p)
        if skip_next:
            skip_next = False
            continue
        vals = m.group(2).split()
        if addr <= last < addr + size:
            for j, i in enumerate(pick):
                if i < len(vals):
                    cost[last - addr][j] += int(vals[i])
    return cost


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="synthetic-10k")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the child simulates (perf)")
    ap.add_argument("--callgrind", action="store_true", help="count under callgrind instead of sampling")
    ap.add_argument("--top", type=int, default=20, help="hottest instructions to print")
    ap.add_argument("--by", default="Ir", choices=CALLGRIND_EVENTS,
                    help="with --callgrind, rank instructions by this count (Bcm: branch misses, "
                         "D1mr/DLmr: first- and last-level cache read misses)")
    ap.add_argument("--context", type=int, default=6, help="instructions shown before each hot one")
    ap.add_argument("--out", help="folder for the annotated listing (default: a temporary one)")
    args = ap.parse_args(argv)

    tool = "valgrind" if args.callgrind else "perf"
    if shutil.which(tool) is None or shutil.which("objdump") is None:
        sys.exit(f"kernel_profile: needs {tool} and objdump on PATH")
    work = Path(args.out or tempfile.mkdtemp(prefix="kernel-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    child = CHILD.format(size=0x40000, callgrind=args.callgrind)
    cmd = [sys.executable, "-c", child, args.graph, args.cluster, str(args.seconds), str(work)]
    if args.callgrind:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=yes", "--cache-sim=yes",
               "--branch-sim=yes", f"--callgrind-out-file={work / 'callgrind.out'}"] + cmd
    else:
        cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "5000", "-o", str(work / "perf.data")] + cmd
    run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, NUMBA_NUM_THREADS="1"))
    if run.returncode != 0:
        sys.exit(f"kernel_profile: the profiled run failed:\n{run.stderr[-2000:]}")
    runs = json.loads(run.stdout.strip().splitlines()[-1])
    regions = json.loads((work / "regions.json").read_text())
    measure = callgrind_costs if args.callgrind else perf_costs
    region_costs = [measure(work, r["addr"], r["size"]) for r in regions]
    # the region that runs the most is the event loop; the others are small callees
    k = max(range(len(regions)), key=lambda j: sum(c[0] for c in region_costs[j].values()))
    costs, code = region_costs[k], work / regions[k]["file"]
    names = CALLGRIND_EVENTS if args.callgrind else ("samples",)
    total = [sum(c[j] for c in costs.values()) or 1 for j in range(len(names))]
    rows = disassemble(code)

    def cells(off):
        c = costs.get(off, [0] * len(names))
        return " ".join(f"{n} {c[j] / total[j]:6.2%}" for j, n in enumerate(names))

    listing = work / "annotated.txt"
    listing.write_text("".join(f"{o:6x}  {cells(o)}  {ins}\n" for o, ins in rows))
    print(f"{args.graph} on {args.cluster}: {runs['runs']} simulations, {runs['ms_per_run']:.3f} ms each "
          f"({'under callgrind' if args.callgrind else 'sampled by perf'}); "
          "in the event loop (of simulate_full and its callees, the one that runs the most): "
          + ", ".join(f"{total[j]:,} {n}" for j, n in enumerate(names)))
    index = {o: i for i, (o, _) in enumerate(rows)}
    rank = CALLGRIND_EVENTS.index(args.by) if args.callgrind else 0
    hot = sorted(costs, key=lambda o: -costs[o][rank])[: args.top]
    for o in sorted(hot):
        i = index.get(o)
        if i is None:
            continue
        print("   ...")
        for k in range(max(0, i - args.context), i + 1):
            mark = ">" if k == i else " "
            print(f" {mark}{rows[k][0]:6x}  {cells(rows[k][0])}  {rows[k][1][:70]}")
    print(f"annotated listing: {listing}")


if __name__ == "__main__":
    main()
