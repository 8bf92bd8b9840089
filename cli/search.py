"""``placetool search``: find a placement with any registered method."""

from __future__ import annotations

import inspect
import sys

import click
import numpy as np

from .common import (check_writable, cluster_option, emit_json, fmt_us, graph_option,
                     json_option, load_problem, progress, write_json)

DEFAULT_METHOD = "sa"
DEFAULT_SECONDS = 20.0
#: baselines printed beside the result with --compare
COMPARE_WITH = ("single", "expert")


def _method_doc(name: str) -> str:
    """First line of a method's docstring; never imports TensorFlow (rl is named only)."""
    from placetool import search

    if name == "rl":
        return "REINFORCE placement policies (TensorFlow; see `placetool rl`)"
    try:
        fn = search.get(name)
    except Exception as e:  # noqa: BLE001 - a method whose module is missing or broken
        return f"(unavailable: {type(e).__name__}: {e})"
    para = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
    return para.split(". ")[0].rstrip(".")


def _list_methods(as_json: bool) -> None:
    from placetool import search

    names = search.methods()
    if as_json:
        emit_json({"methods": {n: _method_doc(n) for n in names}})
        return
    for n in names:
        click.echo(f"{n:<14} {_method_doc(n)}")


def _method_options(fn, name: str, given: dict) -> dict:
    """Keyword options for the method: only those the user gave; an option the method
    does not take is a user error naming the flag."""
    from placetool.search import SearchError

    if not given:
        return {}
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in given:
        if not takes_any and key not in params:
            raise SearchError(f"method {name!r} takes no option --{key.replace('_', '-')}")
    return given


class _Bar:
    """Progress on stderr, driven by the tracker's callback (fraction of the budget)."""

    def __init__(self, budget, enabled: bool):
        self.budget = budget
        self.ctx = progress(1000, "searching", enabled)
        self.bar = None
        self.pos = 0

    def __enter__(self):
        self.bar = self.ctx.__enter__()
        return self

    def __exit__(self, *a):
        return self.ctx.__exit__(*a)

    def __call__(self, evaluations, seconds, best_step_us):
        f = 0.0
        if self.budget.evals:
            f = max(f, evaluations / self.budget.evals)
        if self.budget.seconds:
            f = max(f, seconds / self.budget.seconds)
        pos = int(min(f, 1.0) * 1000)
        if pos > self.pos:
            self.bar.update(pos - self.pos)
            self.pos = pos


@click.command()
@graph_option()
@cluster_option()
@click.option("--method", "-m", default=DEFAULT_METHOD, show_default=True,
              help="Search method (`--method list` or `--list` shows them).")
@click.option("--list", "list_only", is_flag=True, help="List the methods and exit.")
@click.option("--budget-evals", type=int, default=None, help="Stop after this many simulated placements.")
@click.option("--budget-seconds", type=float, default=None,
              help=f"Stop after this many seconds (default {DEFAULT_SECONDS:g} when no budget is given).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed: same seed, same answer.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the best placement as JSON (op -> device).")
@click.option("--profile", default=None, help="A measured profile (placetool calibrate) for op times.")
@json_option
@click.option("--compare", "--baseline", "compare", is_flag=True,
              help=f"Also run {', '.join(COMPARE_WITH)} and print them beside the result.")
@click.option("--storage", default=None, help="tpe: Optuna storage URL (e.g. sqlite:///study.db) to persist/share a study.")
@click.option("--policy", default=None, help="rl: policy name.")
@click.option("--init-from", "init_from", type=click.Path(), default=None, help="rl: start from a saved policy.")
@click.option("--logdir", type=click.Path(file_okay=False), default=None, help="rl: write training logs here.")
@click.option("--verify-top", "verify_top", type=click.IntRange(min=1), default=None,
              help="Run the K best placements found on real devices and report the measured best.")
@click.option("--testbed", "testbed_n", type=click.IntRange(min=1), default=None,
              help="--verify-top: start N local TF workers around the measurements.")
