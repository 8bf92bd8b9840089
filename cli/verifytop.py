"""``placetool search --verify-top K``: the search's best placements against the baselines,
measured side by side on real devices; what hardware says is fastest is the answer."""

from __future__ import annotations

import click
import numpy as np

from placetool.costmodel.errors import UserError

#: one-shot methods whose best (predicted) placement is measured beside the search's
ONE_SHOT = ("round-robin", "expert", "metis", "mincut", "heft", "critical-path", "m-topo", "m-etf", "m-sct")


def check_verify_options(g, cl, testbed_n, cluster_spec, local, model=None, trust=False) -> None:
    """Fail before the search if the hardware check cannot run: no devices, no
    TensorFlow, a graph whose source cannot be traced again (or that records a user
    source, with neither ``model`` named nor ``trust`` given), a cluster unlike the devices."""
    from .hardware import check_cluster_matches, planned_spec

    if not (testbed_n or cluster_spec or local):
        raise UserError("--verify-top needs --testbed N, --cluster-spec FILE or --local")
    from placetool.costmodel.tf.session import require_tf

    require_tf()
    from placetool.costmodel.tf.importer import check_retraceable

    check_retraceable(g, model=model, trust=trust)
    check_cluster_matches(cl, planned_spec(testbed_n, "cpu", cluster_spec, local))


def predicted_us(cm, profile, p) -> float:
    """Simulated step plus the profile's fixed per-step overhead (what verify predicts)."""
    from .hardware import step_overhead_us

    return float(cm.simulate(p).step_time_us) + step_overhead_us(profile, p)


def baselines(problem, seed: int, log=None) -> list[tuple[str, str, np.ndarray]]:
    """[(source, label, per-op placement)]: the best single device, and the one-shot
    method with the best predicted step (feasible ones only)."""
    import placetool.search as S

    single = S.run("single", problem, S.Budget(evals=64), seed=seed)
    out = [("single", "single", single.placement)]
    best = None
    for name in ONE_SHOT:
        try:
            r = S.run(name, problem, S.Budget(evals=64, seconds=30), seed=seed)
        except Exception as e:  # noqa: BLE001 - a missing or failing baseline is skipped, and said so
            if log:
                log(f"  (baseline {name} skipped: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})")
            continue
        if r.feasible and np.isfinite(r.step_time_us) and (best is None or r.step_time_us < best[0]):
            best = (r.step_time_us, name, r.placement)
    if best is not None:
        out.append(("baseline", best[1], best[2]))
    return out


