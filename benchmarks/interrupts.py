"""Ctrl-C (or SIGTERM) at random moments of `placetool search`: does every run stop at
once, with the best placement so far written?

Each trial starts `placetool search` as a terminal's foreground process would run it
(stderr on a pseudo-terminal, so the progress bar shows), waits for the first scored
placement, sleeps a random delay and sends the signal. A trial is *clean* when the
process exits 130 (143 for SIGTERM) within ``--grace`` seconds and says where it wrote
the placement; otherwise it *crashed* (killed by a signal, e.g. SIGSEGV), *hung* (still
running: the signal was lost) or *failed* (another exit status). The first moments of a
search load numba's cache, import the seeding methods' libraries and box compiled
results: the short delays aim there. The terminal output of every unclean trial is kept
under ``--keep`` (faulthandler's stack for a crash). ``--cold`` gives every trial an empty
numba cache (its own ``NUMBA_CACHE_DIR``), so the signal lands while kernels compile one
after another, as on a first run; the seconds from the signal to the exit are reported beside the outcomes.

    python benchmarks/interrupts.py --trials 50
    python benchmarks/interrupts.py --signal TERM --cold --trials 10 --max-delay 20 --grace 90
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testhelpers import helpers

ForegroundRun = helpers.ForegroundRun  # the CLI on a terminal, as the signal tests start it

def trial(args, delay: float, workdir: Path) -> tuple[str, str, float]:
    """One run interrupted ``delay`` s after its first scored placement: (outcome, terminal
    text, seconds from the signal to the exit)."""
    with ForegroundRun(["search", "-g", args.graph, "-c", args.cluster, "-m", args.method, "--budget-seconds", "300",
                        "-o", "best.json"], workdir) as run:
        p = run.proc
        end = time.monotonic() + 120
        while b"best " not in run.seen and p.poll() is None and time.monotonic() < end:
            time.sleep(0.005)
        time.sleep(delay)
        p.send_signal(args.sig)
        sent = time.monotonic()
        try:
            out, _ = p.communicate(timeout=args.grace)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            outcome, stop_s = "hung", args.grace
        else:
            stop_s = time.monotonic() - sent
            want = 130 if args.sig == signal.SIGINT else 143
            if p.returncode == want and "placement written to best.json" in out:
                outcome = "clean"
            elif p.returncode < 0:
                outcome = f"crashed ({signal.Signals(-p.returncode).name})"
            else:
                outcome = f"failed (exit {p.returncode})"
    return outcome, "\n".join(run.lines()) + "\n--- stdout ---\n" + out, stop_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0, help="seed of the delays")
    ap.add_argument("--max-delay", type=float, default=0.3,
                    help="delays are drawn from [0, 0.03] s and [0, MAX] s, half each")
    ap.add_argument("--signal", choices=["INT", "TERM"], default="INT")
    ap.add_argument("--graph", default="synthetic-300")
    ap.add_argument("--cluster", default="k80x2")
    ap.add_argument("--method", default="sa")
    ap.add_argument("--grace", type=float, default=20.0, help="seconds a run may take to stop")
    ap.add_argument("--keep", type=Path, default=Path("interrupts-failed"),
                    help="folder for the terminal output of unclean trials")
    ap.add_argument("--cold", action="store_true", help="give every trial an empty numba cache")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.sig = signal.SIGINT if args.signal == "INT" else signal.SIGTERM
    rng = random.Random(args.seed)
    counts: dict[str, int] = {}
    failures, stops = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.trials):
            delay = rng.uniform(0, 0.03) if rng.random() < 0.5 else rng.uniform(0, args.max_delay)
            if args.cold:  # the runs inherit it; the cache in use elsewhere stays warm
                os.environ["NUMBA_CACHE_DIR"] = str(Path(tmp) / f"numba-cache-{i}")
            outcome, text, stop_s = trial(args, delay, Path(tmp))
            counts[outcome] = counts.get(outcome, 0) + 1
            stops.append(stop_s)
            if outcome != "clean":
                args.keep.mkdir(parents=True, exist_ok=True)
                path = args.keep / f"trial-{args.seed}-{i}.txt"
                path.write_text(text)
                failures.append({"trial": i, "delay_s": delay, "outcome": outcome, "output": str(path)})
            if not args.json:
                print(f"\rtrial {i + 1}/{args.trials}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                      end="", file=sys.stderr, flush=True)
    if not args.json:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps({"trials": args.trials, "signal": args.signal, "cold": args.cold, "counts": counts,
                          "stop_s": stops, "failures": failures}))
    else:
        print(f"{args.method} on {args.graph}/{args.cluster}, SIG{args.signal} {args.trials} times"
              + (", numba cache cold" if args.cold else ""))
        q = sorted(stops)
        print(f"signal to exit: median {q[len(q) // 2]:.2f} s, max {q[-1]:.2f} s")
        print(f"{'outcome':<22} {'trials':>6}")
        for k, v in sorted(counts.items()):
            print(f"{k:<22} {v:>6}")
        for f in failures:
            print(f"  trial {f['trial']} (delay {f['delay_s'] * 1e3:.1f} ms): {f['outcome']}, output in {f['output']}")
    return 0 if counts.get("clean", 0) == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
