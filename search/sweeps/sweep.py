"""Sweeps: every (graph, cluster, method, seed) of a TOML sweep file, run on a process pool
or a Dask cluster, each result a row of the SQLite store (:mod:`placetool.search.sweeps.store`).

A sweep file::

    [sweep]
    graphs = ["synthetic-1k", "nmt"]      # bundled names, synthetic-N, or graph files
    clusters = ["k80x4"]                  # presets or cluster TOML files
    methods = ["single", "random", "sa"]
    seeds = [0, 1]
    budget_seconds = 5                    # and/or budget_evals = 1000
    timeout_seconds = 60                  # optional: a run working longer fails (process pool; compiling not counted)

    [options.random]                      # optional keyword options of one method
    batch = 32

Relative paths are taken from the sweep file's folder. Everything is checked (names,
types, option names against the method's signature) before any run starts.

Runs never raise into the driver: :func:`run_one` turns an exception into a ``failed``
record with its message and traceback. A worker process that dies (segfault, OOM kill)
has its run retried; see :func:`run_pool` and :func:`run_dask`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from placetool.costmodel.errors import UserError, atomic_write
from placetool.costmodel.jitclock import work_clock
from placetool.costmodel.procs import process_alive

from .sweepfile import (  # noqa: F401  (re-exported: the sweep file's names were defined here)
    SWEEP_KEYS,
    TOP_KEYS,
    Run,
    Sweep,
    SweepError,
    _check_methods,
    _cluster_source,
    _graph_source,
    _local_path,
    _no_duplicates,
    budget_label,
    load_sweep,
    parse_sweep,
)

HISTORY_POINTS = 2000  # longest best-so-far history kept per run


# ----------------------------------------------------------------- one run
def versions() -> dict:
    """Versions that decide a run's result."""
    import importlib.metadata as md

    import numba
    import numpy

    try:
        pt = md.version("placetool")
    except md.PackageNotFoundError:
        pt = "unknown"
    return {"placetool": pt, "python": sys.version.split()[0], "numpy": numpy.__version__, "numba": numba.__version__}


def placement_filename(run: Run) -> str:
    """A readable, collision-free file name for a run's placement."""
    def clean(s):
        return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(s).name.removesuffix(".npz").removesuffix(".toml"))

    h = hashlib.sha1(repr(run.key).encode()).hexdigest()[:8]
    return f"{clean(run.graph)}__{clean(run.cluster)}__{clean(run.method)}__s{run.seed}__{h}.json"


class RunTimeout(Exception):
    pass


def _pin_threads(threads: int | None) -> None:
    """Cap this thread's numba parallelism (numba's setting is per thread)."""
    if not threads:
        return
    import numba

    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


#: the most wall time a run's ``timeout_seconds`` waits on for numba compiling (a compile
#: that never returns is a hang like any other)
COMPILE_GRACE_S = 600.0
#: a run's timeout is raised again this often until it sticks: raised while Python runs a
#: finalizer (``__del__``: llvmlite frees compiled code in them) it is printed and dropped
TIMEOUT_RETRY_S = 0.05


