"""``placetool sweep`` (a grid of searches on a process pool or Dask) and ``placetool report``."""

from __future__ import annotations

from pathlib import Path

import click

from placetool.costmodel.errors import UserError

from .common import (check_writable, emit_json, format_options, json_option, out_option, progress, quiet_option,
                     workers_option)


@click.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("--results", "-r", default="results.db", show_default=True, type=click.Path(dir_okay=False),
              help="SQLite results store; created if missing, resumed if not.")
@workers_option("Worker processes (default: one per core); with --dask, LocalCluster workers.", old=("-w",))
@click.option("--dask", is_flag=True, help="Run on a new local Dask cluster (distributed.LocalCluster).")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Run on an existing Dask cluster, e.g. tcp://host:8786.")
@click.option("--scheduler-file", default=None, type=click.Path(dir_okay=False),
              help="Run on an existing Dask cluster whose scheduler wrote this file (dask-jobqueue, dask-mpi).")
@click.option("--placements-dir", default=None, type=click.Path(file_okay=False),
              help="Where each run writes its best placement [default: RESULTS without .db, + '-placements'].")
@click.option("--skip-failed", is_flag=True, help="Do not re-run grid points recorded as failed.")
@click.option("--dry-run", is_flag=True, help="Check the sweep file and list what would run; run nothing.")
@json_option
@quiet_option
def sweep(sweep_file, results, workers, dask, scheduler, scheduler_file, placements_dir, skip_failed, dry_run,
          as_json, quiet):
    """Run every (graph, cluster, method, seed) of SWEEP_FILE; one row per run in RESULTS.

    Finished runs are skipped, so re-running a sweep resumes it. A run that raises is
    recorded as failed with its error; the exit status is 1 if any run of this
    invocation failed. See docs/sweeps.md for the file format and Slurm/PBS recipes.
    """
    from placetool.search.sweeps.store import ResultStore
    from placetool.search.sweeps.sweep import SweepError, load_sweep, run_sweep

    if sum(bool(x) for x in (dask, scheduler, scheduler_file)) > 1:
        raise SweepError("give at most one of --dask, --scheduler, --scheduler-file")
    if workers is not None and (scheduler or scheduler_file):
        raise SweepError("--workers sizes a local pool or --dask cluster; an existing cluster has its own")
    sw = load_sweep(sweep_file)  # every name and option checked before anything runs
    if not str(results).strip() or Path(results).name in ("", ".", ".."):
        raise SweepError(f"--results must name a results file (e.g. results.db), got {results!r}")
    if placements_dir is None:
        p = Path(results)
        placements_dir = str(p.with_name(p.stem + "-placements"))
    if not dry_run:  # a dry run only reads: it works on a read-only copy of the results
        check_writable(results, "--results", inputs={"SWEEP_FILE": sweep_file})
        check_writable(placements_dir, "--placements-dir", folder=True)
    if dry_run:
        with ResultStore(results, create=False) if Path(results).is_file() else _NoStore() as st:
            have = st.statuses()
        runs = sw.runs(placements_dir)
        todo = [r for r in runs if have.get(r.key) not in ({"ok", "failed"} if skip_failed else {"ok"})]
        if as_json:
            emit_json({"sweep": sw.name, "grid": len(runs), "to_run": len(todo),
                       "runs": [dict(zip(("graph", "cluster", "method", "seed", "budget", "options"), r.key))
                                for r in todo]})
        else:
            click.echo(f"sweep {sw.name}: {len(runs)} grid points, {len(todo)} to run")
            for r in todo:
                click.echo(f"  {r.label()}  [{r.budget}] {r.options_json if r.options else ''}")
        return 0

    bar = None
    where = ("an existing Dask cluster" if scheduler or scheduler_file else
             "a local Dask cluster" if dask else "a local process pool")

    def on_start(total, to_run):
        nonlocal bar
        if not (as_json or quiet):
            click.echo(f"sweep {sw.name}: {total} grid points, {total - to_run} done already, "
                       f"{to_run} to run on {where}", err=True)
        bar = progress(to_run, "runs", enabled=not (as_json or quiet))
        bar.__enter__()

    failures = []

    def on_result(rec):
        if rec["status"] == "failed":
            failures.append(rec)
        bar.update(1)

    client = None
    if scheduler or scheduler_file:  # connect before touching the results file
        from placetool.search.sweeps.sweep import connect_dask

        client, _ = connect_dask(scheduler=scheduler, scheduler_file=scheduler_file)
    try:
        with ResultStore(results) as store:
            try:
                summary = run_sweep(sw, store, workers=workers, dask=dask, placements_dir=placements_dir,
                                    retry_failed=not skip_failed, on_start=on_start, on_result=on_result,
                                    client=client)
            except BaseException as e:
                if bar is not None:
                    bar.__exit__(type(e), e, e.__traceback__)
                raise
            if bar is not None:
                bar.__exit__(None, None, None)
            n_ok, n_failed = store.count("ok"), store.count("failed")
    finally:
        if client is not None:
            client.close()
    summary.update({"results": str(results), "placements_dir": placements_dir, "store_ok": n_ok,
                    "store_failed": n_failed,
                    "failures": [{k: f.get(k) for k in ("graph", "cluster", "method", "seed", "error")}
                                 for f in failures]})
    if as_json:
        emit_json(summary)
    else:
        rpm = summary["runs_per_minute"]
        click.echo(f"ran {summary['ran']}: {summary['ok']} ok, {summary['failed']} failed in "
                   f"{summary['seconds']:.1f} s" + (f" ({rpm:,.0f} runs/min)" if rpm else "")
                   + (f"; {summary['elsewhere']} run by another sweep on {results}" if summary["elsewhere"] else ""))
        for f in failures[:10]:
            click.echo(f"  failed: {f['method']} on {f['graph']}/{f['cluster']} seed {f['seed']}: "
                       f"{(f.get('error') or '').splitlines()[0] if f.get('error') else ''}")
        if len(failures) > 10:
            click.echo(f"  ... and {len(failures) - 10} more (see the 'error' column)")
        click.echo(f"{results}: {n_ok} ok, {n_failed} failed rows; report with `placetool report {results}`")
    return 1 if failures else 0