def verify(g, cl, cm, profile_path, problem, result, k, testbed_n, cluster_spec, local, seed, quiet,
           rounds: int = 3, steps: int = 3, model=None, trust=False, extra=(), confirm_rounds: int = 5,
           profile=None, trace_sources=(), trace_designs: bool = False) -> tuple[dict, np.ndarray, float]:
    """Measure the k best placements seen, the best single device and the best one-shot
    baseline (and ``extra`` (source, label, per-op placement) rows) in one interleaved
    run, and confirm a search placement picked so in a fresh run of ``confirm_rounds``
    paired rounds. Returns (JSON-ready summary, with ``placements_g`` the measured
    per-op placements of ``g``; recommended placement of ``g``; its predicted µs).

    The split placements of the sources in ``trace_sources`` are traced after the
    measurements too (2 steps each), and with ``trace_designs`` the designed splits that
    ``calibrate`` traces (source ``"design"``, not measured), into ``recordings``:
    [(source, label, :class:`~placetool.costmodel.timeline.Recording` of the graph that ran)]."""
    from placetool.costmodel.calibration import load_profile
    from placetool.costmodel.tf.importer import retrace
    from placetool.costmodel.tf.runner import remap_placement, verify_top

    from .hardware import _log, planned_spec

    log = _log(quiet)
    prof = profile if profile is not None else load_profile(profile_path) if profile_path else None
    top = [t for t in result.top if t[1]][:k] or result.top[:k]
    cands = [("search", f"search #{i + 1}", g.to_placement(a)) for i, (_, _, a) in enumerate(top)]
    cands += baselines(problem, seed, log) + list(extra)
    log(f"tracing {g.name} again to run it ...")
    # what runs is said even under --quiet: it is code the user asked to run
    traced = retrace(g, model=model, trust=trust, say=lambda msg: click.echo(f"placetool: {msg}", err=True))
    rows = [{"label": label, "source": src, "predicted_us": predicted_us(cm, prof, p),
             "devices_used": sorted({cl.names[d] for d in np.unique(p)}),
             "placement": remap_placement(g, p, traced.graph)}
            for src, label, p in cands]
    n_search = sum(src == "search" for src, _, _ in cands)
    n_base = sum(src in ("single", "baseline") for src, _, _ in cands)
    log(f"measuring {len(rows)} placements ({n_search} from the search, {n_base} baselines"
        + (f", {len(rows) - n_search - n_base} more" if len(rows) > n_search + n_base else "")
        + f"), {rounds} interleaved rounds of {steps} steps ...")
    spec = None if testbed_n else planned_spec(None, "cpu", cluster_spec, local)
    seen, trace = set(), []
    for (src, label, p), row in zip(cands, rows):
        if src in trace_sources and len(np.unique(p)) > 1 and p.tobytes() not in seen:
            seen.add(p.tobytes())
            trace.append((src, label, row["placement"]))
    if trace_designs:
        from placetool.costmodel.tf.calibrate import designed_splits
        from placetool.costmodel.tf.testbed import ClusterSpec

        kinds = spec or ClusterSpec.for_workers(["localhost:0"] * testbed_n, "cpu")
        trace += [("design", label, p) for label, p, _ in designed_splits(traced.graph, kinds)
                  if not label.startswith("single:")]
    out = verify_top(traced, rows, spec=spec, testbed=testbed_n or 0, rounds=rounds, steps=steps, log=log,
                     confirm_rounds=confirm_rounds, trace=[p for _, _, p in trace])
    rec = out["recommended"]
    summary = {k2: v for k2, v in out.items() if k2 not in ("placements", "traces")}
    summary["recommended_label"] = out["rows"][rec]["label"]
    if trace:
        from placetool.costmodel import timeline

        summary["recordings"] = [(src, label, timeline.load(d, traced.graph))
                                 for (src, label, _), d in zip(trace, out["traces"])]
    summary["placements_g"] = [p for _, _, p in cands]
    return summary, cands[rec][2], out["rows"][rec]["predicted_us"]


def print_verified(v: dict) -> None:
    """The measured table and the verdict, for people."""
    from .common import fmt_us

    click.echo(f"measured on real devices ({len(v['rows'])} placements, interleaved; "
               f"noise floor ±{v['noise_floor_pct']:.1f}%):")
    for i, r in enumerate(v["rows"]):
        mark = "*" if i == v["recommended"] else " "
        click.echo(f" {mark} {r['label']:<16} measured {fmt_us(r['measured_us']):>12} ±{r['spread_pct']:.1f}%   "
                   f"predicted {fmt_us(r['predicted_us']):>12} ({r['error_pct']:+.1f}%)")
    click.echo(v["message"])
    if "refine" in v:
        click.echo(f"refined over {len(v['refine']['rounds'])} rounds (stopped: {v['refine']['stopped']}):")
        steps = "traced" if v["refine"].get("rule", "").startswith("traced") else "measured"
        for t in v["refine"]["rounds"]:
            held = t["held_out_median_abs_error_pct"]
            click.echo(f"  round {t['round']}: {t['recommended']:<24} predicted {fmt_us(t['predicted_us']):>12} "
                       f"measured {fmt_us(t['measured_us']):>12} ({t['error_pct']:+.1f}%, noise ±"
                       f"{t['noise_floor_pct']:.1f}%; the search's pick {t['pick_error_pct']:+.1f}%); refit on "
                       f"{t['samples']} {steps} steps, held-out median |error| "
                       + ("n/a" if held is None else f"{held:.1f}%"))


def settled(error_pct: float, noise_floor_pct: float, recommended_us: float, best_search_us: float,
            pick_error_pct: float = 0.0) -> bool:
    """Whether ``--refine`` may stop: the recommendation's prediction is within the noise
    floor of its measurement, so is that of the search's own pick (``pick_error_pct``, the
    round's search #1), and no placement of the search measured faster than the
    recommendation. A search placement that measured faster, unconfirmed, is what another
    round of measuring and refitting is for: on towers a round that kept one device stopped
    while the search's best had measured 5.7% faster, inside an 18% noise floor. So is a
    pick the model still flatters: with one device recommended, its own error says nothing
    of the split placements the search looks at (towers, 2026-11-29: one device predicted
    12% long, within the floor, the picks 27-36% short).

    >>> settled(3.0, 5.0, 80.0, 85.0), settled(3.0, 5.0, 80.0, 76.0), settled(9.0, 5.0, 80.0, 85.0)
    (True, False, False)
    >>> settled(3.0, 5.0, 80.0, 85.0, pick_error_pct=-30.0)
    False
    """
    return (abs(error_pct) <= noise_floor_pct and abs(pick_error_pct) <= noise_floor_pct
            and not best_search_us < recommended_us)


