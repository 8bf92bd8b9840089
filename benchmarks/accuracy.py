"""Cost-model accuracy on real devices: predicted vs measured step times, beside the noise floor.

For each graph (default: three with real parallelism: the held-out ``towers`` and a small
Inception-style network from ``benchmarks/models.py``, imported as a user's module, and a
2-layer LSTM NMT from the zoo): trace it, calibrate just before measuring it (per-op
profile, lone transfers, designed split placements fitted for the device-side transfer
costs; ``placetool calibrate``), then build >= ``--placements`` placements: every single
device, every search method's output on the calibrated cluster (the one-shot methods, and
``sa`` and ``tpe`` with short budgets, since those are what ``search`` recommends), then
random group assignments up to the count. All of them are measured in one run,
``--rounds`` interleaved rounds of ``--steps`` steps, and compared with the calibrated
prediction (simulated makespan + the measured fixed per-step overhead).

Per graph: median and max |error| %, Kendall's tau and the most a model that knew every
step exactly could score against rounds this noisy (``tau max``,
:func:`placetool.costmodel.noise.tau_ceiling`), whether the predicted best is the
measured best, the calibration's fit and held-out errors, and the noise floor (median over
placements of half the range of their round medians, in %).

A sentinel (a fixed reference step, ``costmodel/tf/sentinel.py``) is timed before the
rounds and after each one: its spread is reported as the noise floor beside the errors
(``sentinel±%``), rounds during which it drifted are run again or flagged, and each
placement's measured step is also given as a paired per-round ratio to one device,
beside the predicted ratio (``ratio|err|%``). ``--replay`` also traces one step of every
placement and replays it with the traced op times (``placetool explain``): the error of
the schedule and communication rules alone, per placement (goal: within 5%).
``--logo`` also judges each graph under the run queue with its costs fitted to the other
graphs' measured designs only, and with ``--workers-rule`` identified from their traced
designs (leave-one-graph-out: do one testbed's costs carry to a graph they were not
fitted on?).

    .venv/bin/python benchmarks/accuracy.py                  # 2-worker CPU testbed, 3 graphs
    .venv/bin/python benchmarks/accuracy.py --json --rows-out rows.json
    .venv/bin/python benchmarks/accuracy.py --graph models:towers@256 --placements 40
    .venv/bin/python benchmarks/accuracy.py --replay --json --rows-out rows.json

A graph is ``SOURCE[@BATCH]``: a zoo name with builder options (``nmt:hidden=256,vocab=2000@32``)
or ``module:function`` importable from ``benchmarks/`` (``models:towers@256``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

import numpy as np

from placetool.costmodel import noise

HERE = os.path.dirname(os.path.abspath(__file__))
# small enough that a step takes tens of ms on one quiet core
DEFAULT_GRAPHS = [
    "models:towers@256",
    "models:inception_block@8",
    "nmt:hidden=256,vocab=2000,src_len=8,tgt_len=8@32",
]
ONE_SHOT = ["single", "round-robin", "expert", "metis", "mincut", "heft", "critical-path", "m-topo", "m-etf", "m-sct"]
ITERATIVE = {"sa": 8.0, "tpe": 8.0}  # method: seconds


def parse_graph(s: str):
    """(source, builder options, batch) of ``SOURCE[@BATCH]``."""
    from placetool.costmodel.tf.zoo import ZOO

    src, _, batch = s.partition("@")
    name, sep, opts = src.partition(":")
    kw = {}
    if sep and name in ZOO:
        for it in filter(None, opts.split(",")):
            k, _, v = it.partition("=")
            for conv in (int, float, str):
                try:
                    kw[k] = conv(v)
                    break
                except ValueError:
                    continue
        src = name
    return src, kw, (int(batch) if batch else None)


def trace_graph(s: str, log):
    from placetool.costmodel.tf.importer import trace

    src, kw, batch = parse_graph(s)
    t0 = time.perf_counter()
    t = trace(src, batch=batch, cwd=HERE, name=s, **kw)
    log(f"traced {s}: {t.graph.n_ops} ops, {t.graph.n_groups} groups ({time.perf_counter() - t0:.1f} s)")
    return t


def devices(a, log):
    """(spec, testbed or None) from --cluster-spec / --local / --workers."""
    from placetool.costmodel.tf.testbed import ClusterSpec, Testbed

    if a.cluster_spec:
        return ClusterSpec.load(a.cluster_spec), None
    if a.local:
        from placetool.costmodel.tf.runner import local_spec

        return local_spec(), None
    tb = Testbed.start(a.workers, device=a.device, timeout_s=180)
    log(f"testbed: {a.workers} {a.device} workers")
    return tb.spec, tb


def calibrate_for(t, spec, a, log, link_queue="auto", fit_inputs=None, link_send="auto"):
    from placetool.costmodel.tf.calibrate import DEFAULT_SIZES, calibrate

    sizes = [x for x in DEFAULT_SIZES if x <= a.max_transfer]
    return calibrate([t], spec, sizes=sizes, trace_steps=a.trace_steps, reps=a.reps, log=log,
                     split_steps=a.steps, rounds=a.rounds, link_queue=link_queue, link_send=link_send,
                     fit_inputs=fit_inputs)


def models_for(t, spec, a, log, keep=None):
    """{"queue/send": (CostModel, profile, transfer fit summary)}: one calibration, its
    transfer costs fitted under each pair of rules of ``--link-queue`` and ``--link-send``
    to the same measured steps. ``keep`` (a dict, with ``--logo``) receives what fitting
    costs on the other graphs takes: this graph's measured designs (``samples``, ``kinds``),
    its profile, its lone-transfer cluster and, with ``--workers-rule``, its traced design
    steps."""
    from dataclasses import replace

    from placetool.costmodel import CostModel
    from placetool.costmodel.calibration import fit_transfer_costs, with_transfer_params

    queues = ["none", "fifo"] if a.link_queue == "both" else [a.link_queue]
    sends = ["idle", "eager"] if a.link_send == "both" else [a.link_send]
    fit_in = {}
    profile, cl = calibrate_for(t, spec, a, log, queues[0], fit_in, sends[0])
    if keep is not None and fit_in:
        keep.update(samples=fit_in["samples"], kinds=fit_in["kinds"], profile=profile, links=fit_in["cluster"])
    out = {f"{cl.link_queue}/{cl.link_send}": (CostModel(t.graph, cl, profile=profile), profile,
                                               profile.meta.get("transfer_fit", {}))}
    # "auto" is whatever calibrate chose: already judged above, not one more rule to refit
    queues = [cl.link_queue if x == "auto" else x for x in queues]
    sends = [cl.link_send if x == "auto" else x for x in sends]

    def fitted(base):
        """``base``'s rules with transfer costs fitted to the calibration's measured steps."""
        fit = fit_transfer_costs(fit_in["samples"], base, profile, kinds=fit_in["kinds"])
        log(f"  links.queue {base.link_queue}, links.send {base.link_send}: the same steps fitted: {fit.params}")
        return (CostModel(t.graph, with_transfer_params(base, fit.params, fit_in["kinds"]), profile=profile),
                profile, fit.summary())

    for q in queues:
        for snd in sends:
            if f"{q}/{snd}" not in out and fit_in:
                out[f"{q}/{snd}"] = fitted(replace(fit_in["cluster"], link_queue=q, link_send=snd))
    if a.workers_rule and fit_in:
        from placetool.costmodel.tf.calibrate import identify_worker_costs
        from placetool.costmodel.workers import with_worker_costs

        base = with_worker_costs(fit_in["cluster"])
        # fitted, as the other rules are, to this graph's designed split steps on the profile's op times
        out["none/workers-steps"] = fitted(base)
        # identified as `calibrate --link-send workers` does, from traced split steps of this session: the
        # replay's costs alone, and with the CPU per message that the traced op times hold
        found = identify_worker_costs([t], spec, fit_in["cluster"], profile, steps=a.steps, log=log)
        if keep is not None:
            keep.update(steps=found["steps"][0])
        summ = {**found["fit"].summary(), "message_inflation": found["inflation"],
                "op_inflation": found["op_inflation"]}
        log(f"  links.send workers, identified from this session's traced steps: {summ}")
        for key, costs in (("none/workers-replay", found["fit"].costs), ("none/workers", found["costs"])):
            out[key] = (CostModel(t.graph, with_worker_costs(fit_in["cluster"], costs), profile=profile), profile,
                        {**summ, "costs": asdict(costs)})
    return out


def candidate_placements(cm, n_total: int, seed: int, log, seconds=ITERATIVE):
    """[(label, per-op placement)]: single devices, every search method, random splits."""
    from placetool.search import Budget, Problem, run

    g, cl = cm.graph, cm.cluster
    out, seen = [], {}

    def add(label, p):
        p = np.ascontiguousarray(p, np.int32)
        k = p.tobytes()
        if k in seen:  # a method that returns another's placement: one row, both names
            i = seen[k]
            out[i] = (f"{out[i][0]}={label}", out[i][1])
        elif cm.violation(p) is None:
            seen[k] = len(out)
            out.append((label, p))

    for d in range(cl.n_devices):
        add(f"single:{cl.names[d]}", cm.single_device(d))
    prob = Problem(cm)
    for m in ONE_SHOT + list(seconds):
        budget = Budget(seconds=seconds[m]) if m in seconds else Budget(evals=200, seconds=20)
        try:
            add(m, run(m, prob, budget, seed=seed).placement)
        except Exception as e:  # noqa: BLE001 - a method that does not apply (expert without tags) is said so
            log(f"  (method {m} skipped: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})")
    rng = np.random.default_rng(seed)
    tries = 0
    while len(out) < n_total and tries < 100 * n_total:
        tries += 1
        frac = rng.uniform(0.02, 0.5)  # from "mostly one device" to uniform
        a = np.where(rng.random(g.n_groups) < frac, rng.integers(0, cl.n_devices, g.n_groups),
                     rng.integers(0, cl.n_devices))
        a = np.where(prob.allowed[np.arange(g.n_groups), a], a, np.argmax(prob.allowed, axis=1))
        add(f"random:{len(out)}", g.to_placement(a))
    return out


def score(pred, meas) -> dict:
    from scipy.stats import kendalltau

    pred, meas = np.asarray(pred), np.asarray(meas)
    err = (pred - meas) / meas * 100
    return {"median_abs_error_pct": float(np.median(np.abs(err))), "max_abs_error_pct": float(np.max(np.abs(err))),
            "kendall_tau": float(kendalltau(pred, meas).statistic),
            "best_agrees": bool(int(np.argmin(pred)) == int(np.argmin(meas))),
            "measured_best_us": float(meas.min()),
            "measured_of_predicted_best_us": float(meas[int(np.argmin(pred))])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="append", help="SOURCE[@BATCH]; repeatable (default: 3 graphs with parallelism)")
    ap.add_argument("--placements", type=int, default=30, help="placements per graph, at least")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--cluster-spec", default=None, help="a running TF cluster instead of a local testbed")
    ap.add_argument("--local", action="store_true", help="this process's CPU + GPUs (in-process)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (their spread is the noise floor)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per placement per round")
    ap.add_argument("--trace-steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="calibration: repeats per lone transfer size")
    ap.add_argument("--max-transfer", type=int, default=4 * 2 ** 20, help="calibration: largest lone transfer, bytes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sentinel", action="store_true", help="plain interleaved rounds, no reference step")
    ap.add_argument("--link-queue", choices=["auto", "fifo", "none", "both"], default="none",
                    help="the calibrated cluster's links.queue; both: fit the same measured steps under each "
                         "rule and judge both on the same measurements")
    ap.add_argument("--link-send", choices=["auto", "eager", "idle", "both"], default="both",
                    help="the calibrated cluster's links.send; both: fit the same measured steps under each "
                         "rule and judge both on the same measurements (default)")
    ap.add_argument("--workers-rule", action="store_true",
                    help="also judge links.send 'workers' (TensorFlow's run queue, costmodel/workers.py) on the "
                         "calibration's lone-transfer links: its costs identified from this session's traced split "
                         "steps as calibrate --link-send workers does (workers), the replay's part of them alone "
                         "(workers-replay), and fitted to the split steps' totals (workers-steps)")
    ap.add_argument("--logo", action="store_true",
                    help="also judge each graph under the run queue with its costs fitted to the other graphs' "
                         "measured designs only (leave-one-graph-out, workers-steps-logo) and, with --workers-rule, "
                         "identified from their traced designs (workers-logo)")
    ap.add_argument("--replay", action="store_true", help="also trace and replay one step of every placement")
    ap.add_argument("--replay-steps", type=int, default=3, help="traced steps per placement for --replay (median)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rows-out", default=None, help="also write every (graph, placement) row as JSON here")
    a = ap.parse_args(argv)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if a.json else (lambda m: print(m, flush=True))

    from placetool.costmodel.tf.runner import measure_interleaved
    from placetool.costmodel.tf.sentinel import measure_with_sentinel

    graphs = a.graph or DEFAULT_GRAPHS
    if a.logo and len(graphs) < 2:
        ap.error("--logo needs at least 2 graphs")
    rows, detail, logo_in = [], [], {}
    t_start = time.perf_counter()
    spec, tb = devices(a, log)
    try:
        for s in graphs:
            t = trace_graph(s, log)
            # calibrate right before measuring: on a shared machine the load drifts over
            # minutes, and a profile taken long before is a profile of another load
            kept = logo_in.setdefault(s, {}) if a.logo else None  # what --logo judges after the last graph
            models = models_for(t, spec, a, log, kept)
            cands = []
            for q, (cm_q, _, _) in models.items():  # every model's searches are among the candidates
                seen = {p.tobytes() for _, p in cands}
                cands += [(f"{label}@{q}" if len(models) > 1 and not label.startswith(("single", "random")) else label, p)
                          for label, p in candidate_placements(cm_q, a.placements // len(models), a.seed, log)
                          if p.tobytes() not in seen]
            log(f"{s}: measuring {len(cands)} placements, {a.rounds} interleaved rounds of {a.steps} steps ...")
            if a.no_sentinel:
                reps = measure_interleaved(t, [p for _, p in cands], spec, rounds=a.rounds, steps=a.steps, warmup=2)
                sent = None
            else:
                # candidate 0 is every op on device 0: the paired ratios' reference
                reps, sent = measure_with_sentinel(t, [p for _, p in cands], spec, rounds=a.rounds, steps=a.steps,
                                                   warmup=2, reference=0, log=log)
                log(f"  sentinel: noise floor ±{sent['noise_floor_pct']:.1f}%, {sent['redone']} round(s) run "
                    f"again, flagged: {sent['flagged_rounds'] or 'none'}")
            wm = models.get("none/workers", (None, None))[:2]
            replays = [replay_placement(t, p, spec, a.replay_steps, *wm) for _, p in cands] if a.replay else None
            for q, (cm, profile, fit) in models.items():
                rows.append(judge_model(s, q, t, cm, profile, fit, cands, reps, sent, replays, detail, log))
            if kept is not None:
                kept.update(trace=t, cands=cands, reps=reps, sent=sent)
    finally:
        if tb is not None:
            tb.stop()
    if a.logo:
        rows += judge_logo(logo_in, detail, log)
    secs = time.perf_counter() - t_start
    out = {"rows": rows, "devices": spec.tf_devices, "seconds": secs,
           "settings": {"rounds": a.rounds, "steps": a.steps, "placements": a.placements, "seed": a.seed,
                        "link_queue": a.link_queue, "link_send": a.link_send}}
    if a.rows_out:
        with open(a.rows_out, "w") as f:
            json.dump({"summary": out, "placements": detail}, f, indent=1)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print()
    print(f"{'graph':<44} {'rules':<24} {'ops':>5} {'pl':>4} {'med|err|%':>9} {'max|err|%':>9} {'tau':>6} "
          f"{'tau max':>7} "
          f"{'best':>5} {'noise±%':>8} {'sentinel±%':>10} {'ratio|err|%':>11} {'replay|err|%':>12} {'fit%':>6} "
          f"{'held%':>6}")
    for r in rows:
        f = r["calibration_fit_median_abs_error_pct"]
        h = r["calibration_held_out_median_abs_error_pct"]
        print(f"{r['graph']:<44} {r['rules']:<24} {r['ops']:>5} {r['placements']:>4} "
              f"{r['median_abs_error_pct']:>9.1f} {r['max_abs_error_pct']:>9.1f} {r['kendall_tau']:>6.2f} "
              f"{_num(r.get('kendall_tau_ceiling'), 2):>7} "
              f"{('yes' if r['best_agrees'] else 'no'):>5} {r['noise_floor_pct']:>8.1f} "
              f"{_num(r.get('sentinel_noise_floor_pct')):>10} {_num(r.get('ratio_median_abs_error_pct')):>11} "
              f"{_num(r.get('replay_workers_max_abs_error_pct', r.get('replay_fifo_max_abs_error_pct'))):>12} "
              f"{_num(f):>6} {_num(h):>6}")
    print(f"({secs:.0f} s; devices: {len(spec.tf_devices)} x {spec.kinds[0]})")
    return 0


def judge_model(s, q, t, cm, profile, fit, cands, reps, sent, replays, detail, log) -> dict:
    """One graph's row for the model whose rules (links.queue/links.send) are ``q``: its
    predictions of every measured placement (appended to ``detail``) against the measurements."""
    pred, meas = [], []
    pred_ref = None
    first = len(detail)
    log(f"  links.queue/send {q}:")
    for k, ((label, p), m) in enumerate(zip(cands, reps)):
        sim = cm.simulate(p).step_time_us
        pr = sim + profile.step_overhead(len(np.unique(p)))
        pred.append(pr)
        meas.append(m.step_us)
        pred_ref = pr if k == 0 else pred_ref
        detail.append({"graph": s, "rules": q, "placement": label, "devices_used": int(len(np.unique(p))),
                       "predicted_us": pr, "simulated_us": sim, "measured_us": m.step_us,
                       "spread_pct": m.spread_pct, "round_us": m.round_us,
                       "error_pct": 100 * (pr - m.step_us) / m.step_us})
        if sent is not None:
            pm = sent["paired"][k]
            detail[-1].update({"measured_ratio": pm["ratio"], "ratio_spread_pct": pm["spread_pct"],
                               "predicted_ratio": pr / pred_ref,
                               "ratio_error_pct": 100 * (pr / pred_ref - pm["ratio"]) / pm["ratio"]})
        if replays is not None:
            detail[-1].update(replays[k])
        log(f"  {label:<16} predicted {pr / 1e3:9.2f} ms  measured {m.step_us / 1e3:9.2f} ms "
            f"±{m.spread_pct:4.1f}%  error {detail[-1]['error_pct']:+7.1f}%"
            + (f"  ratio {detail[-1]['measured_ratio']:.3f} (predicted {detail[-1]['predicted_ratio']:.3f})"
               if sent is not None else "")
            + (f"  replay {detail[-1]['replay_fifo_error_pct']:+.1f}% / concurrent "
               f"{detail[-1]['replay_concurrent_error_pct']:+.1f}%" if replays is not None else ""))
    queue, send = q.split("/")
    return {"graph": s, "rules": q, "link_queue": queue, "link_send": send, "ops": t.graph.n_ops,
            "placements": len(cands), **score(pred, meas),
            # what a model that knew every step exactly would score against rounds this noisy
            "kendall_tau_ceiling": noise.tau_ceiling([m.round_us for m in reps])["median"]
            if len(reps) > 1 and len(reps[0].round_us) > 1 else None,
            "noise_floor_pct": float(np.median([m.spread_pct for m in reps])),
            "calibration_fit_median_abs_error_pct": fit.get("fit", {}).get("median_abs_error_pct"),
            "calibration_held_out_median_abs_error_pct": fit.get("held_out", {}).get("median_abs_error_pct"),
            "transfer_params": fit.get("params"),
            "calibration_noise_floor_pct": fit.get("noise_floor_pct"),
            **sentinel_summary(sent, detail[first:]),
            **replay_summary(detail[first:] if replays is not None else None)}


def judge_logo(logo_in: dict, detail: list, log) -> list[dict]:
    """Per graph, rows for the run queue with its costs taken from the other graphs only,
    on this graph's lone-transfer links and profile, judged on this graph's measured
    placements: does one testbed's set of costs carry to a graph it was not fitted on?

    - ``workers-steps-logo``: fitted, as calibrate fits them, to the other graphs' measured
      designs (pooled, each on its own op times);
    - ``workers-logo`` (with ``--workers-rule``): identified from their traced designs."""
    from placetool.costmodel import CostModel
    from placetool.costmodel.calibration import Profile, fit_transfer_costs, with_transfer_params
    from placetool.costmodel.tf.calibrate import worker_costs_from_steps
    from placetool.costmodel.workers import with_worker_costs

    rows = []
    done = [s for s, k in logo_in.items() if "reps" in k and "samples" in k]
    for s in done:
        k, others = logo_in[s], [o for o in done if o != s]
        log(f"{s}: the run queue's costs fitted to the designs' steps of {', '.join(others)} ...")
        base = with_worker_costs(k["links"])
        found = fit_transfer_costs([x for o in others for x in logo_in[o]["samples"]], base,
                                   Profile.merged([logo_in[o]["profile"] for o in others]), kinds=k["kinds"])
        log(f"  fitted: {found.params}")
        cm = CostModel(k["trace"].graph, with_transfer_params(base, found.params, k["kinds"]), profile=k["profile"])
        fit = {**found.summary(), "fitted_on": others}
        rows.append(judge_model(s, "none/workers-steps-logo", k["trace"], cm, k["profile"], fit, k["cands"],
                                k["reps"], k["sent"], None, detail, log))
        if not all("steps" in logo_in[o] for o in others):
            continue
        log(f"{s}: the run queue's costs identified from the designs of {', '.join(others)} ...")
        found = worker_costs_from_steps([logo_in[o]["steps"] for o in others], k["links"],
                                        [logo_in[o]["profile"] for o in others])
        cm = CostModel(k["trace"].graph, with_worker_costs(k["links"], found["costs"]), profile=k["profile"])
        fit = {**found["fit"].summary(), "identified_on": others}
        rows.append(judge_model(s, "none/workers-logo", k["trace"], cm, k["profile"], fit, k["cands"], k["reps"],
                                k["sent"], None, detail, log))
        rows[-1]["worker_costs"] = asdict(found["costs"])
    return rows


def _num(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def replay_placement(t, p, spec, steps: int, workers=None, profile=None) -> dict:
    """Trace ``steps`` steps of one placement and replay the median one with its own op
    times: the simulator's link queue, transfers side by side, each its traced delivery;
    with ``workers`` (a CostModel under links.send "workers", and its ``profile``) also
    TensorFlow's run queue on its cluster, and how much longer the traced ops ran than the
    profile says."""
    from placetool.costmodel import timeline as TL
    from placetool.costmodel.tf.trace_capture import capture

    rec = TL.load(capture(t, p, spec, steps=steps, warmup=2, single_device=None), t.graph)
    k = TL.median_step(rec)
    out = {"replay_span_us": rec.steps[k].span_us}
    for links in ("fifo", "concurrent", "traced"):
        r = TL.replay(rec, k, links=links)
        out[f"replay_{links}_error_pct"] = r["error_pct"]
    # fewer traced than simulated transfers: RecvTensor records missing from the trace
    out["replay_transfers"], out["replay_simulated_transfers"] = r["transfers"], r["simulated_transfers"]
    if workers is not None:
        out["replay_workers_error_pct"] = TL.replay(rec, k, cluster=workers.cluster, links=TL.WORKERS)["error_pct"]
        from placetool.costmodel.workers_fit import op_inflation, steps_of

        dispatch = profile.dispatch_per_device(workers.cluster)
        out["op_inflation"] = op_inflation(steps_of(rec, [k]), workers.T, dispatch)
    return out


def sentinel_summary(sent, rows) -> dict:
    if sent is None:
        return {}
    e = [abs(r["ratio_error_pct"]) for r in rows]
    return {"sentinel_noise_floor_pct": sent["noise_floor_pct"], "sentinel_limit_pct": sent["limit_pct"],
            "rounds_redone": sent["redone"], "flagged_rounds": sent["flagged_rounds"],
            "ratio_median_abs_error_pct": float(np.median(e)), "ratio_max_abs_error_pct": float(np.max(e))}


def replay_summary(rows) -> dict:
    if rows is None:
        return {}
    out = {}
    for links in ("fifo", "concurrent", "traced", "workers"):
        if f"replay_{links}_error_pct" not in rows[0]:
            continue
        e = [abs(r[f"replay_{links}_error_pct"]) for r in rows]
        out[f"replay_{links}_median_abs_error_pct"] = float(np.median(e))
        out[f"replay_{links}_max_abs_error_pct"] = float(np.max(e))
        out[f"replay_{links}_within_5pct"] = int(sum(x <= 5.0 for x in e))
    return out


if __name__ == "__main__":
    sys.exit(main())
