"""Transfer costs fitted from traced timelines, judged graph by graph (leave-one-graph-out).

Two phases, so the fit can be re-run without hardware:

``record DIR``: on a 2-worker CPU testbed, per graph: trace it, calibrate (``placetool
calibrate``: op profile, lone transfers, and the transfer costs fitted to whole steps of
the designed split placements, the model this benchmark compares against), then record a
timeline (``placetool explain``'s format: FULL_TRACE steps, untraced steps, and the ops on
one device) of every designed split and of the search's picks on the calibrated cluster.
Everything goes to DIR: per graph the graph file, the profile, and the timelines.

``fit DIR``: no TensorFlow. Per graph, the timeline fit
(:func:`placetool.costmodel.commfit.fit_device_costs`) on that graph's recordings alone
(do the parameters agree from graph to graph?), pooled over all graphs, then seven models
predict every recording's untraced step: ``step_totals``, the graph's own calibration as
recorded; ``steps_idle``, the same whole-step fit to the designed splits' untraced steps
under ``links.send = "idle"``; ``steps_idle_logo``, that fit made to the other graphs'
designs only; ``timelines_own`` and ``timelines_logo``, the device costs
read off this graph's timelines, or off the other graphs' only (leave-one-graph-out), on
lone-transfer links under ``"idle"``; ``workers_own`` and ``workers_logo``, the run
queue (``links.send = "workers"``) with its per-message costs identified as ``calibrate``
identifies them, from the traced steps of this graph's designs or of the other graphs'
(also tabled per graph: do they agree?). Columns: median and max |error| of the predicted
step against the measured median untraced step, Kendall's tau, whether the predicted best
is the measured best. ``--op-times recorded`` puts each device's one-device recording in
place of the profiled op times: the communication model's error alone.

``replay DIR``: every traced step of every split recording, simulated with its own traced
op times on the lone-transfer links under each ``links.send`` rule of ``--send``
(default "eager" and "idle") and each per-message cost of ``--costs`` (on both ends;
default none): the error of the rules alone, against the traced span.

    .venv/bin/python benchmarks/timeline_fit.py record /tmp/tl
    .venv/bin/python benchmarks/timeline_fit.py fit /tmp/tl [--op-times recorded] [--json]
    .venv/bin/python benchmarks/timeline_fit.py replay /tmp/tl [--send eager,idle,aside] [--costs 0:0,20:150]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_GRAPHS = [
    "models:towers@256",
    "models:inception_block@8",
    "nmt:hidden=256,vocab=2000,src_len=8,tgt_len=8@32",
    "mlp:hidden=1024,depth=8,features=1024@256",
]
SEARCHED = {"metis": None, "heft": None, "m-sct": None, "sa": 8.0}


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s).strip("_")


def record(a, log) -> None:
    from accuracy import trace_graph  # the same SOURCE[@BATCH] syntax

    from placetool.costmodel import CostModel
    from placetool.costmodel.tf.calibrate import DEFAULT_SIZES, calibrate, designed_splits
    from placetool.costmodel.tf.testbed import Testbed
    from placetool.costmodel.tf.trace_capture import capture
    from placetool.search import Budget, Problem, run

    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    tb = Testbed.start(2, device="cpu", timeout_s=180)
    try:
        for s in a.graph or DEFAULT_GRAPHS:
            t = trace_graph(s, log)
            gdir = out / _slug(s)
            gdir.mkdir(exist_ok=True)
            t.graph.save(gdir / "graph.npz")
            sizes = [x for x in DEFAULT_SIZES if x <= 4 * 2 ** 20]
            profile, cl = calibrate([t], tb.spec, sizes=sizes, trace_steps=3, reps=3, log=log, split_steps=2,
                                    rounds=3)
            profile.save(gdir / "profile.json")
            cm = CostModel(t.graph, cl, profile=profile)
            cands = [(label, p) for label, p, _ in designed_splits(t.graph, tb.spec)]
            prob = Problem(cm)
            for m, secs in SEARCHED.items():
                budget = Budget(seconds=secs) if secs else Budget(evals=200, seconds=20)
                try:
                    cands.append((m, run(m, prob, budget, seed=a.seed).placement))
                except Exception as e:  # noqa: BLE001 - a method that does not apply is skipped, said so
                    log(f"  ({m} skipped: {type(e).__name__})")
            seen, single = set(), None
            for k, (label, p) in enumerate(cands):
                p = np.ascontiguousarray(p, np.int32)
                if p.tobytes() in seen:
                    continue
                seen.add(p.tobytes())
                t0 = time.perf_counter()
                d = capture(t, p, tb.spec, steps=a.steps, warmup=3, single_device=0 if single is None else None)
                single = d.get("single", single)
                d["single"] = single
                d["label"] = label
                (gdir / f"{k:02d}.timeline.json").write_text(json.dumps(d))
                log(f"  {s} {label}: untraced {np.median(d['untraced_step_us']) / 1e3:.1f} ms "
                    f"({time.perf_counter() - t0:.1f} s)")
    finally:
        tb.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("dir")
    r.add_argument("--graph", action="append")
    r.add_argument("--steps", type=int, default=3, help="traced (and untraced) steps per placement")
    r.add_argument("--seed", type=int, default=0)
    rp = sub.add_parser("replay")
    rp.add_argument("dir")
    rp.add_argument("--send", default="eager,idle", help="links.send rules to replay under, comma separated")
    rp.add_argument("--costs", default="0:0",
                    help="per-message costs on both ends, a:k,... (µs per message : µs per MB)")
    f = sub.add_parser("fit")
    f.add_argument("dir")
    f.add_argument("--json", action="store_true")
    f.add_argument("--op-times", choices=["profile", "recorded"], default="profile",
                   help="op times of the predictions: the calibration's, or each device's one-device recording")
    f.add_argument("--anchor", action="store_true",
                   help="scale each graph's profiled op times so that its one-device recordings are predicted "
                        "as measured (as calibrate anchors them to the one-device steps of its own session)")
    a = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if a.cmd == "record":
        record(a, log)
    elif a.cmd == "replay":
        replay_main(a)
    else:
        fit_main(a, log)
    return 0


def load_dir(gdir: Path):
    """(graph, profile, [(label, Recording)], singles {device: per-op µs}) of one graph's folder."""
    from placetool.costmodel import graph as graphs
    from placetool.costmodel import timeline
    from placetool.costmodel.calibration import load_profile

    g = graphs.load(gdir / "graph.npz")
    prof = load_profile(gdir / "profile.json")
    recs = []
    for f in sorted(gdir.glob("*.timeline.json")):
        recs.append((json.loads(f.read_text()).get("label", f.stem), timeline.load(f, g)))
    singles = {}
    for label, rec in recs:  # each device's own op times, where a one-device recording has them
        if label.startswith("single:"):
            singles[int(label.split(":")[1])] = np.nanmedian(np.array([s.op_us for s in rec.steps]), axis=0)
    for label, rec in recs:
        for d in range(rec.n_devices):
            singles.setdefault(d, rec.single_op_us)
    return g, prof, recs, singles