def refine(g, cl, cm, profile_path, problem, result, k, rounds, rerun, testbed_n, cluster_spec, local, seed,
           quiet, model=None, trust=False, diverse: int = 2) -> tuple[dict, np.ndarray, float, object, object]:
    """``--verify-top K --refine R``: hardware in the loop. Each round measures the K best
    placements of the last search, ``diverse`` random splits and the baselines side by
    side (:func:`verify`'s run), refits the transfer costs on every round's steps so far
    and searches again with ``rerun(problem, start, round)`` from the best
    placement measured so far. Each round first scales the profile's op times to one
    device's measured step (:func:`anchor_op_times`). It stops once the predictions of
    the recommended placement and of the search's own pick lie within the noise floor of
    their measurements and no placement of the search has measured faster than the
    recommendation (:func:`settled`), or after R rounds; the answer is the placement
    measured fastest, confirmed in every round as :func:`verify` confirms.

    The refit follows the cluster's rule: under ``links.send`` "workers" the per-message
    costs are identified again from traced steps of the measured placements
    (:class:`_WorkerRefit`), otherwise the costs are fitted to the measured whole steps
    (:class:`_StepRefit`). The random splits are held out of either, so each round says
    how well it predicts placements it was not fitted on.

    Returns (JSON-ready summary, recommended per-op placement, its prediction, the refined
    profile or None, the refined cluster)."""
    import placetool.search as S
    from placetool.costmodel import CostModel
    from placetool.costmodel.calibration import load_profile

    from .hardware import _log

    log = _log(quiet)
    prof = load_profile(profile_path) if profile_path else None
    kinds = tuple(sorted(set(cl.kinds)))
    refit = _WorkerRefit(g, cl, prof, kinds) if cl.link_send == "workers" else _StepRefit(g, cl, prof, kinds)
    table, best = [], None
    rng = np.random.default_rng(seed)
    cur_cl, cur_cm, cur_problem, cur_result = cl, cm, problem, result
    summary = None
    for r in range(rounds):
        extra = []
        for i in range(diverse):  # placements the search did not pick: what the fit is judged on
            frac = rng.uniform(0.1, 0.5)
            a = np.where(rng.random(g.n_groups) < frac, rng.integers(0, cl.n_devices, g.n_groups),
                         rng.integers(0, cl.n_devices))
            a = np.where(cur_problem.allowed[np.arange(g.n_groups), a], a, np.argmax(cur_problem.allowed, axis=1))
            extra.append(("diverse", f"diverse #{i + 1}", g.to_placement(a.astype(np.int32))))
        if best is not None:  # the answer is chosen by measurement, across rounds
            extra.append(("search", f"best measured ({best[2]})", best[1]))
        log(f"refine round {r + 1}/{rounds}:")
        last = r == rounds - 1
        # every round confirms its pick in a fresh run: any round may be the one that settles
        summary, rec_p, rec_pred = verify(g, cur_cl, cur_cm, profile_path, cur_problem, cur_result, k, testbed_n,
                                          cluster_spec, local, seed, quiet, model=model, trust=trust, extra=extra,
                                          confirm_rounds=5, profile=prof,
                                          trace_sources=refit.trace_sources, trace_designs=refit.designs and r == 0)
        rows = summary["rows"]
        rec = rows[summary["recommended"]]
        meas = [x["measured_us"] for x in rows]
        # the search's own best measured so far joins the next round (baselines are there anyway)
        i_best = int(np.argmin([m if x["source"] == "search" else np.inf for x, m in zip(rows, meas)]))
        if best is None or meas[i_best] < best[0]:
            label = rows[i_best]["label"]
            best = (meas[i_best], summary["placements_g"][i_best],
                    best[2] if best is not None and label.startswith("best measured") else label)
        err = 100.0 * (rec["predicted_us"] - rec["measured_us"]) / rec["measured_us"]
        pick = next(x for x in rows if x["source"] == "search")
        scale = anchor_op_times(prof, g, cl, rows, summary["placements_g"])
        cur_cl, fs = refit.add(summary, r + 1)
        table.append({"round": r + 1, "recommended": rec["label"], "predicted_us": rec["predicted_us"],
                      "measured_us": rec["measured_us"], "error_pct": err, "noise_floor_pct": summary["noise_floor_pct"],
                      "pick_error_pct": pick["error_pct"], "op_time_scale": scale, **fs})
        log(f"  recommended {rec['label']}: predicted {rec['predicted_us'] / 1e3:.2f} ms, measured "
            f"{rec['measured_us'] / 1e3:.2f} ms ({err:+.1f}%, noise floor ±{summary['noise_floor_pct']:.1f}%); "
            f"the search's pick {pick['error_pct']:+.1f}%; "
            + (f"op times scaled by {scale:.3f} to one device's measured step; " if scale != 1.0 else "")
            + refit.says(fs))
        done = settled(err, summary["noise_floor_pct"], rec["measured_us"], best[0], pick["error_pct"])
        if done or last:
            stopped = "prediction within the noise floor" if done else "rounds"
            break
        cur_cm = CostModel(g, cur_cl, profile=prof)
        cur_problem = S.Problem(cur_cm)
        cur_result = rerun(cur_problem, g.to_assignment(best[1]), r + 1)
    out = {**summary, "refine": {"rounds": table, "stopped": stopped, "best_measured_label": best[2],
                                 "best_measured_us": best[0], "rule": refit.rule}}
    out.pop("placements_g", None)
    out.pop("recordings", None)
    if prof is not None:
        refit.record(prof, len(table))
        prof.cluster_dict = cur_cl.to_dict()
    return out, rec_p, rec_pred, prof, cur_cl


