"""``placetool search``: find a placement with any registered method."""

from __future__ import annotations

import traceback
from pathlib import Path

import click
import numpy as np

from placetool.costmodel.errors import UserError

from .common import (budget_options, check_writable, cluster_option, emit_json, fmt_us, graph_option,
                     json_option, load_problem, notes_compiles, out_option, profile_option, progress, quiet_option,
                     write_json)
from .main import fail, raise_if_stopped

DEFAULT_METHOD = "sa"
#: baselines printed beside the result with --compare
COMPARE_WITH = ("single", "expert")


def _budget_text(b) -> str:
    parts = ([f"{b.seconds:g} s"] if b.seconds else []) + ([f"{b.evals} evals"] if b.evals else [])
    return ", ".join(parts)


def _list_methods(as_json: bool) -> None:
    from placetool import search

    t = search.table()
    if as_json:
        emit_json({"methods": {n: {"summary": i.summary, "module": i.module,
                                   "default_budget": {"evals": i.budget.evals, "seconds": i.budget.seconds},
                                   "seed": i.seed_rank is not None, "seed_rank": i.seed_rank}
                                for n, i in t.items()}})
        return
    for n, i in t.items():
        click.echo(f"{n:<14} {i.summary} [{_budget_text(i.budget)}{'; seeds sa/tpe/rl' if i.seed_rank is not None else ''}]")


def _parse_options(pairs) -> dict:
    """``--option KEY=VALUE`` pairs as keyword options: numbers, true/false and none
    are read as such, anything else stays a string."""
    import ast

    from placetool.search import SearchError

    out = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key.strip():
            raise SearchError(f"--option {pair!r}: expected KEY=VALUE (e.g. --option links=ideal)")
        low = text.strip().lower()
        if low in ("true", "false", "none"):
            value = {"true": True, "false": False, "none": None}[low]
        else:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
        out[key.strip().replace("-", "_")] = value
    return out


#: about the largest problem ``exact`` proves within a minute (benchmarks/README.md,
#: "Proven optima on small random problems"): beyond it an unfinished proof says so
EXACT_GROUPS = 36


class _Bar:
    """Progress on stderr, driven by the tracker's callback: the fraction of the budget
    spent and the best step time so far; 100% once the search returns."""

    def __init__(self, budget, enabled: bool):
        self.budget = budget
        self.bar = progress(1000, "searching", enabled)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *a):
        return self.bar.__exit__(*a)

    def __call__(self, evaluations, seconds, best_step_us):
        raise_if_stopped()  # a placement scored after Ctrl-C or SIGTERM: the first raise was lost
        f = 0.0
        if self.budget.evals:
            f = max(f, evaluations / self.budget.evals)
        if self.budget.seconds:
            f = max(f, seconds / self.budget.seconds)
        self.bar.advance_to(int(min(f, 1.0) * 1000), best_step_us)


def _check_method_options(S, method, budget_evals, budget_seconds, flags, method_opts, dask_local, scheduler,
                          workers):
    """(method, budget, options) the run will use, checked before anything is loaded:
    ``--dask``/``--scheduler`` turn ``sa`` into its islands, ``--option`` pairs and the
    method's own flags (``flags``) are checked against the method's options."""
    facts = S.info(method)  # unknown method: SearchError before any loading
    if budget_evals is None and budget_seconds is None:
        budget = facts.budget
    else:
        budget = S.Budget(evals=budget_evals, seconds=budget_seconds)
    given = {**flags, **_parse_options(method_opts)}
    if dask_local or scheduler:  # one sa search spread over a Dask cluster's workers
        if dask_local and scheduler:
            raise UserError("give only one of --dask, --scheduler ADDR")
        if method != "sa":
            raise UserError(f"--dask and --scheduler run annealing islands: they need --method sa, not {method!r}")
        given = {**given, "scheduler": scheduler, "workers": workers}
        method = "islands"
    elif workers is not None:
        raise UserError("--workers only applies with --dask")
    options = S.check_options(method, given, spell=lambda k: f"--{k.replace('_', '-')}" if k in flags
                              else repr(k))  # before the graph is loaded
    return method, budget, options