def lone_links(prof, send="idle"):
    """The calibrated cluster as lone transfers measured it: no device-side costs, links
    side by side, tensors sent by ``send`` (links.send)."""
    from dataclasses import replace

    from placetool.costmodel.calibration import unfitted_cluster

    return replace(unfitted_cluster(prof.cluster(), prof), link_queue="none", link_send=send)


def fit_on(data, names):
    from placetool.costmodel.commfit import fit_device_costs

    recs, singles, labels = [], [], []
    for name in names:
        g, prof, rr, one = data[name]
        for label, rec in rr:
            recs.append(rec)
            singles.append(one)
            labels.append(f"{name}:{label}")
    return fit_device_costs(recs, singles=singles, labels=labels)


def predict(data, name, params, op_times="profile"):
    """Predicted and measured (median untraced) step of every recording of graph ``name``:
    params None is its own calibration (transfer costs fitted to whole steps); a
    :class:`~placetool.costmodel.workers.WorkerCosts` puts the run queue with those costs
    on its lone-transfer links.
    ``op_times``: "profile" (the calibration's) or "recorded" (each device's one-device
    recording, the profile's where it has none): the communication model's error alone."""
    from placetool.costmodel import CostModel
    from placetool.costmodel.commfit import with_device_costs
    from placetool.costmodel.workers import WorkerCosts, with_worker_costs

    g, prof, recs, singles = data[name]
    if params is None:
        cl = prof.cluster()
    elif params == "steps-idle":
        cl = steps_idle_cluster(data, name)
    elif params == "steps-idle-logo":
        cl = steps_idle_cluster(data, name, [m for m in data if m != name])
    elif isinstance(params, WorkerCosts):
        cl = with_worker_costs(lone_links(prof), params)
    else:
        cl = with_device_costs(lone_links(prof), params)
    cm = CostModel(g, cl, profile=prof)
    if op_times == "recorded":
        T = cm.T.copy()
        for d, one in singles.items():
            T[:, d] = np.where(np.isfinite(one), one, T[:, d])
        cm = CostModel(g, cl, op_times=T)
    pred, meas, labels = [], [], []
    for label, rec in recs:
        p = np.ascontiguousarray(rec.placement, np.int32)
        pred.append(cm.simulate(p).step_time_us + prof.step_overhead(len(np.unique(p))))
        meas.append(float(np.median(rec.untraced_step_us)))
        labels.append(label)
    return np.array(pred), np.array(meas), labels


