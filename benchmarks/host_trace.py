"""Where a split step's transfers wait, from TensorFlow's profiler instead of its step stats.

A ``RecvTensor`` record in a FULL_TRACE step starts at the sender's response, so the
receiver's own request is not in it (``benchmarks/README.md``, "A transfer record starts
when the sender answers"). The profiler's host trace has it
(:mod:`placetool.costmodel.tf.host_trace`). This runs again the placements that
``timeline_fit.py record DIR`` chose, on a fresh 2-worker CPU testbed whose workers serve
the profiler, and prints per placement (medians over the profiled steps and their
receives):

- the profiled step (ms; the host tracer makes it longer than an untraced one) and the
  receives per step;
- what asking cost the receivers: the executor's time in the ``_Recv`` starts per step
  (ms) and per receive (µs), and how far into the step the last one was issued (ms);
- ``both there``: the later of the request's issue (its end) and the sender's ``_Send``;
  then ``service``, from that to the tensor reaching the receiver's executor (µs, median
  and p90). With a lone-transfer link of 120-140 µs (``timeline_decompose.py``) this is
  what the simulator's link stands for;
- ``send late``: the share of receives whose ``_Send`` ran after the request was issued;
- ``in op``: the share of arrivals handled while the receiver's executor was inside an op;
- the clock offset applied to worker 1 (``host_trace.clock_offsets``, ms).

    .venv/bin/python benchmarks/host_trace.py /tmp/tl [--graphs towers,mlp] \\
        [--labels single:0,cut:0->1,alternate:0->1,metis,heft,sa] [--steps 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

DEFAULT_LABELS = "cut:0->1,alternate:0->1,random35:0->1,metis,heft,m-sct,sa"


def summarize(steps, offset_us: float) -> dict:
    """One placement's row from its profiled steps (:func:`host_trace.step_transfers`)."""
    cat = {k: np.concatenate([getattr(s, k) for s in steps]) for k in ("issue", "issue_us", "send", "done")}
    in_op = np.concatenate([s.done_in_op for s in steps])
    both = np.fmax(cat["issue"] + cat["issue_us"], cat["send"])
    service = cat["done"] - both
    ok = np.isfinite(service)
    paired = np.isfinite(cat["send"])
    return {
        "step_ms": float(np.median([s.end for s in steps]) / 1e3),
        "receives": int(np.median([len(s.name) for s in steps])),
        "issue_ms_per_step": float(np.median([s.issue_us.sum() for s in steps]) / 1e3),
        "issue_us": float(np.median(cat["issue_us"])),
        "last_issue_ms": float(np.median([s.issue.max(initial=0.0) for s in steps]) / 1e3),
        "service_us": float(np.median(service[ok])) if ok.any() else float("nan"),
        "service_p90_us": float(np.percentile(service[ok], 90)) if ok.any() else float("nan"),
        "send_late": float(np.mean(cat["send"][paired] > cat["issue"][paired])) if paired.any() else float("nan"),
        "in_op": float(np.mean(in_op[np.isfinite(cat["done"])])) if len(in_op) else float("nan"),
        "paired": float(np.mean(paired)) if len(paired) else float("nan"),
        "offset_ms": offset_us / 1e3,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="a folder timeline_fit.py record wrote")
    ap.add_argument("--graphs", default="", help="substrings of the graph folders to run (default: all)")
    ap.add_argument("--labels", default=DEFAULT_LABELS, help="recorded placements to run, by label")
    ap.add_argument("--steps", type=int, default=4, help="profiled steps per placement")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    from accuracy import trace_graph

    from placetool.costmodel.tf.host_trace import capture, clock_offsets, step_transfers
    from placetool.costmodel.tf.testbed import Testbed

    dirs = [d for d in sorted(Path(a.dir).iterdir()) if (d / "graph.npz").exists()
            and (not a.graphs or any(g in d.name for g in a.graphs.split(",")))]
    if not dirs:
        raise SystemExit(f"{a.dir}: no recorded graphs (run timeline_fit.py record first)")
    labels = [s for s in a.labels.split(",") if s]
    rows = []
    with Testbed.start(2, device="cpu", timeout_s=180, profiler=True) as tb, \
            tempfile.TemporaryDirectory(prefix="placetool-host-trace-") as logdir:
        for d in dirs:
            recorded = {}
            for f in sorted(d.glob("*.timeline.json")):
                j = json.loads(f.read_text())
                recorded.setdefault(j.get("label", f.stem), j)
            spec = next(iter(recorded.values()))["graph"]
            t = trace_graph(spec, log)
            for label in [x for x in labels if x in recorded]:
                p = np.array([recorded[label]["placement"][n] for n in t.graph.names], np.int32)
                workers = capture(t, p, tb, logdir, steps=a.steps)
                steps = step_transfers(workers)
                if not steps:
                    log(f"  {spec} {label}: no whole step in the trace")
                    continue
                rows.append({"graph": spec, "label": label, **summarize(steps, clock_offsets(workers)[1])})
                log(f"  {spec} {label}: {rows[-1]['step_ms']:.1f} ms profiled")
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'graph':<26} {'placement':<15} {'step ms':>7} {'recv':>5} {'ask ms':>6} {'ask µs':>6} "
          f"{'last ask':>8} {'service':>7} {'p90':>6} {'send late':>9} {'in op':>5} {'offset':>6}")
    for r in rows:
        print(f"{r['graph'][:26]:<26} {r['label']:<15} {r['step_ms']:>7.1f} {r['receives']:>5} "
              f"{r['issue_ms_per_step']:>6.2f} {r['issue_us']:>6.0f} {r['last_issue_ms']:>8.1f} "
              f"{r['service_us']:>7.0f} {r['service_p90_us']:>6.0f} {100 * r['send_late']:>8.0f}% "
              f"{100 * r['in_op']:>4.0f}% {r['offset_ms']:>6.2f}")
    print("(ask: the receivers' executor time in _Recv starts, per step and per receive; last ask: ms into the"
          " step; service: µs from the later of the request issued and the _Send to the tensor reaching the"
          " receiver's executor; send late: the _Send ran after the request; in op: arrivals handled during a"
          " receiver op; offset: ms added to worker 1's clock)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