@click.option("--cluster-spec", type=click.Path(dir_okay=False), default=None,
              help="--verify-top: measure on a running TF cluster (JSON cluster spec).")
@click.option("--local", is_flag=True, help="--verify-top: measure on this process's own devices.")
@click.option("--progress/--no-progress", "show_progress", default=True,
              help="Progress bar on stderr (only on a terminal).")
def search(graph, cluster, method, list_only, budget_evals, budget_seconds, seed, out, profile, as_json,
           compare, storage, policy, init_from, logdir, verify_top, testbed_n, cluster_spec, local,
           show_progress):
    """Search a placement of GRAPH on CLUSTER with METHOD within a budget.

    Prints the best placement's simulated step time beside a lower bound (no
    communication, fastest devices). Exit status 1 if the best placement found does
    not fit in memory.
    """
    import placetool.search as S

    if list_only or method == "list":
        _list_methods(as_json)
        return
    try:
        fn = S.get(method)  # unknown method: SearchError before any loading
    except ImportError as e:
        raise S.SearchError(f"method {method!r} is not available here ({e})") from None
    if budget_evals is None and budget_seconds is None:
        # a method may ask for its own default (rl needs longer than a one-shot heuristic)
        default = getattr(sys.modules[fn.__module__], "DEFAULT_BUDGET", None)
        budget = default or S.Budget(seconds=DEFAULT_SECONDS)
    else:
        budget = S.Budget(evals=budget_evals, seconds=budget_seconds)
    given = {k: v for k, v in dict(storage=storage, policy=policy, init_from=init_from, logdir=logdir).items()
             if v is not None}
    options = _method_options(fn, method, given)
    check_writable(out)

    g, cl, cm = load_problem(graph, cluster, profile)
    problem = S.Problem(cm)  # SearchError when no placement can fit
    if verify_top:
        _check_verify_options(g, cl, testbed_n, cluster_spec, local)  # before searching
    with _Bar(budget, show_progress and not as_json) as bar:
        result = S.run(method, problem, budget, seed=seed, progress=bar, keep_top=verify_top or 0, **options)

    lb = result.lower_bound_us
    reason = None if result.feasible else cm.simulate(result.placement).reason
    baselines = {}
    if compare:
        for b in COMPARE_WITH:
            if b != method:
                r = S.run(b, problem, S.Budget(evals=64), seed=seed)
                baselines[b] = {"step_time_us": r.step_time_us, "feasible": r.feasible}
    counts = np.bincount(result.assignment, minlength=cl.n_devices)
    op_counts = np.bincount(result.placement, minlength=cl.n_devices)
    obj = {
        "graph": g.name,
        "cluster": cl.name,
        "method": method,
        "seed": seed,
        "budget": {"evals": budget.evals, "seconds": budget.seconds},
        "step_time_us": result.step_time_us if np.isfinite(result.step_time_us) else None,
        "feasible": result.feasible,
        "reason": reason,
        "lower_bound_us": lb,
        "gap_to_lower_bound": (result.step_time_us / lb) if lb > 0 else None,
        "evaluations": result.evaluations,
        "seconds": result.seconds,
        "groups_per_device": {n: int(c) for n, c in zip(cl.names, counts)},
        "ops_per_device": {n: int(c) for n, c in zip(cl.names, op_counts)},
        "history": [{"evaluations": e, "seconds": s, "best_step_us": b} for e, s, b in result.history],
        "metadata": result.metadata,
        "out": None,
    }
    if baselines:
        obj["baselines"] = baselines
    if verify_top:
        obj["verified"] = _verify(g, cl, cm, result, verify_top, testbed_n, cluster_spec, local, as_json)
    if out and result.feasible:
        write_json(out, cm.placement_to_json(result.placement, result.step_time_us, extra={
            "method": method, "seed": seed, "feasible": True, "lower_bound_us": lb}))
        obj["out"] = out

    if as_json:
        emit_json(obj)
    else:
        _print_human(g, cl, obj, baselines, out)
    if not result.feasible:
        if not as_json:
            click.echo(f"placetool: the best placement found does not fit: {reason}"
                       + (f"; {out} not written" if out else ""), err=True)
        sys.exit(1)