def merged_profile(data, names):
    """One profile with the op times of graphs ``names``: what a fit pooled over several
    graphs predicts their steps with."""
    from placetool.costmodel.calibration import Profile

    return Profile.merged([data[m][1] for m in names])


def designed(recs):
    """The designed split placements among one graph's recordings (calibrate's designs)."""
    return [(label, rec) for label, rec in recs if ":" in label and not label.startswith("single")]


def steps_idle_cluster(data, name, fit_on=None):
    """The whole-step fit of calibrate, refitted under links.send "idle" to the same kind of
    data: the designed splits' measured (untraced) steps, every third held out; fitted to
    the designs of the graphs ``fit_on`` (default: ``name`` alone), put on ``name``'s
    lone-transfer links."""
    from placetool.costmodel.calibration import StepSample, fit_transfer_costs, with_transfer_params

    fit_on = fit_on or [name]
    samples = []
    for m in fit_on:
        g, _, recs, _ = data[m]
        samples += [StepSample(g, np.ascontiguousarray(rec.placement, np.int32),
                               float(np.median(rec.untraced_step_us)), label=f"{m}:{label}", held_out=i % 3 == 2)
                    for i, (label, rec) in enumerate(designed(recs))]
    base = lone_links(data[name][1])
    fit = fit_transfer_costs(samples, base, merged_profile(data, fit_on), try_per_transfer=False)
    return with_transfer_params(base, fit.params)


def anchor(graph, prof, recs) -> float:
    """Scale ``prof``'s op times of ``graph`` (in place) so that the median of its
    one-device recordings' measured steps over their predictions is 1, as calibrate
    anchors them (:func:`placetool.costmodel.tf.calibrate.one_device_ratio`); returns the
    factor applied."""
    from placetool.costmodel.tf.calibrate import one_device_ratio, scale_op_times

    one = [(rec.placement, float(np.median(rec.untraced_step_us)))
           for label, rec in recs if label.startswith("single:")]
    return scale_op_times(prof, graph.name, list(prof.ops), one_device_ratio(graph, prof, prof.cluster(), one))


