"""Trace export: Chrome trace-event JSON (Perfetto, chrome://tracing) and Gantt figures.

Both take a simulated :class:`~placetool.costmodel.simulate.Trace` (start/end of every op
and transfer) with its graph and cluster.

Chrome trace layout: one process per device (pid 1..D, named ``gpu:0 (gpu)`` by metadata
events) with a thread of ops and a ``memory`` counter track, then one process per used
link (``gpu:0 -> gpu:1``). Op slices carry op type, FLOPs, output/parameter bytes, group
and layer in ``args``; transfer slices carry bytes, tensor and consumers; a flow arrow
runs from each transfer to each op that consumes it on the destination device. pid 0 and
tid 0 are avoided: Perfetto treats them as the swapper/idle process.

The memory track follows the simulator's rules (docs/simulator.md): parameters
always; an op's outputs from its start until its last local consumer has finished and its
transfers are done (its end if nothing needs them); a received copy from the start of its
transfer until its last consumer there has finished. Its maximum is the result's peak.

Other task kinds on device rows (e.g. send/receive work a device does for a transfer) are
drawn if the trace has ``device_tasks()``: an iterable of (device, start, end, kind, name).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import UserError

FORMATS = ("png", "pdf", "svg")
TOP_TYPES = 9  # op types with their own colour in a Gantt; the rest are "other"
MAX_LINK_ROWS = 12


# ------------------------------------------------------------------ shared helpers
def time_unit(us: float) -> tuple[float, str]:
    """(divisor, unit) that shows ``us`` as a readable number: µs, ms or s."""
    if us >= 1e6:
        return 1e6, "s"
    if us >= 1e3:
        return 1e3, "ms"
    return 1.0, "µs"


def figure_format(path, fmt: str | None = None) -> str:
    """The image format to write: ``fmt``, else the file's suffix; a mismatch is a UserError."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if fmt is None:
        if suffix not in FORMATS:
            raise UserError(f"{path}: cannot tell the figure format from the suffix; use .png, .pdf or .svg "
                            "(or --format)")
        return suffix
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if suffix in FORMATS and suffix != fmt:
        raise UserError(f"{path}: the suffix says {suffix} but --format is {fmt}")
    return fmt


def _used_links(trace) -> list[tuple[int, int]]:
    return sorted({(int(s), int(d)) for s, d in zip(trace.x_src, trace.x_dst)})


def _device_tasks(trace, graph):
    """The send and receive tasks that ran on devices: (device, start, end, kind, name)."""
    out = []
    for kind, x, dev, t0, t1 in trace.tasks():
        t = int(trace.x_tensor[x])
        out.append((dev, t0, t1, kind, f"{kind} {graph.names[graph.tensor_op[t]]}:{int(graph.tensor_output_index[t])}"))
    return out


def lifetimes(trace, graph, n_devices: int):
    """When each op's outputs and each received copy are freed (µs), by the simulator's
    rules: (per op, per transfer of the trace).

    An op's outputs live from its start until its last local consumer ends and every
    transfer of them is done (its end if nothing needs them); a received copy from the
    start of its transfer until its last consumer there ends.
    """
    p = np.asarray(trace.placement, np.int64)
    end = np.asarray(trace.op_end)
    src_t = np.asarray(graph.edge_tensor)
    data = src_t >= 0
    e_dst, e_t = graph.edge_dst[data].astype(np.int64), src_t[data]
    prod = graph.tensor_op[e_t].astype(np.int64)
    free_out = end.copy()
    local = p[prod] == p[e_dst]
    np.maximum.at(free_out, prod[local], end[e_dst[local]])
    xt = np.asarray(trace.x_tensor, np.int64)
    xd = np.asarray(trace.x_dst, np.int64)
    if len(xt):
        np.maximum.at(free_out, graph.tensor_op[xt].astype(np.int64), np.asarray(trace.x_end))
    D = max(n_devices, 1)
    free_copy = np.asarray(trace.x_start, dtype=np.float64).copy()
    if len(xt):
        keys = xt * D + xd
        order = np.argsort(keys, kind="stable")
        rk = e_t[~local].astype(np.int64) * D + p[e_dst[~local]]
        pos = np.searchsorted(keys[order], rk)
        pos = np.minimum(pos, len(order) - 1)
        hit = keys[order][pos] == rk
        np.maximum.at(free_copy, order[pos[hit]], end[e_dst[~local][hit]])
    return free_out, free_copy


