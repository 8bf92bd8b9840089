"""Peak memory and wall time of `placetool search` against the number of devices.

Writes a cluster of 1 CPU + N-1 GPUs (one default link) for each N, runs
`placetool search -g GRAPH -c FILE --method M --budget-seconds B --json` in a child
process capped at ``--max-gb`` of address space and ``--timeout`` seconds (so that a run
that grows without bound is stopped before it pushes other work into swap), and prints
the child's peak resident set size and wall time.

    .venv/bin/python benchmarks/device_scale.py [--devices 8,64,256,1024] [--methods sa,heft,m-sct,m-etf]
        [--graph synthetic-1k] [--budget-seconds 3] [--max-gb 6] [--timeout 120] [--no-warm] [--json]

Each method first runs once, untimed, on 4 devices, so that numba's on-disk cache is
full and the rows time searches, not compiles. A run killed at ``--timeout`` shows exit
"timeout"; one that hit the memory cap usually ends with a MemoryError.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPU = dict(kind="gpu", memory_bytes=12 << 30, peak_flops_per_us=4.37e6, memory_bandwidth_bytes_per_us=2.4e5,
           launch_overhead_us=5.0)
CPU = dict(kind="cpu", memory_bytes=64 << 30, peak_flops_per_us=1.18e6, memory_bandwidth_bytes_per_us=6.8e4,
           launch_overhead_us=2.0)


def cluster_toml(n_devices: int) -> str:
    """A cluster file of one CPU and ``n_devices - 1`` GPUs with one default link."""
    out = [f'name = "scale{n_devices}"', ""]
    for i in range(n_devices):
        name, spec = ("cpu:0", CPU) if i == 0 else (f"gpu:{i - 1}", GPU)
        out.append("[[devices]]")
        out.append(f'name = "{name}"')
        out += [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v!r}" for k, v in spec.items()]
        out.append("")
    out += ["[links.default]", "latency_us = 10.0", "bandwidth_bytes_per_us = 12000.0", ""]
    return "\n".join(out)


def placetool() -> str:
    exe = Path(sys.executable).with_name("placetool")
    return str(exe) if exe.exists() else shutil.which("placetool") or "placetool"


def probe(cmd: list[str], max_bytes: int, timeout: float) -> dict:
    """Run ``cmd``; its peak RSS (MB), wall (s), exit status and last stderr line."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))

    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=cap, start_new_session=True)
        killed = False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                os.killpg(p.pid, signal.SIGKILL)
                killed = True
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        lines = [x for x in err.read().decode("utf-8", "replace").splitlines() if x.strip()]
    rc = "timeout" if killed else p.returncode
    return {"rss_mb": ru.ru_maxrss / 1024.0, "wall_s": wall, "rc": rc, "last": lines[-1][:160] if lines else ""}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="8,64,256,1024")
    ap.add_argument("--methods", default="sa,heft,m-sct,m-etf")
    ap.add_argument("--graph", default="synthetic-1k")
    ap.add_argument("--budget-seconds", type=float, default=3.0)
    ap.add_argument("--max-gb", type=float, default=6.0, help="address-space cap of each run")
    ap.add_argument("--timeout", type=float, default=120.0, help="kill a run after this many seconds")
    ap.add_argument("--no-warm", action="store_true",
                    help="skip the untimed run of each method on 4 devices that fills numba's cache first")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not a.no_warm:  # a cold cache would charge the first size with the compile
            path = Path(tmp) / "warm.toml"
            path.write_text(cluster_toml(4))
            for m in a.methods.split(","):
                probe([placetool(), "search", "-g", a.graph, "-c", str(path), "--method", m, "--budget-seconds", "1",
                       "-q"], int(a.max_gb * (1 << 30)), a.timeout * 4)
        for n in [int(x) for x in a.devices.split(",")]:
            path = Path(tmp) / f"scale{n}.toml"
            path.write_text(cluster_toml(n))
            for m in a.methods.split(","):
                cmd = [placetool(), "search", "-g", a.graph, "-c", str(path), "--method", m,
                       "--budget-seconds", str(a.budget_seconds), "--json", "-q"]
                r = probe(cmd, int(a.max_gb * (1 << 30)), a.timeout)
                rows.append({"devices": n, "method": m, **r})
                if not a.json:
                    print(f"{n:>6} {m:<8} {r['rss_mb']:>9.0f} MB {r['wall_s']:>7.1f} s  exit {r['rc']}  {r['last']}",
                          file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"| devices | method | peak RSS (MB) | wall (s) | exit |")
    print("|---:|---|---:|---:|---|")
    for r in rows:
        note = f" ({r['last']})" if r["rc"] not in (0, 1) and r["last"] else ""
        print(f"| {r['devices']:,} | {r['method']} | {r['rss_mb']:,.0f} | {r['wall_s']:.1f} | {r['rc']}{note} |")


if __name__ == "__main__":
    main()
