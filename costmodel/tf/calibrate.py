"""Calibrate the cost model on real devices: op profiles, transfer fits, step overhead.

:func:`calibrate` measures, for a set of traced graphs and a :class:`ClusterSpec`:

- per device kind, every graph run all on the first device of that kind, FULL_TRACE,
  per-op medians over ``trace_steps`` steps; ops that never show up in the trace did not
  run in the step and are recorded as 0 µs;
- per ordered device pair, transfers of 1 KB..64 MB (a variable read on the source, an
  ``Identity`` on the destination), minus the same step with no transfer, median of
  ``reps``; fitted to ``latency + bytes / bandwidth``;
- the per-op dispatch cost: (step - overhead - sum of traced op times) / ops, median over
  graphs, added to every profiled op time;
- the fixed cost of a step that touches 1..D devices (NoOps only): client -> master ->
  worker RPCs that the simulator does not see; :func:`placetool.costmodel.calibration.Profile.step_overhead`
  adds it to predictions;
- per-op-type fits from all the medians;
- designed split placements of each graph, measured repeatedly and interleaved, to
  which the device-side transfer costs are fitted (see :func:`calibrate`); under
  ``links.send`` "workers" with ``worker_costs="traces"``, traced instead, and the costs
  identified from the traces.

It returns the :class:`~placetool.costmodel.calibration.Profile` and the calibrated
:class:`~placetool.costmodel.cluster.Cluster` (links from the fits, roofline fields from the
all-ops fit, ``metadata.tf_devices`` naming each device's TF device).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict

import numpy as np

from placetool.costmodel.calibration import (UNMEASURED_BANDWIDTH, Profile, StepSample, count_latency, fit_link,
                                             fit_transfer_costs, with_transfer_params)
from placetool.costmodel.cluster import Cluster
from placetool.costmodel.graph import KIND_BITS
from placetool.costmodel.workers import WORKER_COSTS

from .runner import measure, measure_interleaved
from .session import import_tf, onednn_setting, session_config
from .testbed import ClusterSpec

DEFAULT_SIZES = tuple(1024 * 4 ** k for k in range(9))  # 1 KB .. 64 MB


def cost_names(link_send: str) -> tuple[str, str]:
    """What a cluster's per-message send and receive costs are under ``link_send``: the
    run queue's RecvTensor handler and arrival, or a plain send and receive."""
    return ("handler", "arrival") if link_send == "workers" else ("send", "receive")


def device_names(spec: ClusterSpec) -> list[str]:
    """placetool names for the spec's devices: ``cpu:0``, ``cpu:1``, ``gpu:0``... per kind."""
    count: dict[str, int] = {}
    out = []
    for k in spec.kinds:
        out.append(f"{k}:{count.get(k, 0)}")
        count[k] = count.get(k, 0) + 1
    return out


def single_device_placement(graph, spec: ClusterSpec, d: int) -> np.ndarray:
    """Every op on device ``d``; ops without a kernel for its kind (and their whole group)
    go to the first device of a kind they allow."""
    bits = np.array([KIND_BITS[k] for k in spec.kinds], np.uint8)
    ga = np.full(graph.n_groups, d, np.int32)
    for gid in np.flatnonzero((graph.group_allowed & bits[d]) == 0):
        ok = np.flatnonzero(graph.group_allowed[gid] & bits)
        if not ok.size:
            raise ValueError(f"group {gid} of graph {graph.name!r} runs on none of the devices")
        ga[gid] = ok[0]
    return graph.to_placement(ga)


def profile_ops(traced, spec: ClusterSpec, d: int, warmup: int = 2, trace_steps: int = 5,
                timeout_s: float = 300.0) -> tuple[dict[str, float], float]:
    """Per-op medians (µs) of ``traced`` run all on device ``d``, and its median step (µs)."""
    g = traced.graph
    p = single_device_placement(g, spec, d)
    m = measure(traced, p, spec, warmup=warmup, steps=3, trace_steps=trace_steps, timeout_s=timeout_s)
    on_d = {g.names[i] for i in np.flatnonzero(p == d)}
    medians = {name: m.op_us.get(name, 0.0) for name in on_d}
    return medians, m.step_us