def _memory_events(trace, graph, free_out, free_copy):
    """(times, devices, byte deltas) of every allocation and free."""
    p = np.asarray(trace.placement, np.int64)
    xt = np.asarray(trace.x_tensor, np.int64)
    times = [np.asarray(trace.op_start), free_out]
    devs = [p, p]
    deltas = [graph.out_bytes.astype(np.float64), -graph.out_bytes.astype(np.float64)]
    if len(xt):
        xb = graph.tensor_bytes[xt].astype(np.float64)
        times += [np.asarray(trace.x_start), free_copy]
        devs += [np.asarray(trace.x_dst, np.int64)] * 2
        deltas += [xb, -xb]
    return np.concatenate(times), np.concatenate(devs), np.concatenate(deltas)


def _steps(t, v, base):
    """A step function from events: frees before allocations at one instant, as in the
    simulator (events, then dispatch); (times, level after each time)."""
    order = np.lexsort((v > 0, t))
    t, v = t[order], v[order]
    level = base + np.cumsum(v)
    last = np.r_[t[1:] != t[:-1], True] if len(t) else np.zeros(0, bool)
    return np.r_[0.0, t[last]], np.r_[base, level[last]].astype(np.int64)


def memory_timeline(trace, graph, n_devices: int):
    """Per device, (times µs, bytes in use after all events at that time) — a step function.

    Starts at each device's parameter bytes at time 0.
    """
    free_out, free_copy = lifetimes(trace, graph, n_devices)
    t_all, d_all, v_all = _memory_events(trace, graph, free_out, free_copy)
    p = np.asarray(trace.placement, np.int64)
    params = np.bincount(p, weights=graph.param_bytes.astype(np.float64), minlength=n_devices)
    return [_steps(t_all[d_all == d], v_all[d_all == d], params[d]) for d in range(n_devices)]


def peak_residents(trace, graph, n_devices: int):
    """Per device, what it holds at its memory peak: (time µs, ops whose outputs are live
    there, transfers whose copies are live there), by :func:`lifetimes`.

    >>> from placetool.costmodel import CostModel, presets
    >>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
    >>> r = cm.simulate(cm.single_device(1), trace=True)
    >>> t, ops, copies = peak_residents(r.trace, cm.graph, 3)[1]
    >>> int(cm.graph.out_bytes[ops].sum() + cm.graph.param_bytes.sum()) == int(r.peak_memory_bytes[1])
    True
    """
    free_out, free_copy = lifetimes(trace, graph, n_devices)
    t_all, d_all, v_all = _memory_events(trace, graph, free_out, free_copy)
    p = np.asarray(trace.placement, np.int64)
    start, xs, xd = np.asarray(trace.op_start), np.asarray(trace.x_start), np.asarray(trace.x_dst)
    out = []
    for d in range(n_devices):
        m = d_all == d
        ts, level = _steps(t_all[m], v_all[m], 0.0)
        t = float(ts[int(np.argmax(level))])
        out.append((t, np.flatnonzero((p == d) & (start <= t) & (free_out > t)),
                    np.flatnonzero((xd == d) & (xs <= t) & (free_copy > t))))
    return out


# ------------------------------------------------------------------ Chrome trace
def _r(x) -> float:
    return round(float(x), 3)  # ns resolution: the trace is µs; more digits only make the file big