def run_one(run: Run, threads: int | None = None) -> dict:
    """Run one grid point; always returns a record (``status`` ``ok`` or ``failed``)."""
    t0 = time.perf_counter()
    rec = {"graph": run.graph, "cluster": run.cluster, "method": run.method, "seed": run.seed,
           "budget": run.budget, "options": run.options_json, "graph_source": run.graph_source,
           "cluster_source": run.cluster_source, "budget_evals": run.budget_evals,
           "budget_seconds": run.budget_seconds, "host": socket.gethostname(), "attempts": 1}
    # the alarm works in a process's main thread (pool workers); Dask runs tasks in threads
    alarm = (run.timeout_seconds is not None and hasattr(signal, "setitimer")
             and threading.current_thread() is threading.main_thread())
    try:
        rec["versions"] = versions()
        _pin_threads(threads)
        import numba

        rec["numba_threads"] = numba.get_num_threads()
        if alarm:
            w0, wall0 = work_clock(), time.perf_counter()

            def _timeout(signum, frame):
                # the limit counts work, as the budget does: a machine's first runs also compile
                # (a minute or two), and that waits on; a compile past COMPILE_GRACE_S does not
                left = run.timeout_seconds - (work_clock() - w0)
                grace = run.timeout_seconds + COMPILE_GRACE_S - (time.perf_counter() - wall0)
                if min(left, grace) > 0.01:
                    signal.setitimer(signal.ITIMER_REAL, min(left, grace))
                    return
                signal.setitimer(signal.ITIMER_REAL, TIMEOUT_RETRY_S)
                raise RunTimeout(f"run took longer than timeout_seconds = {run.timeout_seconds:g}")

            old = signal.signal(signal.SIGALRM, _timeout)
            signal.setitimer(signal.ITIMER_REAL, run.timeout_seconds)
        try:
            rec.update(_search(run))
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        rec["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - every failure becomes a recorded row
        rec["status"] = "failed"
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc(limit=20)
    rec["wall_seconds"] = time.perf_counter() - t0
    rec["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return rec


def _search(run: Run) -> dict:
    from placetool import search
    from placetool.costmodel import CostModel, presets

    g = presets.load_graph(run.graph_source)
    cl = presets.load_cluster(run.cluster_source)
    cm = CostModel(g, cl)
    r = search.run(run.method, search.Problem(cm), search.Budget(evals=run.budget_evals, seconds=run.budget_seconds),
                   seed=run.seed, **dict(run.options))
    hist = [[int(e), float(s), float(b)] for e, s, b in r.history]
    if len(hist) > HISTORY_POINTS:  # keep the shape of the curve, first and last points included
        idx = sorted(set(round(i * (len(hist) - 1) / (HISTORY_POINTS - 1)) for i in range(HISTORY_POINTS)))
        hist = [hist[i] for i in idx]
    out = {"step_time_us": float(r.step_time_us), "feasible": int(bool(r.feasible)),
           "lower_bound_us": float(r.lower_bound_us), "evaluations": int(r.evaluations),
           "seconds": float(r.seconds), "compile_seconds": float(r.compile_seconds), "n_ops": g.n_ops, "n_groups": g.n_groups, "n_devices": cl.n_devices,
           "history": hist, "metadata": _plain(r.metadata)}
    if run.placements_dir:
        path = Path(run.placements_dir) / placement_filename(run)
        doc = cm.placement_to_json(r.placement, r.step_time_us, extra={
            "method": run.method, "seed": run.seed, "budget": run.budget, "options": dict(run.options),
            "feasible": bool(r.feasible), "lower_bound_us": float(r.lower_bound_us)})
        atomic_write(path, json.dumps(doc, indent=1) + "\n")
        out["placement_path"] = str(path)
    return out


def _plain(x):
    """Metadata as JSON-safe values (numpy scalars/arrays become numbers/lists)."""
    return json.loads(json.dumps(x, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))


def failed_record(run: Run, error: str, attempts: int = 1) -> dict:
    """The row of a run that never returned (its worker died, or the cluster lost it)."""
    return {"graph": run.graph, "cluster": run.cluster, "method": run.method, "seed": run.seed,
            "budget": run.budget, "options": run.options_json, "graph_source": run.graph_source,
            "cluster_source": run.cluster_source, "budget_evals": run.budget_evals,
            "budget_seconds": run.budget_seconds, "status": "failed", "error": error, "attempts": attempts,
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}


# ----------------------------------------------------------------- runners
def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def exit_with(pid: int) -> None:
    """Exit this process (at once, ``os._exit``) when process ``pid`` ends.

    Pool workers are children of the forkserver, not of the driver, and the forkserver
    lives as long as any worker does; so a worker watches the driver itself. A pidfd
    wakes the watching thread the moment the driver ends (polling /proc where there is
    none); ``PR_SET_PDEATHSIG`` covers the forkserver going away too.
    """
    import threading

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch():
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            import select

            p = select.poll()
            p.register(fd, select.POLLIN)
            p.poll()  # readable once the process has ended
        else:
            while process_alive(pid):
                time.sleep(0.5)
        os._exit(128 + signal.SIGTERM)

    if not process_alive(pid):
        os._exit(128 + signal.SIGTERM)
    threading.Thread(target=watch, name="exit-with-driver", daemon=True).start()


def _process_local_numba_init_lock() -> None:
    """Give numba's threading-layer start a lock of this process only.

    Under forkserver numba takes a multiprocessing RLock: a named semaphore registered
    with the driver's resource tracker. A worker killed mid-run (SIGKILL, after SIGTERM's
    grace, or a crash) cannot unregister it, and the tracker then prints "leaked semaphore"
    warnings after the driver's last line. A pool worker starts no processes of its own,
    so a threading lock guards numba's start as well here.
    """
    try:
        from numba.np.ufunc import parallel
    except ImportError:
        return
    if getattr(parallel, "_backend_init_process_lock", False) is None:  # numba not started yet
        parallel._backend_init_process_lock = threading.RLock()


def _worker_term(signum, frame) -> None:
    """A pool worker told to stop: run this process's multiprocessing finalizers (whatever
    it registered with the resource tracker), then exit at once. (SystemExit would be
    caught by the pool's task loop and sent back as the task's result.)"""
    import multiprocessing.util as mpu

    try:
        mpu._run_finalizers(0)
    finally:
        os._exit(128 + signum)


def _init_worker(threads: int | None, driver: int | None = None) -> None:
    """Process-pool worker start: exit with the driver process (no orphans when it is
    killed), pin numba and BLAS threads so workers share the cores."""
    if driver:
        exit_with(driver)
    signal.signal(signal.SIGTERM, _worker_term)
    _process_local_numba_init_lock()
    if threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    _pin_threads(threads)


def _mp_context():
    import multiprocessing as mp

    # forkserver: cheap restarts after a worker dies; never fork the (maybe threaded) driver
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["placetool.search.sweeps.sweep"])
        return ctx
    return mp.get_context("spawn")


def run_pool(runs: list[Run], workers: int, on_result: Callable[[dict], None], threads: int | None = None,
             max_attempts: int = 2, run_fn: Callable = run_one, claim: Callable[[Run], bool] | None = None) -> None:
    """Run on a local process pool, calling ``on_result(record)`` as each run finishes.
    ``claim(run)``, asked just before a run starts, may say another driver has it.

    At most ``workers`` runs are in flight, so when a worker dies the suspects are known:
    they are re-run one at a time, which finds the culprit; a run whose worker dies
    ``max_attempts`` times while it runs alone is recorded as failed. ``attempts`` in
    each record counts the tries.
    """
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    workers = max(1, int(workers))
    ctx = _mp_context()

    def new_pool():
        return ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(threads, os.getpid()))

    pending, suspects = deque(runs), deque()
    lost: dict[Run, int] = {}    # times a run was in flight when its pool broke
    alone: dict[Run, int] = {}   # ... while it was the only run in flight: its own fault
    inflight: dict = {}
    starts = 0
    pool = new_pool()
    try:
        while pending or suspects or inflight:
            limit = 1 if suspects else workers
            while len(inflight) < limit and (suspects or pending):
                queue = suspects if suspects else pending
                r = queue.popleft()
                if queue is pending and claim is not None and not claim(r):
                    continue
                try:
                    inflight[pool.submit(run_fn, r, threads)] = r
                except BrokenProcessPool:  # a worker died since the last wait: handled below
                    queue.appendleft(r)
                    break
            if not inflight:  # the pool broke with nothing in flight: workers cannot start
                starts += 1
                if starts > 3:
                    raise SweepError("the sweep's worker processes die as they start (see the log above)")
                pool.shutdown(wait=True, cancel_futures=True)
                pool = new_pool()
                continue
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                wait(inflight)  # every in-flight future ends once the pool is broken
                broken = [inflight[f] for f in inflight if isinstance(f.exception(), BrokenProcessPool)]
                for f, r in inflight.items():
                    if not isinstance(f.exception(), BrokenProcessPool):
                        on_result(_result(f, r, lost))
                inflight.clear()
                pool.shutdown(wait=True, cancel_futures=True)
                for r in broken:
                    lost[r] = lost.get(r, 0) + 1
                    if len(broken) == 1:
                        alone[r] = alone.get(r, 0) + 1
                        if alone[r] >= max_attempts:
                            on_result(failed_record(r, f"worker process died under it {lost[r]} times "
                                                       "(a crash, or killed, e.g. for memory)", lost[r]))
                            continue
                    suspects.append(r)
                pool = new_pool()
                continue
            for f in done:
                on_result(_result(f, inflight.pop(f), lost))
    except BaseException:
        # interrupted or terminated: the runs in flight are lost anyway (nothing of theirs
        # is stored), so stop their workers now instead of waiting for them at exit
        _kill_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _kill_workers(pool, grace_s: float = 3.0) -> None:
    """SIGTERM every worker of ``pool``, SIGKILL those still there after ``grace_s``."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for sig_method in ("terminate", "kill"):
        for proc in procs:
            try:
                if proc.is_alive():
                    getattr(proc, sig_method)()
            except (OSError, ValueError, AssertionError):
                pass
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
            except (OSError, ValueError, AssertionError):
                pass


def _result(fut, run: Run, lost: dict) -> dict:
    try:
        rec = fut.result()
    except Exception as e:  # noqa: BLE001 - e.g. a result that could not be pickled
        rec = failed_record(run, f"{type(e).__name__}: {e}")
    rec["attempts"] = lost.get(run, 0) + 1
    return rec


def _dask_task(run_fn, run: Run, threads_by_worker: dict) -> dict:
    from distributed import get_worker

    w = get_worker()
    threads = threads_by_worker.get(w.address) or max(1, cpu_count() // max(1, w.state.nthreads))
    return run_fn(run, threads)


def dask_threads(client) -> dict:
    """Numba threads per Dask worker: a host's cores shared among the task threads on it."""
    info = client.scheduler_info(n_workers=-1)["workers"] if "n_workers" in inspect.signature(
        client.scheduler_info).parameters else client.scheduler_info()["workers"]
    cores = client.run(cpu_count)
    per_host: dict = {}
    for addr, w in info.items():
        per_host[w["host"]] = per_host.get(w["host"], 0) + int(w["nthreads"])
    return {addr: max(1, int(cores.get(addr, 1)) // max(1, per_host[w["host"]])) for addr, w in info.items()}


def run_dask(runs: list[Run], client, on_result: Callable[[dict], None], retries: int = 1,
             run_fn: Callable = run_one, claim: Callable[[Run], bool] | None = None) -> None:
    """Run on a Dask cluster. The scheduler re-runs a task whose worker died
    (``distributed.scheduler.allowed-failures`` times); after that it is recorded as failed.
    ``claim(run)``: as in :func:`run_pool` (asked for every run before submitting)."""
    from distributed import KilledWorker, as_completed

    import uuid

    if claim is not None:
        runs = [r for r in runs if claim(r)]
    if not runs:
        return
    threads = dask_threads(client)
    batch = uuid.uuid4().hex[:8]  # keys unique per call: a shared client may still hold older ones
    futs = {}
    for r in runs:
        key = f"placetool-run-{hashlib.sha1(repr(r.key).encode()).hexdigest()[:16]}-{batch}"
        futs[client.submit(_dask_task, run_fn, r, threads, key=key, pure=False, retries=retries)] = r
    for f in as_completed(futs):
        r = futs[f]
        try:
            rec = f.result()
        except KilledWorker as e:
            rec = failed_record(r, f"worker died running it too many times (KilledWorker: {e})")
        except Exception as e:  # noqa: BLE001 - lost task, unpicklable result...
            rec = failed_record(r, f"{type(e).__name__}: {e}")
        on_result(rec)
        f.release()


def connect_dask(dask: bool = False, scheduler: str | None = None, scheduler_file: str | None = None,
                 workers: int | None = None, timeout: float = 15):
    """A Dask client: a new LocalCluster (``dask``), or an existing cluster's scheduler.
    Returns (client, cluster or None); close both when done."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:  # pragma: no cover - dask is a dependency
        raise SweepError(f"Dask is not installed ({e})") from None
    if scheduler or scheduler_file:
        try:
            if scheduler_file:
                if not Path(scheduler_file).is_file():
                    raise SweepError(f"{scheduler_file}: no such scheduler file")
                return Client(scheduler_file=scheduler_file, timeout=timeout), None
            return Client(scheduler, timeout=timeout), None
        except SweepError:
            raise
        except (OSError, TimeoutError, ValueError) as e:
            raise SweepError(f"cannot connect to the Dask scheduler at {scheduler or scheduler_file}: {e}") from None
    import dask

    n = workers or cpu_count()
    # one task thread per worker process (numba is pinned per task); the statistical
    # profiler samples every task thread's stack every 10 ms, which costs CPU-bound runs time
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
    return Client(cluster, timeout=timeout), cluster


# ----------------------------------------------------------------- driver
def run_sweep(sweep: Sweep, store, *, workers: int | None = None, dask: bool = False,
              scheduler: str | None = None, scheduler_file: str | None = None, placements_dir=None,
              retry_failed: bool = True, on_start: Callable[[int, int], None] | None = None,
              on_result: Callable[[dict], None] | None = None, run_fn: Callable = run_one,
              client=None) -> dict:
    """Run the grid points of ``sweep`` not yet ``ok`` in ``store``; returns a summary.

    ``on_start(total, to_run)`` is called once the work is known, ``on_result(record)``
    after each run is stored. Failed rows are re-run unless ``retry_failed`` is False.
    ``client``: an already connected Dask client to run on (left open).
    """
    if sum(bool(x) for x in (dask, scheduler, scheduler_file)) > 1:
        raise SweepError("give at most one of --dask, --scheduler, --scheduler-file")
    if workers is not None and workers < 1:
        raise SweepError(f"--workers must be at least 1, got {workers}")
    if placements_dir is not None:
        Path(placements_dir).mkdir(parents=True, exist_ok=True)
    grid = sweep.runs(placements_dir)
    seen = store.row_versions()
    skip = {"ok"} | (set() if retry_failed else {"failed"})
    todo = [r for r in grid if seen.get(r.key, (None,))[0] not in skip]
    counts = {"ok": 0, "failed": 0}
    if on_start:
        on_start(len(grid), len(todo))
    # claim each point just before it starts: several drivers on one store split the grid
    owner = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
    elsewhere = []

    def claim(run: Run) -> bool:
        if store.claim(run.key, owner, seen.get(run.key)):
            return True
        elsewhere.append(run)
        return False

    def done(rec):
        store.put(rec)
        store.release(owner, tuple(rec[c] for c in ("graph", "cluster", "method", "seed", "budget", "options")))
        store.heartbeat(owner)
        counts[rec["status"]] += 1
        if on_result:
            on_result(rec)

    t0 = time.perf_counter()
    runner = "pool"
    try:
        if client is not None:
            runner = "dask"
            if todo:
                run_dask(todo, client, done, run_fn=run_fn, claim=claim)
        elif todo:
            if dask or scheduler or scheduler_file:
                runner = "dask"
                client, cluster = connect_dask(dask, scheduler, scheduler_file, workers)
                try:
                    run_dask(todo, client, done, run_fn=run_fn, claim=claim)
                finally:
                    client.close()
                    if cluster is not None:
                        cluster.close()
            else:
                n = min(workers or cpu_count(), len(todo))
                run_pool(todo, n, done, threads=max(1, cpu_count() // n), run_fn=run_fn, claim=claim)
    finally:
        try:
            store.release(owner)  # interrupted: what this driver did not finish is free again
        except UserError:
            pass
    secs = time.perf_counter() - t0
    ran = counts["ok"] + counts["failed"]
    return {"sweep": sweep.name, "grid": len(grid), "skipped": len(grid) - len(todo), "ran": ran,
            "elsewhere": len(elsewhere), "ok": counts["ok"], "failed": counts["failed"], "seconds": secs,
            "runner": runner, "runs_per_minute": 60 * ran / secs if ran and secs > 0 else None}


__all__ = ["Run", "Sweep", "SweepError", "load_sweep", "parse_sweep", "run_one", "run_pool", "run_dask",
           "run_sweep", "connect_dask", "failed_record"]
