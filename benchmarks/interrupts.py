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
under ``--keep`` (faulthandler's stack for a crash).

    python benchmarks/interrupts.py --trials 50
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# the CLI as a terminal's foreground process runs it (a background job inherits an ignored
# SIGINT), with faulthandler on so that a crash leaves its stack
FOREGROUND = ("import faulthandler, signal, sys; faulthandler.enable(); "
              "signal.signal(signal.SIGINT, signal.default_int_handler); "
              "sys.argv[0] = 'placetool'; from placetool.cli.main import main; main()")


def trial(args, delay: float, workdir: Path) -> tuple[str, str]:
    """One run interrupted ``delay`` s after its first scored placement: (outcome, terminal text)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", FOREGROUND, "search", "-g", args.graph, "-c", args.cluster,
                          "-m", args.method, "--budget-seconds", "300", "-o", "best.json"], cwd=workdir,
                         stdout=subprocess.PIPE, stderr=slave, text=True, start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def read():
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        end = time.monotonic() + 120
        while b"best " not in seen and p.poll() is None and time.monotonic() < end:
            time.sleep(0.005)
        time.sleep(delay)
        p.send_signal(args.sig)
        try:
            out, _ = p.communicate(timeout=args.grace)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            outcome = "hung"
        else:
            want = 130 if args.sig == signal.SIGINT else 143
            if p.returncode == want and "placement written to best.json" in out:
                outcome = "clean"
            elif p.returncode < 0:
                outcome = f"crashed ({signal.Signals(-p.returncode).name})"
            else:
                outcome = f"failed (exit {p.returncode})"
        reader.join(2)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    # the last state of each progress-bar line, then stdout
    lines = [line.rsplit("\r", 1)[-1] for line in bytes(seen).decode(errors="replace").split("\n")]
    return outcome, "\n".join(lines) + "\n--- stdout ---\n" + out


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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.sig = signal.SIGINT if args.signal == "INT" else signal.SIGTERM
    rng = random.Random(args.seed)
    counts: dict[str, int] = {}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.trials):
            delay = rng.uniform(0, 0.03) if rng.random() < 0.5 else rng.uniform(0, args.max_delay)
            outcome, text = trial(args, delay, Path(tmp))
            counts[outcome] = counts.get(outcome, 0) + 1
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
        print(json.dumps({"trials": args.trials, "signal": args.signal, "counts": counts, "failures": failures}))
    else:
        print(f"{args.method} on {args.graph}/{args.cluster}, SIG{args.signal} {args.trials} times")
        print(f"{'outcome':<22} {'trials':>6}")
        for k, v in sorted(counts.items()):
            print(f"{k:<22} {v:>6}")
        for f in failures:
            print(f"  trial {f['trial']} (delay {f['delay_s'] * 1e3:.1f} ms): {f['outcome']}, output in {f['output']}")
    return 0 if counts.get("clean", 0) == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