def chrome_trace(trace, graph, cluster) -> dict:
    """Chrome trace-event JSON of one simulated step (see the module docstring); times in µs,
    rounded to the nanosecond."""
    D = cluster.n_devices
    links = _used_links(trace)
    link_pid = {l: D + 1 + i for i, l in enumerate(links)}
    ev = []

    def meta(pid, name, sort):
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        ev.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": sort}})
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 1,
                   "args": {"name": "ops" if pid <= D else "transfers"}})

    for d, dev in enumerate(cluster.devices):
        meta(d + 1, f"{dev.name} ({dev.kind})", d + 1)
    for (s, d), pid in link_pid.items():
        meta(pid, f"{cluster.names[s]} -> {cluster.names[d]}", pid)
    p = np.asarray(trace.placement)
    for op in np.argsort(trace.op_start, kind="stable"):
        op = int(op)
        ev.append({
            "name": graph.names[op], "cat": graph.op_types[op], "ph": "X", "pid": int(p[op]) + 1, "tid": 1,
            "ts": _r(trace.op_start[op]), "dur": _r(trace.op_end[op] - trace.op_start[op]),
            "args": {"op_type": graph.op_types[op], "flops": float(graph.flops[op]),
                     "bytes": int(graph.out_bytes[op]), "param_bytes": int(graph.param_bytes[op]),
                     "group": int(graph.group[op]), "layer": int(graph.layer[op]), "op": op},
        })
    for dev, t0, t1, kind, name in _device_tasks(trace, graph):
        ev.append({"name": str(name), "cat": str(kind), "ph": "X", "pid": int(dev) + 1, "tid": 1,
                   "ts": _r(t0), "dur": _r(t1 - t0), "args": {"kind": str(kind)}})
    # consumers of each tensor on each device, for the flow arrows
    et = graph.edge_tensor
    data = et >= 0
    cons: dict[tuple[int, int], list[int]] = {}
    for t, c in zip(et[data].tolist(), graph.edge_dst[data].tolist()):
        cons.setdefault((t, int(p[c])), []).append(c)
    flow = 0
    for x in range(trace.n_transfers):
        t = int(trace.x_tensor[x])
        s, d = int(trace.x_src[x]), int(trace.x_dst[x])
        pid = link_pid[s, d]
        x0, x1 = _r(trace.x_start[x]), _r(trace.x_end[x])
        consumers = sorted(set(cons.get((t, d), [])))
        name = f"{graph.names[graph.tensor_op[t]]}:{int(graph.tensor_output_index[t])}"
        ev.append({"name": name, "cat": "transfer", "ph": "X", "pid": pid, "tid": 1, "ts": x0, "dur": _r(x1 - x0),
                   "args": {"bytes": int(graph.tensor_bytes[t]), "tensor": name,
                            "src": cluster.names[s], "dst": cluster.names[d],
                            "consumers": [graph.names[c] for c in consumers[:20]]}})
        for c in consumers:
            flow += 1
            ev.append({"name": "tensor", "cat": "transfer", "ph": "s", "id": flow, "pid": pid, "tid": 1,
                       "ts": x0})
            ev.append({"name": "tensor", "cat": "transfer", "ph": "f", "bp": "e", "id": flow,
                       "pid": int(p[c]) + 1, "tid": 1, "ts": _r(trace.op_start[c])})
    for d, (ts, level) in enumerate(memory_timeline(trace, graph, D)):
        for t, v in zip(ts.tolist(), level.tolist()):
            ev.append({"name": "memory", "ph": "C", "pid": d + 1, "ts": _r(t), "args": {"bytes": int(v)}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "metadata": {"graph": graph.name, "cluster": cluster.name, "time_unit": "us"}}


# ------------------------------------------------------------------ Gantt
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    # paper-ready files: TrueType in PDFs (venues reject Type 3 fonts), text kept as text in SVGs
    matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"})
    import matplotlib.pyplot as plt

    return plt


def type_colours(graph, trace, top: int = TOP_TYPES):
    """({op type: colour} for the ``top`` op types by total time, colour of "other")."""
    plt = _plt()
    dur = np.asarray(trace.op_end) - np.asarray(trace.op_start)
    total: dict[str, float] = {}
    for t, x in zip(graph.op_types, dur.tolist()):
        total[t] = total.get(t, 0.0) + x
    ranked = sorted(total, key=lambda t: -total[t])[:top]
    cmap = plt.get_cmap("tab10")
    palette = [cmap(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]  # tab10 without its grey: grey means "other"
    return {t: palette[i % len(palette)] for i, t in enumerate(ranked)}, (0.8, 0.8, 0.8, 1.0)


def gantt(trace, graph, cluster, path, title=None, lower_bound_us=None, fmt=None, dpi: int = 200,
          busy_us=None) -> None:
    """A Gantt chart: devices and links in separate panels, ops coloured by the top op types
    (legend; the rest "other"), ms/s ticks, utilisation per device and link, a lower-bound line.

    ``fmt``: png, pdf or svg (default: the suffix of ``path``); ``dpi`` applies to PNG.
    """
    fmt = figure_format(path, fmt)
    plt = _plt()
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    D = cluster.n_devices
    links = _used_links(trace)
    p = np.asarray(trace.placement)
    start, end = np.asarray(trace.op_start), np.asarray(trace.op_end)
    makespan = float(end.max()) if len(end) else 0.0
    span = max(makespan, float(np.max(trace.x_end)) if trace.n_transfers else 0.0, 1e-9)
    scale, unit = time_unit(span)
    colour, other = type_colours(graph, trace)
    n_used = len(links)
    n_link_rows = min(n_used, MAX_LINK_ROWS)  # more rows would drown the devices; keep the busiest
    if n_used > n_link_rows:
        busy_l = {l: float(np.sum((trace.x_end - trace.x_start)[(trace.x_src == l[0]) & (trace.x_dst == l[1])]))
                  for l in links}
        links = sorted(sorted(links, key=lambda l: -busy_l[l])[:n_link_rows])
    row_h = 0.32
    heights = [max(D, 1) * row_h + 0.4] + ([n_link_rows * row_h * 0.6 + 0.3] if links else [])
    fig_h = sum(heights) + 1.9
    fig, axes = plt.subplots(len(heights), 1, sharex=True, figsize=(11, fig_h), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "hspace": 0.08})
    axd = axes[0][0]
    tasks = _device_tasks(trace, graph)
    if busy_us is not None:
        busy = np.asarray(busy_us)
    else:  # ops plus the send and receive work a device does for transfers
        busy = np.bincount(p, weights=end - start, minlength=D).astype(float)
        for dev, t0, t1, _, _ in tasks:
            busy[dev] += t1 - t0
    for d in range(D):
        ops = np.flatnonzero(p == d)
        if len(ops):
            axd.broken_barh(list(zip(start[ops] / scale, (end[ops] - start[ops]) / scale)), (d - 0.4, 0.8),
                            facecolors=[colour.get(graph.op_types[o], other) for o in ops], linewidth=0)
    if tasks:
        for dev, t0, t1, kind, _ in tasks:
            axd.broken_barh([(t0 / scale, (t1 - t0) / scale)], (dev - 0.4, 0.8), facecolors="none",
                            edgecolors="0.2", hatch="////", linewidth=0.3)
    axd.set_yticks(range(D), cluster.names)
    axd.set_ylim(D - 0.5, -0.5)
    util = axd.secondary_yaxis("right")
    util.set_yticks(range(D), [f"{100 * b / makespan:.0f}% busy" if makespan else "" for b in busy])
    util.tick_params(length=0, labelsize=8)
    axd.set_ylabel("devices")
    handles = [Patch(color=c, label=t) for t, c in colour.items()]
    if len(colour) < len(set(graph.op_types)):
        handles.append(Patch(color=other, label="other"))
    if tasks:
        handles.append(Patch(facecolor="none", edgecolor="0.2", hatch="////", label="send/recv work"))
    if links:
        axl = axes[1][0]
        for r, (s, d) in enumerate(links):
            xs = np.flatnonzero((trace.x_src == s) & (trace.x_dst == d))
            axl.broken_barh(list(zip(trace.x_start[xs] / scale, (trace.x_end[xs] - trace.x_start[xs]) / scale)),
                            (r - 0.35, 0.7), facecolors="0.35", linewidth=0)
        axl.set_yticks(range(len(links)), [f"{cluster.names[s]}→{cluster.names[d]}" for s, d in links],
                       fontsize=7)
        axl.set_ylim(len(links) - 0.5, -0.5)
        lu = axl.secondary_yaxis("right")
        lb = [float(np.sum((trace.x_end - trace.x_start)[(trace.x_src == s) & (trace.x_dst == d)])) for s, d in links]
        lu.set_yticks(range(len(links)), [f"{100 * b / makespan:.0f}% busy" if makespan else "" for b in lb])
        lu.tick_params(length=0, labelsize=7)
        axl.set_ylabel("links" if n_used == len(links) else f"links ({len(links)} busiest of {n_used})",
                       fontsize=9 if n_used == len(links) else 8)
        handles.append(Patch(color="0.35", label="transfer"))
    bottom = axes[-1][0]
    for row in axes:
        ax = row[0]
        ax.grid(axis="x", alpha=0.3)
        ax.axvline(makespan / scale, color="k", lw=1)
        if lower_bound_us is not None and np.isfinite(lower_bound_us):
            ax.axvline(lower_bound_us / scale, color="crimson", ls="--", lw=1.2)
    if lower_bound_us is not None and np.isfinite(lower_bound_us):
        handles.append(plt.Line2D([], [], color="crimson", ls="--", label=f"lower bound {_fmt(lower_bound_us)}"))
    handles.append(plt.Line2D([], [], color="k", lw=1, label=f"step {_fmt(makespan)}"))
    bottom.xaxis.set_major_locator(MaxNLocator(nbins=10))
    bottom.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    bottom.set_xlabel(f"time ({unit})")
    bottom.set_xlim(0, span / scale * 1.01)
    axd.set_title(title or f"{graph.name} on {cluster.name}: step {_fmt(makespan)}", fontsize=11)
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.1, right=0.9, top=1 - 0.45 / fig_h, bottom=(0.55 + 0.22 * (len(handles) // 6 + 1)) / fig_h)
    save_figure(fig, path, fmt, dpi)


def save_figure(fig, path, fmt: str, dpi: int) -> None:
    """Write a matplotlib figure atomically (no half-written file) and close it."""
    import io

    from .errors import atomic_write

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=dpi)
    finally:
        _plt().close(fig)
    atomic_write(path, buf.getvalue())


def _fmt(us: float) -> str:
    scale, unit = time_unit(us)
    return f"{us / scale:,.{0 if scale == 1 else 2}f} {unit}"