def _check_verify_flags(verify_top, refine, profile, profile_out, model, trust_source, inputs) -> None:
    """The options that only apply with ``--verify-top`` (or ``--refine``) given without it."""
    if refine and not verify_top:
        raise UserError("--refine only applies with --verify-top")
    if profile_out and not (refine and profile):
        raise UserError("--profile-out needs --refine and --profile (the profile it writes is that one, refitted)")
    check_writable(profile_out, "--profile-out", inputs=inputs)
    if (model is not None or trust_source) and not verify_top:
        raise UserError(f"{'--model' if model is not None else '--trust-graph-source'} only applies with --verify-top")
    if model is not None and trust_source:
        raise UserError("give only one of --model SOURCE, --trust-graph-source")


def _run_method(S, method, problem, budget, seed, options, keep_top, bar_enabled):
    """(result, interrupted, failed): the search's result; the exit status when Ctrl-C
    (130) or SIGTERM (143) cut it short, else None; the unexpected exception (a bug in
    the method) it ended with, else None. Cut short or failed, the result is the best
    found before; with nothing found yet the exception goes on up."""
    interrupted = None
    failed = None
    try:
        with _Bar(budget, bar_enabled) as bar:
            result = S.run(method, problem, budget, seed=seed, progress=bar, keep_top=keep_top, **options)
    except (KeyboardInterrupt, SystemExit) as e:
        result = getattr(e, "partial_result", None)
        if result is None:  # nothing evaluated yet: nothing to keep
            raise
        interrupted = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130
    except (UserError, OSError):  # a user mistake or a file system problem: one line, as everywhere
        raise
    except Exception as e:  # a fault in the method: keep what it found before, then report it
        result = getattr(e, "partial_result", None)
        if result is None:
            raise
        failed = e
    return result, interrupted, failed


def _baselines(S, problem, method, seed) -> dict:
    """--compare: the :data:`COMPARE_WITH` methods' step times on the problem."""
    baselines = {}
    for b in COMPARE_WITH:
        if b != method:
            r = S.run(b, problem, S.Budget(evals=64), seed=seed)
            baselines[b] = {"step_time_us": r.step_time_us, "feasible": r.feasible}
    return baselines


def _result_json(g, cl, method, seed, budget, result, reason) -> dict:
    """The search's result as the JSON object ``--json`` prints (``out`` still None)."""
    lb = result.lower_bound_us
    counts = np.bincount(result.assignment, minlength=cl.n_devices)
    op_counts = np.bincount(result.placement, minlength=cl.n_devices)
    return {
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
        "compile_seconds": result.compile_seconds,
        "groups_per_device": {n: int(c) for n, c in zip(cl.names, counts)},
        "ops_per_device": {n: int(c) for n, c in zip(cl.names, op_counts)},
        "history": [{"evaluations": e, "seconds": s, "best_step_us": b} for e, s, b in result.history],
        "metadata": result.metadata,
        "out": None,
    }


def _verify_result(S, obj, g, cl, cm, profile, problem, result, method, budget, seed, options, verify_top, refine,
                   profile_out, testbed_n, cluster_spec, local, model, trust_source, quiet):
    """--verify-top (and --refine): measure the best placements on real devices, into
    ``obj["verified"]``; returns (best placement, its step time, what the placement
    file records of the measurement): what hardware measured fastest is the answer."""
    from .verifytop import refine as refine_loop, verify

    if refine:
        def rerun(pr, start, r):  # the next round's search, from the best measured placement
            if method in ("sa", "islands"):
                return S.run("sa", pr, budget, seed=seed + r, keep_top=verify_top, start=start)
            return S.run(method, pr, budget, seed=seed + r, keep_top=verify_top, **options)

        obj["verified"], best, best_us, prof_new, cl_new = refine_loop(
            g, cl, cm, profile, problem, result, verify_top, refine, rerun, testbed_n, cluster_spec, local,
            seed, quiet, model=model, trust=trust_source)
        if profile_out:
            from placetool.costmodel.errors import atomic_output

            with atomic_output(profile_out) as tmp_p, atomic_output(str(Path(profile_out).with_suffix(".toml"))) as tmp_c:
                prof_new.save(tmp_p)
                cl_new.save(tmp_c)
            obj["profile_out"] = profile_out
    else:
        obj["verified"], best, best_us = verify(g, cl, cm, profile, problem, result, verify_top, testbed_n,
                                                cluster_spec, local, seed, quiet,
                                                model=model, trust=trust_source)
        obj["verified"].pop("placements_g", None)
    v = obj["verified"]["rows"][obj["verified"]["recommended"]]
    extra = {"verified": {"label": v["label"], "measured_us": v["measured_us"],
                          "confirmed": obj["verified"]["confirmed"]}}
    return best, best_us, extra