def anchor_op_times(prof, g, cl, rows, placements) -> float:
    """Scale the profile's op times of ``g`` (on the kind of the device ``single`` ran
    on) so that one device's prediction is its step measured in this round, as
    ``calibrate`` anchors them to the one-device steps measured among its designs: the
    VM's speed drifts by 20-30% over minutes (towers, 2026-11-29: one device predicted
    68.9 ms, measured 54.5 in the next round), and a transfer refit cannot tell that from
    transfer costs. Returns the factor (1.0 when it is within
    :data:`~placetool.costmodel.tf.calibrate.ANCHOR_MIN_PCT` of 1, or without a
    profile of ``g``'s ops)."""
    from placetool.costmodel.tf.calibrate import scale_op_times

    from .hardware import step_overhead_us

    i = next((i for i, x in enumerate(rows) if x["source"] == "single"), None)
    if prof is None or i is None:
        return 1.0
    kind = cl.kinds[int(placements[i][0])]
    if g.name not in prof.ops.get(kind, {}):
        return 1.0
    over = step_overhead_us(prof, placements[i])
    return scale_op_times(prof, g.name, [kind], (rows[i]["measured_us"] - over) / (rows[i]["predicted_us"] - over))


class _StepRefit:
    """``--refine`` under the cluster's own rule: the transfer costs refitted to every
    whole step measured so far (:func:`placetool.costmodel.calibration.fit_transfer_costs`),
    the diverse splits held out of the fit."""

    rule = "whole steps (fit_transfer_costs)"
    trace_sources = ()
    designs = False

    def __init__(self, g, cl, prof, kinds):
        from placetool.costmodel.calibration import unfitted_cluster

        self.g, self.cl, self.prof, self.kinds = g, cl, prof, kinds
        self.base = unfitted_cluster(cl, prof, kinds)
        self.samples, self.fit = [], None

    def add(self, summary, round_no) -> tuple[object, dict]:
        """Refit with one more round's measured steps: (the refitted cluster, its table fields)."""
        from dataclasses import replace

        from placetool.costmodel.calibration import StepSample, fit_transfer_costs, with_transfer_params

        for row, p in zip(summary["rows"], summary["placements_g"]):
            self.samples.append(StepSample(self.g, p, row["measured_us"], row["spread_pct"], row["label"],
                                           held_out=row["source"] == "diverse"))
        self.fit = fit_transfer_costs(self.samples, self.base, self.prof, kinds=self.kinds)
        fs = self.fit.summary()
        cl = replace(with_transfer_params(self.base, self.fit.params, self.kinds), name=self.cl.name)
        return cl, {"samples": len(self.samples), "fit_median_abs_error_pct": fs["fit"]["median_abs_error_pct"],
                    "held_out_median_abs_error_pct": fs["held_out"]["median_abs_error_pct"], "params": fs["params"]}

    @staticmethod
    def says(fs) -> str:
        return (f"refit on {fs['samples']} steps: held-out median |error| "
                f"{fs['held_out_median_abs_error_pct'] or 0:.1f}%")

    def record(self, prof, n_rounds) -> None:
        prof.meta["transfer_fit"] = {**self.fit.summary(),
                                     "refined": f"--refine: {n_rounds} rounds, {len(self.samples)} steps"}