def workers_costs(data, name, fit_on=None) -> dict:
    """The run queue's per-message costs (links.send "workers") identified as ``calibrate``
    identifies them, from the traced steps of the designed splits of the graphs
    ``fit_on`` (default: ``name`` alone), on ``name``'s lone-transfer links: the replay's
    costs plus the CPU per message that the traced op times hold against the profile's.
    Returns :func:`placetool.costmodel.tf.calibrate.worker_costs_from_steps`'s dict."""
    from placetool.costmodel.tf.calibrate import worker_costs_from_steps
    from placetool.costmodel.workers_fit import steps_of

    fit_on = fit_on or [name]
    traced = [[s for label, rec in designed(data[m][2]) for s in steps_of(rec, label=f"{m}:{label}")]
              for m in fit_on]
    return worker_costs_from_steps(traced, lone_links(data[name][1]), merged_profile(data, fit_on))


def with_message_costs(cluster, a_us: float, k_us_per_byte: float):
    """``cluster`` with ``a + k x bytes`` µs per message on both ends of every transfer
    (send and receive task costs of every device), its links untouched."""
    from dataclasses import replace

    devs = [replace(d, send_us=a_us, send_us_per_byte=k_us_per_byte, recv_us=a_us, recv_us_per_byte=k_us_per_byte)
            for d in cluster.devices]
    return replace(cluster, devices=devs)


def replay_main(a) -> None:
    from placetool.costmodel import CostModel

    rules = a.send.split(",")
    grid = [tuple(float(v) for v in c.split(":")) for c in a.costs.split(",")]
    print(f"{'graph':<46} {'send':<6} {'cost':>10} {'median err%':>11} {'med|err|%':>9} {'max|err|%':>9} "
          f"{'within 5%':>9}")
    for gdir in sorted(Path(a.dir).iterdir()):
        if not (gdir / "profile.json").exists():
            continue
        g, prof, recs, _ = load_dir(gdir)
        errs = {(send, c): [] for send in rules for c in grid}
        clusters = {(send, c): with_message_costs(lone_links(prof, send), c[0], c[1] * 1e-6) for send, c in errs}
        for label, rec in recs:
            if label.startswith("single"):
                continue
            p = np.ascontiguousarray(rec.placement, np.int32)
            for st in rec.steps:
                T = np.repeat(np.where(st.traced, st.op_us, 0.0)[:, None], rec.n_devices, axis=1)
                for key, e in errs.items():
                    ms = CostModel(g, clusters[key], op_times=T).simulate(p).step_time_us
                    e.append(100.0 * (ms - st.span_us) / st.span_us)
        for (send, (x, y)), e in errs.items():
            e = np.array(e)
            print(f"{gdir.name[:46]:<46} {send:<6} {f'{x:g}+{y:g}/MB':>10} {np.median(e):>+11.1f} "
                  f"{np.median(np.abs(e)):>9.1f} {np.abs(e).max():>9.1f} {100 * np.mean(np.abs(e) <= 5):>8.0f}%")