def _exit_status(obj, result, method, out, reason, interrupted, failed, as_json) -> None:
    """Exit with an error after the output when the search was cut short, failed or
    found no placement that fits."""
    if interrupted:
        what = "interrupted" if interrupted == 130 else "terminated"
        kept = f"; the best placement so far is in {out}" if obj["out"] else ""
        fail(f"{what} after {result.evaluations:,} placements{kept}", interrupted, as_json)
    if failed is not None:
        kept = f"; the best placement found before it is in {out}" if obj["out"] else ""
        msg = (f"method {method!r} failed after {result.evaluations:,} placements ({obj['failed']}){kept}. "
               f"This is a bug in placetool; please report it with the traceback")
        trace = "".join(traceback.format_exception(failed))
        if not as_json:
            click.echo(trace, err=True, nl=False)
            msg += " above"
        fail(msg, 1, as_json, traceback=trace)
    if not result.feasible:
        fail(f"the best placement found does not fit: {reason}" + (f"; {out} not written" if out else ""), 1, as_json)


@click.command()
@graph_option()
@cluster_option()
@click.option("--method", "-m", default=DEFAULT_METHOD, show_default=True,
              help="Search method (`--method list` or `--list` shows them).")
@click.option("--list", "list_only", is_flag=True, help="List the methods and exit.")
@budget_options(seconds_help="Stop after this many seconds (default: the method's own, see --list).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Random seed (>= 0): same seed, same answer.")
@out_option("Write the best placement as JSON (op -> device).")
@profile_option()
@json_option
@quiet_option
@click.option("--compare", "--baseline", "compare", is_flag=True,
              help=f"Also run {', '.join(COMPARE_WITH)} and print them beside the result.")
@click.option("--option", "method_opts", multiple=True, metavar="KEY=VALUE",
              help="A method option, repeatable (e.g. -m m-etf --option links=ideal).")
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
@click.option("--model", default=None, metavar="SOURCE",
              help="--verify-top: the model to run (module:function from the current directory, SavedModel "
                   "or .pb), checked against the graph; a graph file's own recorded source is never run unasked.")
@click.option("--trust-graph-source", "trust_source", is_flag=True,
              help="--verify-top: run the model source the graph file records (prints what it imports).")
@click.option("--refine", type=click.IntRange(min=1), default=None, metavar="R",
              help="--verify-top: hardware in the loop: up to R rounds of measuring, refitting the transfer costs "
                   "to what was measured and searching again from the best measured placement.")
@click.option("--profile-out", type=click.Path(dir_okay=False), default=None,
              help="--refine: write the refitted profile here (and its cluster beside it, .toml).")
@click.option("--dask", "dask_local", is_flag=True,
              help="sa: run annealing islands on a local Dask cluster (--workers processes) that share their best.")
@click.option("--scheduler", default=None, metavar="ADDR",
              help="sa: run annealing islands on the Dask cluster of this scheduler (e.g. tcp://host:8786).")
@click.option("--workers", "-n", type=click.IntRange(min=1), default=None,
              help="--dask: worker processes (default: one per core).")
@click.option("--progress/--no-progress", "show_progress", default=True,
              help="Progress bar on stderr (only on a terminal).")
