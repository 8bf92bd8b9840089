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
           profile=None) -> tuple[dict, np.ndarray, float]:
    """Measure the k best placements seen, the best single device and the best one-shot
    baseline (and ``extra`` (source, label, per-op placement) rows) in one interleaved
    run, and confirm a search placement picked so in a fresh run of ``confirm_rounds``
    paired rounds. Returns (JSON-ready summary, with ``placements_g`` the measured
    per-op placements of ``g``; recommended placement of ``g``; its predicted µs)."""
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
    out = verify_top(traced, rows, spec=spec, testbed=testbed_n or 0, rounds=rounds, steps=steps, log=log,
                     confirm_rounds=confirm_rounds)
    rec = out["recommended"]
    summary = {k2: v for k2, v in out.items() if k2 != "placements"}
    summary["recommended_label"] = out["rows"][rec]["label"]
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
        for t in v["refine"]["rounds"]:
            held = t["held_out_median_abs_error_pct"]
            click.echo(f"  round {t['round']}: {t['recommended']:<24} predicted {fmt_us(t['predicted_us']):>12} "
                       f"measured {fmt_us(t['measured_us']):>12} ({t['error_pct']:+.1f}%, noise ±"
                       f"{t['noise_floor_pct']:.1f}%); refit on {t['samples']} steps, held-out median |error| "
                       + ("n/a" if held is None else f"{held:.1f}%"))


def settled(error_pct: float, noise_floor_pct: float, recommended_us: float, best_search_us: float) -> bool:
    """Whether ``--refine`` may stop: the recommendation's prediction is within the noise
    floor of its measurement, and no placement of the search measured faster than it (one
    that did, unconfirmed, is what another round of measuring and refitting is for: on
    towers a round that kept one device stopped while the search's best had measured 5.7%
    faster, inside an 18% noise floor).

    >>> settled(3.0, 5.0, 80.0, 85.0), settled(3.0, 5.0, 80.0, 76.0), settled(9.0, 5.0, 80.0, 85.0)
    (True, False, False)
    """
    return abs(error_pct) <= noise_floor_pct and not best_search_us < recommended_us


def refine(g, cl, cm, profile_path, problem, result, k, rounds, rerun, testbed_n, cluster_spec, local, seed,
           quiet, model=None, trust=False, diverse: int = 2) -> tuple[dict, np.ndarray, float, object, object]:
    """``--verify-top K --refine R``: hardware in the loop. Each round measures the K best
    placements of the last search, ``diverse`` random splits and the baselines side by
    side (:func:`verify`'s run), adds every measured step to the fit's samples, refits the
    transfer costs (:func:`placetool.costmodel.calibration.fit_transfer_costs`; the random
    splits are held out of it, so each round says how well it predicts placements it was
    not fitted on) and searches again with ``rerun(problem, start, round)`` from the best
    placement measured so far. It stops once the recommended placement's prediction lies
    within the noise floor of its measurement and no placement of the search has measured
    faster than it (:func:`settled`), or after R rounds; the answer is the placement
    measured fastest, confirmed as :func:`verify` confirms.

    Returns (JSON-ready summary, recommended per-op placement, its prediction, the refined
    profile or None, the refined cluster)."""
    from dataclasses import replace

    import placetool.search as S
    from placetool.costmodel import CostModel
    from placetool.costmodel.calibration import (StepSample, fit_transfer_costs, load_profile, unfitted_cluster,
                                                 with_transfer_params)

    from .hardware import _log

    log = _log(quiet)
    prof = load_profile(profile_path) if profile_path else None
    kinds = tuple(sorted(set(cl.kinds)))
    base = unfitted_cluster(cl, prof, kinds)
    samples, table, best = [], [], None
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
        summary, rec_p, rec_pred = verify(g, cur_cl, cur_cm, profile_path, cur_problem, cur_result, k, testbed_n,
                                          cluster_spec, local, seed, quiet, model=model, trust=trust, extra=extra,
                                          confirm_rounds=5 if last else 0, profile=prof)
        rows = summary["rows"]
        for row, p in zip(rows, summary["placements_g"]):
            samples.append(StepSample(g, p, row["measured_us"], row["spread_pct"], row["label"],
                                      held_out=row["source"] == "diverse"))
        rec = rows[summary["recommended"]]
        meas = [x["measured_us"] for x in rows]
        # the search's own best measured so far joins the next round (baselines are there anyway)
        i_best = int(np.argmin([m if x["source"] == "search" else np.inf for x, m in zip(rows, meas)]))
        if best is None or meas[i_best] < best[0]:
            label = rows[i_best]["label"]
            best = (meas[i_best], summary["placements_g"][i_best],
                    best[2] if best is not None and label.startswith("best measured") else label)
        err = 100.0 * (rec["predicted_us"] - rec["measured_us"]) / rec["measured_us"]
        fit = fit_transfer_costs(samples, base, prof, kinds=kinds)
        fs = fit.summary()
        cur_cl = replace(with_transfer_params(base, fit.params, kinds), name=cl.name)
        table.append({"round": r + 1, "recommended": rec["label"], "predicted_us": rec["predicted_us"],
                      "measured_us": rec["measured_us"], "error_pct": err, "noise_floor_pct": summary["noise_floor_pct"],
                      "samples": len(samples), "fit_median_abs_error_pct": fs["fit"]["median_abs_error_pct"],
                      "held_out_median_abs_error_pct": fs["held_out"]["median_abs_error_pct"], "params": fs["params"]})
        log(f"  recommended {rec['label']}: predicted {rec['predicted_us'] / 1e3:.2f} ms, measured "
            f"{rec['measured_us'] / 1e3:.2f} ms ({err:+.1f}%, noise floor ±{summary['noise_floor_pct']:.1f}%); "
            f"refit on {len(samples)} steps: held-out median |error| "
            f"{fs['held_out']['median_abs_error_pct'] or 0:.1f}%")
        done = settled(err, summary["noise_floor_pct"], rec["measured_us"], best[0])
        if done or last:
            stopped = "prediction within the noise floor" if done else "rounds"
            break
        cur_cm = CostModel(g, cur_cl, profile=prof)
        cur_problem = S.Problem(cur_cm)
        cur_result = rerun(cur_problem, g.to_assignment(best[1]), r + 1)
    out = {**summary, "refine": {"rounds": table, "stopped": stopped, "best_measured_label": best[2],
                                 "best_measured_us": best[0]}}
    out.pop("placements_g", None)
    if prof is not None:
        prof.meta["transfer_fit"] = {**fit.summary(), "refined": f"--refine: {len(table)} rounds, {len(samples)} steps"}
        prof.cluster_dict = cur_cl.to_dict()
    return out, rec_p, rec_pred, prof, cur_cl