class _NoStore:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def statuses(self):
        return {}


@click.command()
@click.argument("results", type=click.Path(dir_okay=False))
@out_option("Folder for report.md and the plots.", folder=True, default="report", name="out_dir")
@click.option("--html", is_flag=True, help="Also write report.html, one self-contained page.")
@click.option("--no-gantt", is_flag=True, help="Skip the Gantt timelines (they re-simulate the best placements).")
@format_options
@json_option
def report(results, out_dir, html, no_gantt, fmt, dpi, as_json):
    """Tables and plots from a sweep's RESULTS store: method x graph step times
    (mean ± std over seeds, relative to the lower bound and to the expert), method
    comparison, convergence curves and the Gantt timeline of each graph's best placement."""
    from placetool.search.sweeps.report import build_report, tables

    if not Path(results).is_file():
        raise UserError(f"{results}: no such results file")
    check_writable(out_dir, "--out", folder=True)
    r = build_report(results, out_dir, html=html, gantt=not no_gantt, fmt=fmt or "png", dpi=dpi)
    if as_json:
        emit_json({k: v for k, v in r.items() if k != "summary"})
        return 0
    for title, note, header, rows in tables(r["summary"])[:2]:
        click.echo(f"{title} ({note})")
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for row in rows:
            click.echo("  ".join(x.ljust(w) for x, w in zip(row, widths)))
        click.echo("")
    click.echo(f"{r['runs']} runs ({r['ok']} ok, {r['failed']} failed); wrote {len(r['files'])} files to {out_dir}:")
    for f in r["files"]:
        click.echo(f"  {f}")
    return 0
