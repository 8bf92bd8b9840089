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
           rounds: int = 3, steps: int = 3, model=None, trust=False) -> tuple[dict, np.ndarray, float]:
    """Measure the k best placements seen, the best single device and the best one-shot
    baseline in one interleaved run. Returns (JSON-ready summary, recommended per-op
    placement of ``g``, its predicted µs)."""
    from placetool.costmodel.calibration import load_profile
    from placetool.costmodel.tf.importer import retrace
    from placetool.costmodel.tf.runner import remap_placement, verify_top

    from .hardware import _log, planned_spec

    log = _log(quiet)
    prof = load_profile(profile_path) if profile_path else None
    top = [t for t in result.top if t[1]][:k] or result.top[:k]
    cands = [("search", f"search #{i + 1}", g.to_placement(a)) for i, (_, _, a) in enumerate(top)]
    cands += baselines(problem, seed, log)
    log(f"tracing {g.name} again to run it ...")
    # what runs is said even under --quiet: it is code the user asked to run
    traced = retrace(g, model=model, trust=trust, say=lambda msg: click.echo(f"placetool: {msg}", err=True))
    rows = [{"label": label, "source": src, "predicted_us": predicted_us(cm, prof, p),
             "devices_used": sorted({cl.names[d] for d in np.unique(p)}),
             "placement": remap_placement(g, p, traced.graph)}
            for src, label, p in cands]
    log(f"measuring {len(rows)} placements ({len(top)} from the search, {len(rows) - len(top)} baselines), "
        f"{rounds} interleaved rounds of {steps} steps ...")
    spec = None if testbed_n else planned_spec(None, "cpu", cluster_spec, local)
    out = verify_top(traced, rows, spec=spec, testbed=testbed_n or 0, rounds=rounds, steps=steps, log=log)
    rec = out["recommended"]
    summary = {k2: v for k2, v in out.items() if k2 != "placements"}
    summary["recommended_label"] = out["rows"][rec]["label"]
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
