"""``tpe``: Optuna's Tree-structured Parzen Estimator over a coarsened problem.

TPE with thousands of categorical parameters is barely better than random, so groups
are merged into about ``variables`` chunks: groups in topological order (by their
first op), cut into consecutive runs of about equal compute time. One categorical
parameter per chunk picks its device; a group that cannot run there goes to its own
first allowed device, and groups with a single allowed device (pinned) are fixed and
take no parameter. With ``anchor`` (the default) each chunk may also keep its groups
where the best seed placement has them, so TPE searches around the best baseline and
not only among coarse placements. Trials are asked ``batch`` at a time and scored together by the
parallel batch simulator (``Tracker.evaluate``); the study is seeded with the
baselines' and list schedulers' placements, coarsened (``enqueue_trial``). The study
lives in memory unless ``storage`` (any Optuna RDB URL, e.g. ``sqlite:///study.db``,
or ``journal:///path/study.log`` for a journal file) is given: then it is created or resumed under a name derived
from graph, cluster, coarsening and seed, so several processes can share it.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from .errors import SearchError
from .registry import Count, Seeds, Size, register
from .seeding import objective, seed_assignments
from .tracker import BudgetExhausted


def coarsen(problem, variables: int = 100):
    """Chunks of movable groups: returns (chunk index per group, -1 for fixed groups;
    number of chunks; allowed devices per chunk)."""
    g = problem.graph
    movable = problem.allowed.sum(axis=1) >= 2
    first = np.full(problem.n_groups, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, g.group, g.topo_rank.astype(np.int64))
    order = np.flatnonzero(movable)[np.argsort(first[movable], kind="stable")]
    chunk = np.full(problem.n_groups, -1, np.int64)
    k = min(int(variables), order.size)
    if k == 0:
        return chunk, 0, []
    if order.size <= k:  # few enough: one variable per group, no coarsening
        cut = np.arange(order.size)
    else:
        t = np.where(problem.allowed, problem.group_time, np.inf).min(axis=1)[order]
        w = np.cumsum(t) - t / 2 + 1e-9  # each group's mid-point on the time line
        cut = np.minimum((w / (w[-1] + t[-1] / 2) * k).astype(np.int64), k - 1)
        # a group longer than a chunk leaves chunks empty: renumber densely
        _, cut = np.unique(cut, return_inverse=True)
    chunk[order] = cut
    n_chunks = int(cut.max()) + 1
    devs = [np.flatnonzero(problem.allowed[order[cut == c]].any(axis=0)) for c in range(n_chunks)]
    return chunk, n_chunks, devs


KEEP = -1  # a chunk's value meaning "as in the anchor placement"


def study_name(problem, n_chunks: int, seed: int, anchor=None) -> str:
    g, cl = problem.graph, problem.cluster
    h = hashlib.sha1(np.ascontiguousarray(g.group).tobytes() + np.ascontiguousarray(problem.allowed).tobytes())
    if anchor is not None:
        h.update(np.ascontiguousarray(anchor, np.int32).tobytes())
    return f"placetool-tpe-{g.name}-{g.n_ops}ops-{cl.name}-{n_chunks}vars-{h.hexdigest()[:8]}-seed{seed}"


def _storage(url):
    """An Optuna storage: None (memory), ``journal:///path.log`` (a journal file, cheap
    to append and safe to share between processes on one file system), or any RDB URL
    (``sqlite:///study.db``, ``postgresql://...``), once :func:`check_storage` passed it."""
    if url is None or not url.startswith("journal://"):
        return url
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(url[len("journal://"):]))


def check_storage(url) -> None:
    """SearchError now if ``url`` cannot name an Optuna storage (an unknown scheme, a
    malformed address, a file in a folder that does not exist), not only once the seeds
    have been scored: a budget the seeds use up would otherwise never open it, and the
    study the user asked to keep would silently not be written. Connects to nothing."""
    if url is None or url.startswith("journal://"):
        if url is not None and not url[len("journal://"):]:
            raise SearchError(f"tpe: journal storage {url!r} names no file (journal:///path/to/study.log)")
        if url is not None:
            _check_folder(url, url[len("journal://"):])
        return
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)  # parses the URL and loads its dialect, opens no connection
    except Exception as e:
        raise SearchError(f"tpe: cannot open Optuna storage {url!r}: {type(e).__name__}: {e} (e.g. "
                          f"sqlite:///study.db or journal:///study.log)") from None
    if engine.url.get_backend_name() == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        _check_folder(url, engine.url.database)


def _check_folder(url, path) -> None:
    from pathlib import Path

    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        raise SearchError(f"tpe: cannot open Optuna storage {url!r}: folder {str(folder)!r} does not exist")


