"""``islands``: one annealing search spread over the workers of a Dask cluster.

Each worker runs an island: ``sa`` on its own copy of the problem with its own random
seed. The budget is cut into ``epochs``. After each epoch the islands report their best
placements, and every island starts the next one from the best of all (``sa``'s
``start``); their restarts, kicks and random draws then take them apart again. The
first epoch starts from ``sa``'s usual seeds.

The budget means what it means for one process. Seconds are the search's wall time:
each epoch gets an equal share of what is left. Evaluations count every island's:
each island gets an equal share of an epoch's. The islands of an epoch are as many as
the cluster has workers when it starts, so a cluster that loses or gains workers goes
on with what it has. A worker that dies mid-epoch loses nothing that was reported:
the scheduler reruns its island on a worker still there, and an island that cannot
finish before the epoch's deadline (plus a grace for that rerun) is dropped from that
epoch, its start being the best already known.

The result's metadata says how many workers took part in each epoch (``workers``,
``epochs``: one row each, with the best step and the island that found it).

>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem, Budget, run
>>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
>>> r = run("islands", Problem(cm), Budget(evals=400), workers=2, epochs=2)  # doctest: +SKIP
>>> r.metadata["workers"]  # doctest: +SKIP
2
"""

from __future__ import annotations

import time

import numpy as np

from .errors import SearchError
from .registry import Count, NonNegative, register

#: an island's epoch that has not reported this long after the epoch's deadline is dropped
#: (a worker that died mid-epoch has its island rerun elsewhere, which needs most of an epoch)
GRACE_FRACTION = 1.0
#: seconds per epoch that a budget of seconds aims at when ``epochs`` is not given: long
#: enough for sa to leave its start, short enough that islands share finds a few times
EPOCH_SECONDS = 10.0


def _island(problem, start, seed: int, evals: int | None, seconds: float | None, threads: int | None,
            options: dict, keep_top: int = 0) -> dict:
    """One island's epoch on a worker: ``sa`` from ``start`` (None: from its seeds); with
    ``keep_top``, the best distinct placements it scored come back too (``top``)."""
    from .registry import run
    from .tracker import Budget

    if threads:
        import numba

        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    opts = dict(options)
    if start is not None:
        opts["start"] = np.asarray(start, np.int32)
    r = run("sa", problem, Budget(evals=evals, seconds=seconds), seed=seed, keep_top=keep_top, **opts)
    return {"assignment": np.asarray(r.assignment, np.int32), "step_time_us": float(r.step_time_us),
            "feasible": bool(r.feasible), "evaluations": int(r.evaluations), "seconds": float(r.seconds),
            "top": [(float(t), bool(f), np.asarray(a, np.int32)) for t, f, a in r.top]}


@register("islands", summary="Annealing islands on a Dask cluster that share their best placements "
                             "(--dask or --scheduler ADDR)")
def islands(problem, budget, seed, tracker, scheduler: str | None = None, workers: Count | None = None,
            epochs: Count | None = None, grace: NonNegative = GRACE_FRACTION, client=None, **sa_options):
    """Annealing islands on a Dask cluster, exchanging their best placements after each
    epoch (see the module docstring); returns metadata. ``client``: a Dask client (from
    Python); else ``scheduler`` (an address) or, with neither, a local cluster of
    ``workers`` processes. Other options go to every island's ``sa``."""
    from .registry import check_options
    from .sweeps.sweep import connect_dask

    sa_options = check_options("sa", sa_options)
    if "start" in sa_options:
        raise SearchError("islands: the islands choose their own start; give no 'start' option")
    own = None
    if client is None:
        client, own = connect_dask(dask=scheduler is None, scheduler=scheduler, workers=workers)
    try:
        return _search(problem, budget, seed, tracker, client, epochs, grace, sa_options, own is not None)
    finally:
        if own is not None or scheduler is not None:
            client.close()
        if own is not None:
            own.close()


def _search(problem, budget, seed, tracker, client, epochs, grace, sa_options, local: bool) -> dict:
    from distributed import wait

    from .sweeps.sweep import dask_threads

    if epochs is None:
        epochs = max(1, round(budget.seconds / EPOCH_SECONDS)) if budget.seconds else 4
    epochs = int(epochs)
    data = client.scatter(problem, broadcast=True, hash=False)
    rows, evaluations, dropped = [], 0, 0
    # what an epoch costs beyond its islands' own seconds (submitting, shipping, a
    # worker's first unpickling), measured as the epochs go, so the budget holds
    overhead = 1.0
    for e in range(epochs):
        if tracker.done():
            break
        threads = dask_threads(client)
        addrs = sorted(threads)
        if not addrs:
            raise SearchError("islands: the Dask cluster has no workers")
        n = len(addrs)
        seconds = evals = None
        if budget.seconds is not None:
            left = budget.seconds - tracker.seconds
            seconds = (left - overhead) / (epochs - e)
            if seconds <= 0.05 * budget.seconds / epochs:
                break
        if budget.evals is not None:
            evals = max(1, tracker.remaining_evals() // ((epochs - e) * n))
        start = tracker.best_assignment  # the best of all islands so far (the tracker keeps it)
        t0 = time.perf_counter()
        futs = [client.submit(_island, data, start, seed * 1_000_003 + e * 1009 + i, evals, seconds,
                              threads[a], sa_options, tracker.keep_top, workers=[a], allow_other_workers=True,
                              pure=False)
                for i, a in enumerate(addrs)]
        # an island rerun after its worker died needs most of an epoch more, but never
        # past the search's own budget
        timeout = None if seconds is None else min(seconds * (1 + grace), left) + 5.0
        try:
            wait(futs, timeout=timeout)
        except TimeoutError:  # the islands not back by then are dropped below
            pass
        done = {f for f in futs if f.done()}
        row = {"epoch": e, "workers": n, "islands_reported": 0, "best_step_us": None, "best_island": None}
        longest = 0.0
        for i, f in enumerate(futs):
            if f in done and f.status == "error":
                f.result()  # a fault in the island itself is raised here, not hidden
            if f not in done or f.status != "finished":
                dropped += 1
                f.cancel()
                continue
            r = f.result()
            longest = max(longest, r["seconds"])
            row["islands_reported"] += 1
            evaluations += r["evaluations"]
            before = (tracker.best_feasible, tracker.best_step_us)
            _record(tracker, r)
            if (tracker.best_feasible, tracker.best_step_us) != before:
                row["best_island"] = i
        if row["islands_reported"] == n:
            overhead = max(overhead, time.perf_counter() - t0 - longest)
        row["best_step_us"] = None if tracker.best_assignment is None else tracker.best_step_us
        rows.append(row)
    if tracker.best_assignment is None:
        raise SearchError("islands: no island reported within the budget")
    return {"workers": max(r["workers"] for r in rows), "epochs": rows, "islands_dropped": dropped,
            "island_evaluations": evaluations, "cluster": "local" if local else "external"}


def _record(tracker, r: dict) -> None:
    """Count an island's evaluations and offer its best to the tracker (its best few where
    the tracker keeps them for ``--verify-top``)."""
    tracker.record_top(r.get("top") or [(r["step_time_us"], r["feasible"], r["assignment"])], r["evaluations"])