def _check_verify_options(g, cl, testbed_n, cluster_spec, local) -> None:
    """Fail before the search if the hardware check cannot run."""
    from placetool.costmodel.errors import UserError

    from .hardware import check_cluster_matches, planned_spec

    if not (testbed_n or cluster_spec or local):
        raise UserError("--verify-top needs --testbed N, --cluster-spec FILE or --local")
    if g.name not in _zoo_names():
        raise UserError(f"--verify-top: graph {g.name!r} is not a zoo model placetool can trace and run")
    check_cluster_matches(cl, planned_spec(testbed_n, "cpu", cluster_spec, local))


def _zoo_names() -> list[str]:
    from placetool.costmodel.tf import zoo

    return list(zoo.ZOO)


def _verify(g, cl, cm, result, k, testbed_n, cluster_spec, local, quiet) -> dict:
    """Measure the k best placements seen; the measured best is the answer."""
    from placetool.costmodel.tf.runner import verify_top

    from .hardware import planned_spec

    top = [t for t in result.top if t[1]][:k] or result.top[:k]
    spec = None if testbed_n else planned_spec(None, "cpu", cluster_spec, local)
    if not quiet:
        click.echo(f"measuring the {len(top)} best placements on real devices ...", err=True)
    trace_kw = {key: g.meta[key] for key in ("batch", "mode", "optimizer") if key in g.meta}
    rows = verify_top(g.name, cl, [a for _, _, a in top], k=k, predicted=[st for st, _, _ in top],
                      spec=spec, testbed=testbed_n or 0, graph=g, trace_kw=trace_kw)
    return {"measured": [{key: r[key] for key in ("rank", "predicted_us", "measured_us", "error_pct")}
                         for r in rows],
            "best_measured_rank": rows[0]["rank"] if rows else None}


def _print_human(g, cl, obj, baselines, out) -> None:
    step, lb = obj["step_time_us"], obj["lower_bound_us"]
    click.echo(f"{obj['method']} on {g.name} ({g.n_ops} ops, {g.n_groups} groups) / {cl.name}")
    gap = f", {step / lb:.2f}x" if lb > 0 and np.isfinite(step) else ""
    click.echo(f"step time   {fmt_us(step)}   (lower bound {fmt_us(lb)}{gap})")
    click.echo(f"feasible    {'yes' if obj['feasible'] else 'NO: ' + str(obj['reason'])}")
    click.echo(f"searched    {obj['evaluations']:,} placements in {obj['seconds']:.2f} s")
    meta = obj.get("metadata") or {}
    if meta.get("source"):  # where the best placement came from, when the method says
        vs = meta.get("vs_warm_start")
        click.echo(f"source      {meta['source']}" + (f" ({vs:.3f}x the warm start)" if vs else ""))
    click.echo("devices     " + ", ".join(f"{n}: {c} ops" for n, c in obj["ops_per_device"].items() if c))
    for b, r in baselines.items():
        rel = f"{r['step_time_us'] / step:.2f}x ours" if step > 0 and np.isfinite(step) else ""
        feas = "" if r["feasible"] else " (does not fit)"
        click.echo(f"  {b:<10} {fmt_us(r['step_time_us']):>12}  {rel}{feas}")
    for r in obj.get("verified", {}).get("measured", []):
        click.echo(f"  measured #{r['rank'] + 1}: {fmt_us(r['measured_us'])} "
                   f"(predicted {fmt_us(r['predicted_us'])}, error {r['error_pct']:+.1f}%)")
    if obj["out"]:
        click.echo(f"placement written to {out}")