def fit_main(a, log) -> None:
    from accuracy import score

    root = Path(a.dir)
    data = {d.name: load_dir(d) for d in sorted(root.iterdir()) if (d / "profile.json").exists()}
    if len(data) < 2:
        raise SystemExit(f"{root}: recordings of at least 2 graphs needed (found {len(data)})")
    names = list(data)
    scales = {n: anchor(*data[n][:3]) for n in names} if a.anchor else {}
    for n, f in scales.items():
        log(f"{n}: op times scaled by {f:.3f} to its one-device recordings")
    own = {n: fit_on(data, [n]) for n in names}
    pooled = fit_on(data, names)
    log("identifying the run queue's costs from each graph's designs ...")
    w_own = {n: workers_costs(data, n) for n in names}
    rows = []
    for n in names:
        others = [m for m in names if m != n]
        logo = fit_on(data, others)
        log(f"{n}: the run queue's costs from the other graphs' designs ...")
        w_logo = workers_costs(data, n, others)
        row = {"graph": n, "own_fit": own[n].summary(), "logo_params": logo.params,
               "workers_own_costs": _costs_row(w_own[n]), "workers_logo_costs": _costs_row(w_logo)}
        for what, params in (("step_totals", None), ("steps_idle", "steps-idle"),
                             ("steps_idle_logo", "steps-idle-logo"), ("timelines_own", own[n].params),
                             ("timelines_logo", logo.params), ("workers_own", w_own[n]["costs"]),
                             ("workers_logo", w_logo["costs"])):
            pr, me, labels = predict(data, n, params, a.op_times)
            row[what] = score(pr, me)
            row[what]["rows"] = [{"label": lb, "predicted_us": float(x), "measured_us": float(y)}
                                 for lb, x, y in zip(labels, pr, me)]
        rows.append(row)
    agree = {k: _spread([own[n].params[k] for n in names]) for k in own[names[0]].params}
    w_agree = {k: _spread([r["workers_own_costs"]["costs"][k] for r in rows])
               for k in rows[0]["workers_own_costs"]["costs"]}
    out = {"graphs": rows, "pooled": pooled.summary(), "max_over_min": agree, "workers_max_over_min": w_agree,
           "op_time_scale": scales}
    if a.json:
        for r in rows:
            r["own_fit"].pop("placements", None)
        print(json.dumps(out, indent=1))
        return
    print(f"{'graph':<46} {'send µs':>8} {'µs/MB':>8} {'recv µs':>8} {'µs/MB':>8} {'r2':>5}")
    for n in names + ["(pooled)"]:
        f = own[n] if n in own else pooled
        p = f.params
        print(f"{n:<46} {p['send_us']:>8.1f} {p['send_us_per_byte'] * 1e6:>8.1f} {p['recv_us']:>8.1f} "
              f"{p['recv_us_per_byte'] * 1e6:>8.1f} {f.r2:>5.2f}")
    print()
    print("the run queue's costs identified from each graph's designs (µs, µs per MB; replay median |error|)")
    keys = list(rows[0]["workers_own_costs"]["costs"])
    print(f"{'graph':<46} " + " ".join(f"{k.replace('_us_per_byte', '/MB').replace('_us', ''):>9}" for k in keys)
          + f" {'replay':>7}")
    for r in rows:
        c = r["workers_own_costs"]["costs"]
        print(f"{r['graph']:<46} " + " ".join(f"{_show(k, c[k]):>9}" for k in keys)
              + f" {r['workers_own_costs']['replay_median_abs_error_pct']:>6.1f}%")
    print(f"{'largest / smallest':<46} " + " ".join(f"{w_agree[k]:>9.2f}" for k in keys))
    print()
    print(f"{'graph (held out of the timeline fit)':<46} {'model':<16} {'med|err|%':>9} {'max|err|%':>9} "
          f"{'tau':>6} {'best':>5}")
    for r in rows:
        for what in ("step_totals", "steps_idle", "steps_idle_logo", "timelines_own", "timelines_logo",
                     "workers_own", "workers_logo"):
            s = r[what]
            print(f"{r['graph']:<46} {what:<16} {s['median_abs_error_pct']:>9.1f} {s['max_abs_error_pct']:>9.1f} "
                  f"{s['kendall_tau']:>6.2f} {('yes' if s['best_agrees'] else 'no'):>5}")


def _costs_row(found: dict) -> dict:
    """A worker-cost identification as JSON: the costs a prediction takes, the replay's
    part, the CPU per message from the op times, and how well the replay fits."""
    from dataclasses import asdict

    s = found["fit"].summary()
    return {"costs": asdict(found["costs"]), "replay_costs": s["costs"], "inflation": found["inflation"],
            "op_inflation": found["op_inflation"], "replay_median_abs_error_pct": s["median_abs_error_pct"],
            "replay_steps": s["n_steps"]}


def _spread(values) -> float:
    """Largest over smallest (inf where the smallest is 0 and the largest is not; 1 when all are 0)."""
    hi, lo = max(values), min(values)
    return 1.0 if hi == 0 else (hi / lo if lo > 0 else float("inf"))


def _show(key: str, v: float) -> str:
    return f"{v * 1e6:.0f}" if key.endswith("per_byte") else f"{v:.0f}"

if __name__ == "__main__":
    sys.exit(main())