class _WorkerRefit:
    """``--refine`` under ``links.send`` "workers": the run queue's per-message costs
    identified again from traced steps of the placements each round measured (the
    search's and the best baseline's, every round's kept) pooled with calibrate's
    designed splits, traced once in the first round, as ``calibrate --link-send
    workers`` identifies them (:func:`placetool.costmodel.tf.calibrate.worker_costs_from_steps`):
    timelines, not whole steps, so a latency is not traded against CPU at either end. The
    search's picks alone are too alike to tell the costs apart (towers, 2026-11-29: the
    arrival cost swung from 2 to 250 µs between rounds). The diverse splits are not
    traced; their measured steps judge the costs."""

    rule = "traced steps (workers)"
    trace_sources = ("search", "baseline")
    designs = True

    def __init__(self, g, cl, prof, kinds):
        from placetool.costmodel.calibration import unfitted_cluster

        self.g, self.cl, self.prof = g, cl, prof
        self.links = unfitted_cluster(cl, prof, kinds)  # the lone transfers' latency and bandwidth
        self.steps, self.found, self.n_designs = [], None, 0

    def add(self, summary, round_no) -> tuple[object, dict]:
        """Identify again with one more round's traced steps: (the cluster, its table fields)."""
        from dataclasses import asdict, replace

        from placetool.costmodel import CostModel
        from placetool.costmodel.tf.calibrate import worker_costs_from_steps
        from placetool.costmodel.workers import with_worker_costs
        from placetool.costmodel.workers_fit import steps_of

        new = 0
        for src, label, rec in summary.get("recordings", ()):  # none when nothing split ran
            mine = steps_of(rec, label=f"round {round_no} {label}")
            self.steps += mine
            self.n_designs += len(mine) if src == "design" else 0
            new += len(mine)
        if not self.steps:  # nothing split was traced yet: the costs stay
            return self.cl, {"samples": 0, "design_samples": 0, "fit_median_abs_error_pct": None,
                             "held_out_median_abs_error_pct": None, "params": None}
        if new:  # else the same steps would give the same costs
            self.found = worker_costs_from_steps([self.steps], self.links, self.prof)
            self.cl = replace(with_worker_costs(self.links, self.found["costs"]), name=self.cl.name)
        cm = CostModel(self.g, self.cl, profile=self.prof)
        held = [abs(predicted_us(cm, self.prof, p) - row["measured_us"]) / row["measured_us"] * 100
                for row, p in zip(summary["rows"], summary["placements_g"]) if row["source"] == "diverse"]
        return self.cl, {"samples": len(self.steps), "design_samples": self.n_designs,
                    "fit_median_abs_error_pct": self.found["fit"].summary()["median_abs_error_pct"],
                    "held_out_median_abs_error_pct": float(np.median(held)) if held else None,
                    "params": asdict(self.found["costs"]), "replay_params": asdict(self.found["fit"].costs),
                    "message_inflation": self.found["inflation"]}

    @staticmethod
    def says(fs) -> str:
        if not fs["samples"]:
            return "no split placement traced yet: the per-message costs stay"
        return (f"costs identified again from {fs['samples']} traced steps (replayed within "
                f"{fs['fit_median_abs_error_pct']:.1f}%, median): diverse splits predicted within "
                f"{fs['held_out_median_abs_error_pct'] or 0:.1f}%")

    def record(self, prof, n_rounds) -> None:
        from dataclasses import asdict

        if self.found is None:
            return
        prof.meta["worker_fit"] = {**prof.meta.get("worker_fit", {}), **self.found["fit"].summary(),
                                   "replay_costs": asdict(self.found["fit"].costs),
                                   "costs": asdict(self.found["costs"]), "message_inflation": self.found["inflation"],
                                   "refined": f"--refine: {n_rounds} rounds, {len(self.steps)} traced steps"}