@register("tpe", summary="Optuna TPE over topological chunks of groups, from the seeding methods' placements")
def tpe(problem, budget, seed, tracker, variables: Count = 100, batch: Count = 16, storage: str | None = None,
        seeds: Seeds | None = None, startup: Size = 10, multivariate: bool = True, anchor: bool = True):
    """Optuna TPE over topological chunks of groups (see the module docstring)."""
    cap = problem.cost_model.capacity
    chunk, n_chunks, devs = coarsen(problem, variables)
    fallback = np.argmax(problem.allowed, axis=1).astype(np.int32)
    fixed = chunk < 0
    names = [f"c{c}" for c in range(n_chunks)]

    check_storage(storage)
    # seeds before Optuna's import (~0.5 s): a budget shorter than that still scores them
    seeds_, skipped = seed_assignments(problem, budget, seed, tracker, names=seeds)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    # the anchor: the best seed; a chunk set to KEEP leaves its groups where the anchor has them
    base = seeds_[0][2] if (anchor and seeds_) else fallback

    def assignment(params) -> np.ndarray:
        a = base.copy()
        if n_chunks:
            choice = np.array([params[nm] for nm in names], np.int32)
            want = choice[np.maximum(chunk, 0)]
            ok = (want >= 0) & ~fixed
            ok[ok] = problem.allowed[np.flatnonzero(ok), want[ok]]
            a[ok] = want[ok]
        return a
    meta = {"variables": n_chunks, "seeds": list(dict.fromkeys(n for _, n, _ in seeds_)), "skipped_seeds": skipped,
            "storage": storage or "memory"}
    if n_chunks == 0 or tracker.done():
        return meta

    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=multivariate,
                                         constant_liar=True)
    name = study_name(problem, n_chunks, seed, base if anchor else None)
    try:
        study = optuna.create_study(storage=_storage(storage), study_name=name, sampler=sampler, direction="minimize",
                                    load_if_exists=storage is not None)
    except (ValueError, ImportError, optuna.exceptions.OptunaError) as e:
        raise SearchError(f"tpe: cannot open Optuna storage {storage!r}: {e}") from None
    except Exception as e:  # SQLAlchemy's errors (bad URL, unwritable file) are not Optuna's
        raise SearchError(f"tpe: cannot open Optuna storage {storage!r}: {type(e).__name__}: {e}") from None
    meta["study"] = name
    meta["resumed_trials"] = len(study.trials)
    # dashboards and later readers of a shared storage see what the study places where
    for key, value in {"graph": problem.graph.name, "cluster": problem.cluster.name, "ops": problem.graph.n_ops,
                       "groups": problem.n_groups, "devices": problem.n_devices, "variables": n_chunks,
                       "seed": seed, "lower_bound_us": float(problem.lower_bound_us())}.items():
        study.set_user_attr(key, value)
    keep = [KEEP] if anchor else []
    dists = {nm: optuna.distributions.CategoricalDistribution(keep + [int(d) for d in devs[c]])
             for c, nm in enumerate(names)}
    if not study.trials:
        if anchor:
            study.enqueue_trial({nm: KEEP for nm in names})
        # seeds, coarsened: each chunk takes the device most of its compute time sits on
        seen = set()
        # a group's weight is its time on the fastest device it may use (a device it
        # may not use must not count as free)
        tt = np.where(problem.allowed, problem.group_time, np.inf).min(axis=1) + 1e-9
        for _, _, a in seeds_:
            params = {}
            for c, nm in enumerate(names):
                m = chunk == c
                votes = np.bincount(a[m], weights=tt[m], minlength=problem.n_devices)[devs[c]]
                params[nm] = int(devs[c][int(np.argmax(votes))])
            key = tuple(params.values())
            if key not in seen:
                seen.add(key)
                study.enqueue_trial(params)

    told = 0
    while not tracker.done():
        n = min(batch, tracker.remaining_evals())
        trials = []
        for _ in range(n):  # asking is slow with many variables: mind the clock
            if trials and tracker.done():
                break
            trials.append(study.ask(dists))
        A = np.stack([assignment(t.params) for t in trials])
        try:
            r = tracker.evaluate(A)
        except BudgetExhausted:  # time ran out between ask and tell: leave no trial running
            for t in trials:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            break
        objs = objective(r.step_time_us, r.feasible, r.peak_memory_bytes, cap, tracker.best_feasible_us)
        for i, t in enumerate(trials):
            if i < len(objs) and np.isfinite(objs[i]):
                study.tell(t, float(objs[i]))
            else:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            told += 1
    meta["trials"] = told
    return meta