def _time(sess, ops, reps: int) -> float:
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        sess.run(ops)
        times.append((time.perf_counter() - s) * 1e6)
    return float(statistics.median(times))


def time_transfers(spec: ClusterSpec, a: int, b: int, sizes=DEFAULT_SIZES, reps: int = 9,
                   counts=(2, 8, 32), timeout_s: float = 120.0) -> tuple[list, list]:
    """Timed transfers from device ``a`` to ``b``: (bytes, µs) for one tensor of each size,
    and (hops, µs) for a chain of ``hops`` dependent 1 KB transfers a -> b -> a -> ...

    Each figure is the median step with the transfer(s) minus the median step that runs
    the same ops on both devices without sending anything, interleaved so that drifting
    load on the machine hits both alike.
    """
    tf = import_tf()
    tf1 = tf.compat.v1
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    da, db = spec.tf_devices[a], spec.tf_devices[b]
    g = tf.Graph()
    by_size, by_count = [], []
    with g.as_default():
        with tf1.device(db):
            noop_b = tf.no_op(name="noop_b")
        for s in sizes:
            n = max(int(s) // 4, 1)
            with tf1.device(da):
                v = tf1.get_variable(f"v{s}", shape=[n], dtype=tf.float32,
                                     initializer=tf1.zeros_initializer(), use_resource=True)
                r = v.read_value()
                local = tf.identity(r, name=f"local{s}")
            with tf1.device(db):
                remote = tf.identity(r, name=f"remote{s}")
            by_size.append((n * 4, [remote.op], [local.op, noop_b]))
        with tf1.device(da):
            small = tf1.get_variable("small", shape=[256], dtype=tf.float32,
                                     initializer=tf1.zeros_initializer(), use_resource=True)
        for k in counts:
            # a chain of k hops a -> b -> a -> ...: each hop waits for the one before, as
            # the transfers on a graph's critical path do
            with tf1.device(da):
                x = y = small.read_value()
            for j in range(k):
                with tf1.device(db if j % 2 == 0 else da):
                    x = tf.identity(x, name=f"c{k}_hop{j}")
                with tf1.device(da):
                    y = tf.identity(y, name=f"c{k}_local{j}")
            by_count.append((k, [x.op], [y.op, noop_b]))
        init = tf1.global_variables_initializer()

    def diff(sess, with_x, without, r):
        sess.run(with_x)
        sess.run(without)
        t_x, t_0 = [], []
        for _ in range(r):
            t_x.append(_time(sess, with_x, 1))
            t_0.append(_time(sess, without, 1))
        return max(statistics.median(t_x) - statistics.median(t_0), 0.0)

    with tf1.Session(spec.target, graph=g, config=session_config(timeout_s, 1, isolate=True)) as sess:
        sess.run(init)
        sizes_out = [(nb, diff(sess, x, base, max(3, reps if nb < 2 ** 24 else reps // 2)))
                     for nb, x, base in by_size]
        counts_out = [(k, diff(sess, x, base, reps)) for k, x, base in by_count]
    return sizes_out, counts_out


def step_overheads(spec: ClusterSpec, reps: int = 15, timeout_s: float = 60.0) -> list[float]:
    """Median µs of a step of NoOps on devices 0..k-1, for k = 1..D."""
    tf = import_tf()
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        noops = []
        for k, d in enumerate(spec.tf_devices):
            with tf1.device(d):
                noops.append(tf.no_op(name=f"noop{k}"))
    out = []
    with tf1.Session(spec.target, graph=g, config=session_config(timeout_s, 1, isolate=True)) as sess:
        for k in range(1, len(noops) + 1):
            sess.run(noops[:k])
            out.append(_time(sess, noops[:k], reps))
    return out


def calibrate(traced_list, spec: ClusterSpec, sizes=DEFAULT_SIZES, trace_steps: int = 5,
              reps: int = 9, memory_bytes: dict | None = None, name: str = "calibrated",
              log=print, timeout_s: float = 300.0, split_steps: int = 3, rounds: int = 3,
              max_noise_pct: float = 10.0, link_queue: str = "auto", link_send: str = "auto",
              fit_inputs: dict | None = None, worker_costs: str = "steps") -> tuple[Profile, Cluster]:
    """Measure everything and return (profile, cluster); see the module docstring.

    ``link_queue``: the cluster's ``links.queue``; ``auto`` is ``none`` for TF worker
    processes (gRPC serves their transfers side by side: traced steps, docs/explain.md)
    and ``fifo`` for this process's own devices (a GPU's copy engine serves one copy at a
    time per direction). ``link_send``: the cluster's ``links.send``; ``auto`` is
    ``workers`` for TF worker processes (each worker's one compute thread and its run
    queue, :mod:`placetool.costmodel.workers`: its predictions of split steps are closer
    to the measured than ``idle``'s on 7 of 9 graph-runs, benchmarks/README.md) and
    ``eager`` in this process, where a tensor is handed over when produced. ``fit_inputs``, a dict, receives what the
    transfer fit was made from (``samples``, the ``cluster`` before it, ``kinds``), so the
    same measured steps can be fitted again under another rule.

    ``split_steps`` > 0 (and more than one device): per graph, the designed split
    placements (:func:`designed_splits`) are measured too, ``rounds`` times interleaved,
    ``split_steps`` steps each, and the transfer costs are fitted to those whole steps
    (:func:`~placetool.costmodel.calibration.fit_transfer_costs`): the link latency and,
    per device, the send/receive time per message and per byte. ``profile.meta
    ["transfer_fit"]`` holds the fit, its error on the placements held out of it and the
    noise floor; ``profile.meta["noisy"]`` a warning when that floor exceeds ``max_noise_pct``.
    Under ``link_send`` "workers" the run queue's costs (handler, arrival, µs per byte at
    each end, link latency; the request cost stays the one in
    :data:`~placetool.costmodel.workers.TESTBED_COSTS`) are fitted to those steps the same
    way (``worker_costs="steps"``: in two live sessions its predictions were the closest,
    benchmarks/README.md), or identified from
    ``split_steps`` traced steps of each design instead (``"traces"``:
    :func:`identify_worker_costs`, recorded in ``profile.meta["worker_fit"]``).
    """
    if worker_costs not in WORKER_COSTS:
        raise ValueError(f"worker_costs is one of {', '.join(WORKER_COSTS)}, not {worker_costs!r}")
    tf = import_tf()
    names = device_names(spec)
    D = len(names)
    profile = Profile(
        devices=[{"name": n, "kind": k, "tf": t} for n, k, t in zip(names, spec.kinds, spec.tf_devices)],
        host=platform.node(), tf_version=tf.__version__,
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        meta={"graphs": {}, "cluster_spec": spec.cluster_def(), "trace_steps": trace_steps,
              "onednn": onednn_setting()},
    )
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    log("step overhead (NoOps on 1..D devices) ...")
    profile.step_overhead_us = step_overheads(spec)
    log("  " + ", ".join(f"{k + 1} dev: {v:,.0f} µs" for k, v in enumerate(profile.step_overhead_us)))

    _profile_graphs(traced_list, spec, names, profile, trace_steps, timeout_s, log)
    lat, bw = _time_links(spec, names, profile, sizes, reps, timeout_s, log)
    if link_queue == "auto":
        link_queue = "none" if spec.workers else "fifo"
    if link_send == "auto":
        link_send = "workers" if spec.workers else "eager"
    cluster = _cluster(name, names, spec, profile, lat, bw, memory_bytes or {}, link_queue, link_send)
    if split_steps > 0 and D > 1:
        cluster = _fit_transfers(traced_list, spec, profile, cluster, split_steps, rounds, timeout_s,
                                 max_noise_pct, fit_inputs, log, worker_costs)
    profile.cluster_dict = cluster.to_dict()
    return profile, cluster


def _profile_graphs(traced_list, spec: ClusterSpec, names, profile: Profile, trace_steps, timeout_s, log):
    """Profile each graph's ops on the first device of each kind into ``profile``, then
    refit it and set its per-op dispatch cost of each kind."""
    first_of_kind = {}
    for d, k in enumerate(spec.kinds):
        first_of_kind.setdefault(k, d)
    for t in traced_list:
        g = t.graph
        for kind, d in first_of_kind.items():
            log(f"profiling {g.name} ({g.n_ops} ops) on {names[d]} ...")
            medians, step = profile_ops(t, spec, d, trace_steps=trace_steps, timeout_s=timeout_s)
            profile.add_op_medians(kind, g, medians)
            unseen = sum(1 for v in medians.values() if v == 0.0)
            profile.meta["graphs"].setdefault(g.name, {})[kind] = {
                "step_us": step, "sum_op_us": float(sum(medians.values())), "ops": len(medians),
                "unseen_ops": unseen,
            }
            log(f"  step {step:,.0f} µs, sum of op medians {sum(medians.values()):,.0f} µs, "
                f"{len(medians)} ops ({unseen} not in the trace)")
    profile.refit()
    # What a step costs beyond its traced ops and the fixed step overhead, per op: the
    # executor's scheduling between ops, which FULL_TRACE durations do not include.
    for kind in first_of_kind:
        gaps = [max(0.0, (v[kind]["step_us"] - profile.step_overhead(1) - v[kind]["sum_op_us"]) / v[kind]["ops"])
                for v in profile.meta["graphs"].values() if kind in v and v[kind]["ops"]]
        if gaps:
            profile.dispatch_us[kind] = float(np.median(gaps))
            log(f"per-op dispatch cost on {kind}: {profile.dispatch_us[kind]:,.1f} µs")


def _time_links(spec: ClusterSpec, names, profile: Profile, sizes, reps, timeout_s, log):
    """Time transfers on every ordered pair of devices into ``profile.links``: the
    (latency, bandwidth) matrices fitted to them."""
    D = len(names)
    lat = np.zeros((D, D))
    bw = np.full((D, D), np.inf)
    for a in range(D):
        for b in range(D):
            if a == b:
                continue
            log(f"timing transfers {names[a]} -> {names[b]} ({len(sizes)} sizes) ...")
            samples, counts = time_transfers(spec, a, b, sizes, reps=reps, timeout_s=timeout_s)
            lat[a, b], bw[a, b] = fit_link([s for s, _ in samples], [t for _, t in samples])
            if len(counts) >= 2:
                # the cost of one more hop on a dependent chain of small transfers: what
                # the simulator charges per transfer (the 1-tensor figures are noisier)
                lat[a, b] = count_latency([k for k, _ in counts], [t for _, t in counts])
            profile.links.append({"src": names[a], "dst": names[b], "latency_us": float(lat[a, b]),
                                  "bandwidth_bytes_per_us": float(bw[a, b]),
                                  "samples": [[int(s), float(t)] for s, t in samples],
                                  "chain_samples": [[int(k), float(t)] for k, t in counts]})
            log(f"  latency {lat[a, b]:,.1f} µs, bandwidth {bw[a, b]:,.0f} bytes/µs")
            if bw[a, b] >= UNMEASURED_BANDWIDTH:
                log(f"  note: transfers up to {max(sizes):,} bytes took no longer than small ones (timing "
                    f"noise is larger than the size effect), so the link is taken to cost no time per "
                    f"byte: time larger transfers (--max-transfer) for a bandwidth")
    return lat, bw


def _fit_transfers(traced_list, spec: ClusterSpec, profile: Profile, cluster: Cluster, split_steps, rounds,
                   timeout_s, max_noise_pct, fit_inputs, log, worker_costs="steps") -> Cluster:
    """Measure the designed split placements of each graph and fit the transfer costs to
    those steps: ``cluster`` with the fitted transfer parameters (``profile`` records the
    fit; ``fit_inputs``, if a dict, what it was made from)."""
    # the designs split work between two devices: their kinds' costs are what they measure
    kinds = tuple(sorted({spec.kinds[d] for d in split_pair(spec)}))
    samples = []
    for t in traced_list:
        designs = designed_splits(t.graph, spec)
        log(f"measuring {len(designs)} designed split placements of {t.graph.name}, "
            f"{rounds} interleaved rounds of {split_steps} steps ...")
        reps = measure_interleaved(t, [p for _, p, _ in designs], spec, rounds=rounds, steps=split_steps,
                                   warmup=2, timeout_s=timeout_s)
        for (label, p, held), m in zip(designs, reps):
            samples.append(StepSample(t.graph, p, m.step_us, m.spread_pct, label, held))
    _anchor_op_times(traced_list, samples, profile, cluster, kinds, log)
    if fit_inputs is not None:
        fit_inputs.update(samples=samples, cluster=cluster, kinds=kinds)
    if cluster.link_send == "workers":
        if worker_costs == "traces":
            return _worker_costs(traced_list, spec, profile, cluster, samples, split_steps, timeout_s,
                                 max_noise_pct, log)
        from placetool.costmodel.workers import with_worker_costs

        cluster = with_worker_costs(cluster)  # the run queue, started from the testbed's costs
    log(f"fitting transfer costs to {sum(not s.held_out for s in samples)} steps "
        f"({sum(s.held_out for s in samples)} held out) ...")
    fit = fit_transfer_costs(samples, cluster, profile, kinds=kinds)
    summ = fit.summary()
    cluster = with_transfer_params(cluster, fit.params, kinds)
    for link in profile.links:
        link["latency_measured_us"] = link["latency_us"]
        link["latency_us"] = fit.params["latency_us"]
        link["latency_source"] = f"fitted to {len(samples)} split-placement steps"
    profile.meta["transfer_fit"] = summ
    p_ = fit.params
    send, recv = cost_names(cluster.link_send)
    log(f"transfer costs ({', '.join(kinds)} devices, links.send {cluster.link_send}): {send} {p_['send_us']:,.1f} "
        f"µs + {p_['send_us_per_byte'] * 1e6:,.1f} µs/MB, {recv} {p_['recv_us']:,.1f} µs + "
        f"{p_['recv_us_per_byte'] * 1e6:,.1f} µs/MB, link latency {p_['latency_us']:,.1f} µs")
    log(f"  fit: median |error| {_pct(summ['fit']['median_abs_error_pct'])} (max "
        f"{_pct(summ['fit']['max_abs_error_pct'])}) on {summ['fit']['n']} placements; held out: "
        f"{_pct(summ['held_out']['median_abs_error_pct'])} (max {_pct(summ['held_out']['max_abs_error_pct'])}) "
        f"on {summ['held_out']['n']}; noise floor ±{fit.noise_floor_pct:.1f}%")
    log(f"  per-transfer step cost: {fit.per_transfer_note}")
    _warn_noisy(profile, fit.noise_floor_pct, len(samples), max_noise_pct, log)
    return cluster


def _warn_noisy(profile, floor_pct, n, max_noise_pct, log) -> None:
    if floor_pct > max_noise_pct:
        msg = (f"the machine is too noisy to calibrate: repeated runs of one placement spread by "
               f"±{floor_pct:.1f}% (median over {n} placements), more than "
               f"--max-noise {max_noise_pct:g}%; close other jobs and run again")
        profile.meta["noisy"] = msg
        log("WARNING: " + msg)


def _worker_costs(traced_list, spec, profile, cluster, samples, split_steps, timeout_s, max_noise_pct,
                  log) -> Cluster:
    """``links.send`` "workers": the per-message costs identified from traced steps of the
    designed splits, this session's (:func:`identify_worker_costs`), on the lone transfers'
    links; ``profile.meta["worker_fit"]`` records the fit, and how far the costs predict the
    measured (untraced) designs from the profile's op times."""
    from placetool.costmodel import CostModel
    from placetool.costmodel.workers import with_worker_costs

    found = identify_worker_costs(traced_list, spec, cluster, profile, steps=split_steps, timeout_s=timeout_s, log=log)
    fit, inflation = found["fit"], found["op_inflation"]
    cluster = with_worker_costs(cluster, found["costs"])
    summ = {**fit.summary(), "replay_costs": asdict(fit.costs), "costs": asdict(found["costs"]),
            "message_inflation": found["inflation"]}
    models = {t.graph.name: CostModel(t.graph, cluster, profile=profile) for t in traced_list}
    summ["steps"] = [{"graph": s.graph.name, "label": s.label, "measured_us": s.measured_us,
                      "predicted_us": float(models[s.graph.name].simulate(s.placement).step_time_us)
                      + profile.step_overhead(len(np.unique(s.placement)))} for s in samples]
    err = np.array([100.0 * (r["predicted_us"] - r["measured_us"]) / r["measured_us"] for r in summ["steps"]])
    floor = float(np.median([s.spread_pct for s in samples]))
    summ.update(op_inflation=inflation, noise_floor_pct=floor,
                predicted={"median_abs_error_pct": float(np.median(np.abs(err))),
                           "max_abs_error_pct": float(np.abs(err).max()), "n": int(len(err))})
    profile.meta["worker_fit"] = summ
    c, r, m = found["costs"], fit.costs, found["inflation"]
    log(f"worker costs (from {summ['n_steps']} traced split steps of this session): request {c.request_us:,.1f} "
        f"µs, handler {c.handler_us:,.1f} µs + {c.send_us_per_byte * 1e6:,.0f} µs/MB, arrival {c.arrive_us:,.1f} "
        f"µs + {c.recv_us_per_byte * 1e6:,.0f} µs/MB")
    log(f"  of which inside the traced ops (their time over the profile's, per message): send {m['send_us']:,.1f} "
        f"µs + {m['send_us_per_byte'] * 1e6:,.0f} µs/MB, receive {m['recv_us']:,.1f} µs + "
        f"{m['recv_us_per_byte'] * 1e6:,.0f} µs/MB; outside them (the replay's): handler {r.handler_us:,.1f}, "
        f"arrival {r.arrive_us:,.1f}, {r.send_us_per_byte * 1e6:,.0f} µs/MB on each end")
    log(f"  replayed with their traced op times: median |error| {summ['median_abs_error_pct']:.1f}% (max "
        f"{summ['max_abs_error_pct']:.1f}%); traced ops ran {inflation:.2f}x their profiled times; predicted "
        f"from the profile, the measured designs: median |error| {summ['predicted']['median_abs_error_pct']:.1f}% "
        f"(max {summ['predicted']['max_abs_error_pct']:.1f}%); noise floor ±{floor:.1f}%")
    _warn_noisy(profile, floor, len(samples), max_noise_pct, log)
    return cluster


def identify_worker_costs(traced_list, spec: ClusterSpec, cluster: Cluster, profile: Profile | None = None,
                          steps: int = 2, timeout_s: float = 300.0, log=print) -> dict:
    """Trace ``steps`` steps of each graph's designed split placements on ``spec`` and
    identify the run queue's per-message costs from them, on ``cluster``'s links (which
    should be the lone transfers'). Returns a dict:

    - ``fit``: :func:`placetool.costmodel.workers_fit.fit_worker_costs`'s
      :class:`~placetool.costmodel.workers_fit.WorkerFit`, the costs that replay the traced
      steps on their own op times;
    - with ``profile``: ``inflation``, the CPU per message that those op times hold
      against the profile's (:func:`~placetool.costmodel.workers_fit.message_inflation`);
      ``costs``, both together, what a prediction on the profile's op times takes; and
      ``op_inflation``, the traced ops' time over the profile's (time-weighted);
    - without: ``costs`` the replay's, ``inflation`` None, ``op_inflation`` NaN;
    - ``steps``: the traced steps, one list per graph (to identify again, pooled with others).
    """
    from placetool.costmodel import timeline
    from placetool.costmodel.workers_fit import steps_of

    from .trace_capture import capture

    traced_steps = []
    for t in traced_list:
        g = t.graph
        designs = [(label, p) for label, p, _ in designed_splits(g, spec) if not label.startswith("single:")]
        log(f"tracing {steps} steps of each of {len(designs)} split placements of {g.name} ...")
        mine = []
        for label, p in designs:
            rec = timeline.load(capture(t, p, spec, steps=steps, warmup=2, single_device=None, timeout_s=timeout_s), g)
            mine += steps_of(rec, label=f"{g.name} {label}")
        traced_steps.append(mine)
    log(f"identifying the per-message costs from {sum(map(len, traced_steps))} traced steps ...")
    return worker_costs_from_steps(traced_steps, cluster, profile)


def worker_costs_from_steps(traced_steps, cluster: Cluster, profile=None) -> dict:
    """The run queue's per-message costs identified from traced steps, on ``cluster``'s
    links: ``traced_steps`` is one list of
    :class:`~placetool.costmodel.workers_fit.ReplayStep` per graph; ``profile`` one
    :class:`~placetool.costmodel.calibration.Profile` with every graph's op times, or a
    list of one per graph (each calibrated apart). Returns :func:`identify_worker_costs`'s
    dict."""
    from placetool.costmodel import CostModel
    from placetool.costmodel.workers_fit import fit_worker_costs, message_inflation, op_inflation, with_inflation

    profiles = list(profile) if isinstance(profile, (list, tuple)) else [profile] * len(traced_steps)
    if len(profiles) != len(traced_steps):
        raise ValueError(f"{len(profiles)} profiles for {len(traced_steps)} graphs' traced steps")
    rsteps = [s for mine in traced_steps for s in mine]
    fit = fit_worker_costs(rsteps, cluster.latency_us, cluster.bandwidth_bytes_per_us)
    if profile is None:
        return {"fit": fit, "costs": fit.costs, "inflation": None, "op_inflation": float("nan"),
                "steps": traced_steps}
    profiled, weighted = [], []
    for mine, prof in ((m, p) for m, p in zip(traced_steps, profiles) if m):
        cm = CostModel(mine[0].graph, cluster, profile=prof)
        base = np.maximum(cm.T - prof.dispatch_per_device(cluster)[None, :], 0.0)
        profiled += [base[np.arange(cm.graph.n_ops), s.placement] for s in mine]
        weighted.append((op_inflation(mine, base), len(mine)))
    infl = message_inflation(rsteps, profiled, cluster.n_devices)
    return {"fit": fit, "costs": with_inflation(fit.costs, infl), "inflation": infl,
            "op_inflation": float(np.average([x for x, _ in weighted], weights=[n for _, n in weighted])),
            "steps": traced_steps}


#: op times are rescaled only when the single-device steps measured among the designs
#: differ from their prediction by more than this (%)
ANCHOR_MIN_PCT = 2.0


def scale_op_times(profile, graph_name: str, kinds, factor: float) -> float:
    """Multiply ``graph_name``'s profiled op times on each of ``kinds`` by ``factor``,
    unless it is not a finite positive number or lies within :data:`ANCHOR_MIN_PCT` of 1.
    Returns the factor applied (1.0 when none was)."""
    factor = float(factor)
    if not np.isfinite(factor) or factor <= 0 or abs(factor - 1) * 100 <= ANCHOR_MIN_PCT:
        return 1.0
    for kind in kinds:
        profile.scale_ops(kind, graph_name, factor)
    return factor


def one_device_ratio(graph, profile, cluster, steps) -> float:
    """Median over ``steps`` ((per-op placement on one device, measured step µs) pairs) of
    the measured step, less the one-device step overhead, over its prediction from
    ``profile`` on ``cluster``: the factor that anchors the profiled op times to them
    (NaN without steps)."""
    from placetool.costmodel import CostModel

    if not steps:
        return float("nan")
    cm = CostModel(graph, cluster, profile=profile)
    over = profile.step_overhead(1)
    return float(np.median([(measured - over) / cm.simulate(np.ascontiguousarray(p, np.int32)).step_time_us
                            for p, measured in steps]))


def _anchor_op_times(traced_list, samples, profile, cluster, kinds, log) -> None:
    """Scale each graph's profiled op times so that its one-device step, predicted, is
    the one-device step measured among the designed splits (untraced, interleaved with
    them): traced op durations carry the tracer's cost, and the profile's steps ran
    before the workers settled (towers: profiled at 91 ms, measured at 82 ms later in
    the same run). The op times keep their proportions; ``profile.meta["graphs"][name]
    ["op_time_scale"]`` records the factor."""
    for t in traced_list:
        g = t.graph
        one = [(s.placement, s.measured_us) for s in samples if s.graph is g and s.label.startswith("single:")]
        if not one:
            continue
        factor = scale_op_times(profile, g.name, kinds, one_device_ratio(g, profile, cluster, one))
        if factor == 1.0:
            continue
        profile.meta["graphs"].setdefault(g.name, {})["op_time_scale"] = factor
        log(f"  {g.name}: op times scaled by {factor:.3f} to the one-device steps measured among the designs")


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def split_pair(spec: ClusterSpec) -> list[int]:
    """The two devices the designed splits use: the first two of the first device's kind
    (else the first two devices)."""
    D = len(spec.kinds)
    pair = [d for d in range(D) if spec.kinds[d] == spec.kinds[0]][:2]
    return pair if len(pair) == 2 else [0, 1 % D]


def designed_splits(graph, spec: ClusterSpec, seed: int = 12345) -> list[tuple[str, np.ndarray, bool]]:
    """Split placements that tell the transfer costs apart: [(label, per-op placement, held out)].

    Between two devices a and b of the same kind, in both directions: every op on one
    device; a cut in topological order (few transfers); blocks of 16 and of 1 group
    alternating (more, then many transfers); half of the groups with small outputs moved
    (many small tensors) and the fifth with the largest (fewer, large ones); random
    splits of 10% and 35% of the groups. Every third design is held out of the fit.
    """
    bits = np.array([KIND_BITS[k] for k in spec.kinds], np.uint8)
    pair = split_pair(spec)
    G = graph.n_groups
    first = np.array([int(np.min(graph.topo_rank[ops])) for ops in graph.group_ops])
    pos = np.empty(G, np.int64)
    pos[np.argsort(first, kind="stable")] = np.arange(G)
    gbytes = np.array([int(graph.out_bytes[ops].sum()) for ops in graph.group_ops], np.int64)
    ok = (graph.group_allowed[:, None] & bits[None, :]) != 0
    rng = np.random.default_rng(seed)
    moving = {
        "cut": pos >= G // 2,
        "blocks16": (pos // 16) % 2 == 1,
        "alternate": pos % 2 == 1,
        "small-tensors": (gbytes <= np.quantile(gbytes, 0.5)) & (rng.random(G) < 0.5),
        "large-tensors": gbytes >= np.quantile(gbytes, 0.8),
        "random10": rng.random(G) < 0.10,
        "random35": rng.random(G) < 0.35,
    }
    out, seen = [], set()

    def add(label, a):
        a = np.where(ok[np.arange(G), a], a, np.argmax(ok, axis=1)).astype(np.int32)
        p = graph.to_placement(a)
        if p.tobytes() not in seen:
            seen.add(p.tobytes())
            out.append((label, p))

    for base, other in ((pair[0], pair[1]), (pair[1], pair[0])):
        add(f"single:{base}", np.full(G, base, np.int32))
        for label, m in moving.items():
            add(f"{label}:{base}->{other}", np.where(m, other, base))
    return [(label, p, i % 3 == 2) for i, (label, p) in enumerate(out)]


def _cluster(name, names, spec, profile, lat, bw, memory_bytes, link_queue="fifo", link_send="eager") -> Cluster:
    D = len(names)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 16 * 2 ** 30
    n_cpu = max(1, sum(1 for k in spec.kinds if k == "cpu"))
    devices = []
    for d, (n, k) in enumerate(zip(names, spec.kinds)):
        f = profile.fits.get(k, {}).get("*")
        dev = {"name": n, "kind": k, "cost_source": "profile",
               "memory_bytes": int(memory_bytes.get(k, ram // n_cpu if k == "cpu" else 16 * 2 ** 30))}
        if f is not None:
            # the all-ops fit as a roofline: only used for ops the profile cannot cover
            if f.us_per_flop > 0:
                dev["peak_flops_per_us"] = 1.0 / f.us_per_flop
            if f.us_per_byte > 0:
                dev["memory_bandwidth_bytes_per_us"] = 1.0 / f.us_per_byte
            dev["launch_overhead_us"] = max(f.intercept_us, 0.0)
        devices.append(dev)
    off = ~np.eye(D, dtype=bool)
    pairs = [{"src": names[a], "dst": names[b], "latency_us": float(lat[a, b]),
              "bandwidth_bytes_per_us": float(bw[a, b])}
             for a in range(D) for b in range(D) if a != b]
    d = {
        "name": name,
        "metadata": {
            "source": f"measured by placetool calibrate on {profile.host} ({profile.date})",
            "tf_devices": list(spec.tf_devices),
            "step_overhead_us": list(profile.step_overhead_us),
        },
        "devices": devices,
        "links": {"default": {"latency_us": float(np.median(lat[off])) if D > 1 else 0.0,
                              "bandwidth_bytes_per_us": float(np.median(bw[off])) if D > 1 else 1e6},
                  "queue": link_queue, "send": link_send},
    }
    if pairs:
        d["links"]["pairs"] = pairs
    return Cluster.from_dict(d, source="calibration")