@notes_compiles
def search(graph, cluster, method, list_only, budget_evals, budget_seconds, seed, out, profile, as_json, quiet,
           compare, method_opts, storage, policy, init_from, logdir, verify_top, testbed_n, cluster_spec, local,
           model, trust_source, refine, profile_out, dask_local, scheduler, workers, show_progress):
    """Search a placement of GRAPH on CLUSTER with METHOD within a budget.

    Prints the best placement's simulated step time beside a lower bound on any
    placement's step time. Exit status 1 if the best placement found does not fit in
    memory.
    """
    import placetool.search as S

    if list_only or method == "list":
        _list_methods(as_json)
        return
    inputs = {"--graph": graph, "--cluster": cluster, "--profile": profile, "--cluster-spec": cluster_spec}
    check_writable(out, "--out", inputs=inputs)
    check_writable(logdir, "--logdir", folder=True)
    flags = {k: v for k, v in dict(storage=storage, policy=policy, init_from=init_from, logdir=logdir).items()
             if v is not None}
    method, budget, options = _check_method_options(S, method, budget_evals, budget_seconds, flags, method_opts,
                                                    dask_local, scheduler, workers)
    _check_verify_flags(verify_top, refine, profile, profile_out, model, trust_source, {**inputs, "--out": out})
    g, cl, cm = load_problem(graph, cluster, profile)
    problem = S.Problem(cm)  # SearchError when no placement can fit
    if verify_top:
        from .verifytop import check_verify_options

        check_verify_options(g, cl, testbed_n, cluster_spec, local, model, trust_source)  # before searching
    result, interrupted, failed = _run_method(S, method, problem, budget, seed, options, verify_top or 0,
                                              show_progress and not (as_json or quiet))
    if interrupted is not None or failed is not None:
        compare = verify_top = None  # report what was found, start nothing new

    reason = None if result.feasible else cm.simulate(result.placement).reason
    baselines = _baselines(S, problem, method, seed) if compare else {}
    obj = _result_json(g, cl, method, seed, budget, result, reason)
    if baselines:
        obj["baselines"] = baselines
    best, best_us, extra = result.placement, result.step_time_us, {}
    if verify_top:
        best, best_us, extra = _verify_result(S, obj, g, cl, cm, profile, problem, result, method, budget, seed,
                                              options, verify_top, refine, profile_out, testbed_n, cluster_spec,
                                              local, model, trust_source, as_json or quiet)
    if out and result.feasible:
        write_json(out, cm.placement_to_json(best, best_us, extra={
            "method": method, "seed": seed, "feasible": True, "lower_bound_us": result.lower_bound_us, **extra}))
        obj["out"] = out

    if interrupted:
        obj["interrupted"] = True
    if failed is not None:
        obj["failed"] = f"{type(failed).__name__}: {failed}"
    if as_json:
        emit_json(obj)
    else:
        _print_human(g, cl, obj, baselines, out)
    _exit_status(obj, result, method, out, reason, interrupted, failed, as_json)


def _print_human(g, cl, obj, baselines, out) -> None:
    step, lb = obj["step_time_us"], obj["lower_bound_us"]
    click.echo(f"{obj['method']} on {g.name} ({g.n_ops} ops, {g.n_groups} groups) / {cl.name}")
    gap = f", {step / lb:.2f}x" if lb > 0 and np.isfinite(step) else ""
    click.echo(f"step time   {fmt_us(step)}   (lower bound {fmt_us(lb)}{gap})")
    click.echo(f"feasible    {'yes' if obj['feasible'] else 'NO: ' + str(obj['reason'])}")
    click.echo(f"searched    {obj['evaluations']:,} placements in {obj['seconds']:.2f} s")
    if obj["compile_seconds"] >= 0.5:  # not in the budget: kernels compile once per machine
        click.echo(f"compiled    kernels in {obj['compile_seconds']:.1f} s more (first use on this machine; "
                   f"cached for later runs)")
    meta = obj.get("metadata") or {}
    if meta.get("epochs") and meta.get("workers"):  # islands: how many took part
        click.echo(f"islands     {meta['workers']} workers, {len(meta['epochs'])} epochs, "
                   f"{meta.get('islands_dropped', 0)} island-epochs lost")
    if meta.get("source"):  # where the best placement came from, when the method says
        vs = meta.get("vs_warm_start")
        click.echo(f"source      {meta['source']}" + (f" ({vs:.3f}x the warm start)" if vs else ""))
    if meta.get("status") in ("optimal", "feasible") and meta.get("bound_us"):  # exact's proof
        if meta["status"] == "optimal":
            proof = "optimal (no placement is faster)"
        else:
            frac = meta.get("gap")
            gap = "" if frac is None else f" (gap {frac:.1%})" if frac >= 0.001 else f" (gap {frac:.3%})"
            proof = f"not finished: no placement is below {fmt_us(meta['bound_us'])}{gap}"
            groups = sum(obj["groups_per_device"].values())
            if groups > EXACT_GROUPS:
                proof += f"; exact proves problems of up to ~{EXACT_GROUPS} groups in a minute, this one has {groups:,}"
        click.echo(f"proof       {proof}")
    click.echo("devices     " + ", ".join(f"{n}: {c} ops" for n, c in obj["ops_per_device"].items() if c))
    for b, r in baselines.items():
        rel = f"{r['step_time_us'] / step:.2f}x ours" if step > 0 and np.isfinite(step) else ""
        feas = "" if r["feasible"] else " (does not fit)"
        click.echo(f"  {b:<10} {fmt_us(r['step_time_us']):>12}  {rel}{feas}")
    if "verified" in obj:
        from .verifytop import print_verified

        print_verified(obj["verified"])
    if obj["out"]:
        click.echo(f"placement written to {out}")
