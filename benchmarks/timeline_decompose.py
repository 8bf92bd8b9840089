"""Where a split step's time goes that the simulator does not see, from recorded timelines.

Reads the folders that ``timeline_fit.py record DIR`` writes and prints its tables,
without TensorFlow:

1. **Transfers.** Per graph, over every traced split step: the delivery (producer end to
   arrival) against the lone-transfer estimate of the calibrated links; how long after
   the producer ended the sender started its response (a ``RecvTensor`` record's start:
   the later of the receiver's call and the sender's ``send_start_micros``, stamped as it
   encodes the tensor), and how long the response itself took;
   and the share of the delivery in which the sender and the receiver were computing.
2. **The step's first response, and after a quiet spell.** When the step's first
   response started and how much of the time before it no device computed; then the
   deliveries split by how long no RPC had run when the producer ended (under 20 ms, or
   20 ms and more, which holds each step's first transfers): the waits before the
   response gather there.
   Then each response in context (:func:`response_context`): was its sender computing
   when it started, idle with an op ready, or idle with nothing ready; the deliveries in
   which neither end computed at first, against the others; and how far apart the
   responses to one receiver start.
3. **Replay in the executor's own order.** Every traced step scheduled with its traced
   op times, each device running its ops in their traced order, and every transfer taking
   its traced delivery (:func:`traced_order_span`), with a per-message cost ``a + k x
   bytes`` that occupies the sending and the receiving device but not the wire. With no
   cost this leaves out only the runtime's time between ops, so the error it leaves is
   what a device-side cost must explain; the grid shows which one does, on every graph.
4. **The executor's order.** How often each device's traced choice of its next op
   agrees with the simulator's order (earliest ready, then topological rank), with
   earliest-ready and with latest-ready first, and how often an op readied by a transfer
   ran when an op readied on the device was also waiting
   (:func:`placetool.costmodel.timeline.order_agreement`).
   Then every step replayed on lone-transfer links with the ``--lone-cost`` per message,
   in the traced order and in the simulator's (``links.send`` "aside"), split into the
   designed placements and the search's picks.

    .venv/bin/python benchmarks/timeline_decompose.py /tmp/tl [--costs 0:0,20:150,30:150] [--lone-cost 50:300]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from placetool.costmodel.timeline import _measure, input_times, order_agreement

#: a transfer whose producer ends this long after the step's last RPC ended comes after a quiet spell
QUIET_US = 20_000.0
#: the time after a producer's end in which neither end of its transfer computing counts as both idle
IDLE_WINDOW_US = 200.0


def deliveries(step, graph_links=None) -> dict:
    """Per data transfer of one traced step (control messages and unknown producers left
    out): ``delivery`` (arrival - producer end), ``wait`` (response start - producer
    end), ``wire`` (the response's own time), ``quiet`` (how long before the producer's end the
    last RPC of the step ended, on any link; inf for none), ``sender_busy`` and
    ``receiver_busy`` (share of the delivery each device spent in ops), and with
    ``graph_links`` = (latency, bandwidth) the lone-transfer ``estimate`` (µs)."""
    m = ~step.x_control & np.isfinite(step.x_producer_end) & (step.x_end > step.x_producer_end)
    idx = np.flatnonzero(m)
    a, b = step.x_producer_end[idx], step.x_end[idx]
    out = {"delivery": step.delivery_us[idx], "wait": step.x_start[idx] - a, "wire": step.wire_us[idx]}
    ends = np.sort(step.x_end[np.isfinite(step.x_end)])
    k = np.searchsorted(ends, a, side="right")  # RPCs (any link, any kind) ended by the producer's end
    out["quiet"] = np.where(k > 0, a - ends[np.maximum(k - 1, 0)], np.inf)
    for key, devs in (("sender_busy", step.x_src[idx]), ("receiver_busy", step.x_dst[idx])):
        share = np.empty(len(idx))
        for j, (d, lo, hi) in enumerate(zip(devs, a, b)):
            on = step.traced & (step.op_dev == d)
            s, e = np.clip(step.op_start[on], lo, hi), np.clip(step.op_end[on], lo, hi)
            share[j] = np.maximum(e - s, 0.0).sum() / (hi - lo)
        out[key] = share
    if graph_links is not None:
        lat, bw = graph_links
        s, d = step.x_src[idx], step.x_dst[idx]
        out["estimate"] = lat[s, d] + step.x_bytes[idx] / bw[s, d]
    return out


def first_response(step) -> tuple[float, float]:
    """(when the step's first response started, how much of the time before it no device
    spent in an op), µs from the step's first op; (nan, nan) with no transfer record."""
    ok = np.isfinite(step.x_start)
    if not ok.any():
        return float("nan"), float("nan")
    t0 = step.t0
    t = float(step.x_start[ok].min())
    on = step.traced
    covered = _measure(np.clip(step.op_start[on], t0, t), np.clip(step.op_end[on], t0, t))
    return t - t0, (t - t0) - covered


def response_context(graph, step, placement, window_us: float = IDLE_WINDOW_US) -> dict:
    """Per transfer record of one traced step whose producer is known: the sender's state
    when its response started, ``sender`` 0 computing, 1 idle while one of its ops had every
    input and had not started, 2 idle with nothing ready; ``both_idle``, neither device
    computed in the ``window_us`` after the producer's end (a fixed window: one as long as
    the delivery would favour the short deliveries); ``delivery`` (µs). And ``spacing``:
    the gaps between consecutive response starts to each receiving device."""
    p = np.asarray(placement)
    local, _, arrived = input_times(step, graph, p)
    ready = np.fmax(local, arrived)
    idx = np.flatnonzero(np.isfinite(step.x_start) & np.isfinite(step.x_producer_end))
    sender = np.empty(len(idx), np.int64)
    both_idle = np.empty(len(idx), bool)
    for j, x in enumerate(idx):
        t, src = step.x_start[x], step.x_src[x]
        on = step.traced & (step.op_dev == src)
        if ((step.op_start[on] <= t) & (step.op_end[on] > t)).any():
            sender[j] = 0
        else:
            sender[j] = 1 if ((ready[on] <= t) & (step.op_start[on] > t)).any() else 2
        lo = step.x_producer_end[x]
        hi = lo + window_us
        ends = step.traced & np.isin(step.op_dev, (src, step.x_dst[x]))
        both_idle[j] = not ((step.op_start[ends] < hi) & (step.op_end[ends] > lo)).any()
    ok = np.isfinite(step.x_start)
    spacing = [np.diff(np.sort(step.x_start[ok & (step.x_dst == d)])) for d in np.unique(step.x_dst[ok])]
    return {"sender": sender, "both_idle": both_idle, "delivery": step.x_end[idx] - step.x_producer_end[idx],
            "spacing": np.concatenate(spacing) if spacing else np.zeros(0)}


def message_costs(graph, placement, a: float, k: float) -> tuple[np.ndarray, np.ndarray]:
    """(receive cost, send cost) per op: ``a + k x bytes`` (k in µs per byte) for every
    tensor sent once per destination device, charged to its consumers on that device
    (each once) and to its producer."""
    p = np.asarray(placement)
    recv, send = np.zeros(graph.n_ops), np.zeros(graph.n_ops)
    sent, got = set(), set()
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        if t < 0 or p[s] == p[d]:
            continue
        c = a + k * float(graph.tensor_bytes[t])
        if (t, int(p[d])) not in sent:
            sent.add((t, int(p[d])))
            send[s] += c
        if (t, d) not in got:
            got.add((t, d))
            recv[d] += c
    return recv, send


def traced_order_span(graph, step, placement, a: float = 0.0, k: float = 0.0, links=None) -> float:
    """The span of ``step`` rescheduled from its own facts: traced op times, each
    device's traced ops in their traced order (untraced ops take no time and no place
    in it), a transfer arriving its traced delivery after its producer ends (the longest
    of a producer's to one device; a pair with no traced delivery arrives at once), and
    per message ``a + k x bytes`` µs on both devices (:func:`message_costs`): before a
    consumer starts, and after a producer ends, before its device's next op.

    With ``links`` = (latency, bandwidth) matrices, every data transfer takes the lone
    transfer's ``latency + bytes / bandwidth`` instead of its traced delivery: the
    simulator's deliveries in the executor's order."""
    p = np.asarray(placement, np.int64)
    dur = np.where(step.traced, step.op_end - step.op_start, 0.0)
    wire = {}
    for x in np.flatnonzero(step.x_producer >= 0):
        w = step.x_end[x] - step.x_producer_end[x]
        if np.isfinite(w):
            key = (int(step.x_producer[x]), int(step.x_dst[x]))
            wire[key] = max(wire.get(key, 0.0), float(w))
    recv, send = message_costs(graph, p, a, k)
    preds = [[] for _ in range(graph.n_ops)]
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        if p[s] == p[d]:
            w = 0.0
        elif links is None:
            w = wire.get((s, int(p[d])), 0.0)
        else:
            w = 0.0 if t < 0 else links[0][p[s], p[d]] + graph.tensor_bytes[t] / links[1][p[s], p[d]]
        preds[d].append((s, w))
    key = np.where(step.traced, step.op_start, np.inf)
    pending = sorted(range(graph.n_ops), key=lambda i: (key[i], graph.topo_rank[i]))
    end = np.zeros(graph.n_ops)
    done = np.zeros(graph.n_ops, bool)
    free = {}  # device -> when its last traced op and that op's sends are done
    while pending:
        later = []
        for i in pending:
            if not all(done[s] for s, _ in preds[i]):
                later.append(i)
                continue
            t = max((end[s] + w for s, w in preds[i]), default=0.0)
            if step.traced[i]:
                t = max(t, free.get(int(p[i]), 0.0)) + recv[i]
            end[i] = t + dur[i]
            done[i] = True
            if step.traced[i]:
                free[int(p[i])] = end[i] + send[i]
        if len(later) == len(pending):
            raise ValueError("the traced order and the graph's edges disagree")
        pending = later
    return float(end.max(initial=0.0))  # from 0, as the traced span is from its first op


def _transfer_tables(data, lone_links) -> None:
    print(f"{'graph':<34} {'n':>6} {'delivery':>9} {'lone est.':>9} {'wait':>7} {'wire':>7} {'sender':>7} "
          f"{'receiver':>8}")
    pooled = {}  # graph -> every split step's deliveries, concatenated (the quiet table reads them too)
    for name, (g, prof, recs, _) in data.items():
        cl = lone_links(prof)
        rows = [deliveries(st, (cl.latency_us, cl.bandwidth_bytes_per_us))
                for label, rec in recs if not label.startswith("single") for st in rec.steps]
        c = pooled[name] = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        print(f"{name[:34]:<34} {len(c['delivery']):>6} {np.median(c['delivery']):>9.0f} "
              f"{np.median(c['estimate']):>9.0f} {np.median(c['wait']):>7.0f} {np.median(c['wire']):>7.0f} "
              f"{np.mean(c['sender_busy']):>7.2f} {np.mean(c['receiver_busy']):>8.2f}")
    print("(µs, medians; sender and receiver: mean share of the delivery spent computing)\n")
    print(f"{'graph':<34} {'first resp.':>12} {'p90':>6} {'no op before it':>15} {'of the span':>11} {'p90':>5}")
    for name, (g, prof, recs, _) in data.items():
        rows = [(*first_response(st), st.span_us) for label, rec in recs if not label.startswith("single")
                for st in rec.steps]
        f, idle, span = np.array([r for r in rows if np.isfinite(r[0])]).T
        print(f"{name[:34]:<34} {np.median(f) / 1e3:>10.1f} {np.percentile(f, 90) / 1e3:>6.1f} "
              f"{np.median(idle) / 1e3:>15.1f} {100 * np.median(idle / span):>10.1f}% "
              f"{100 * np.percentile(idle / span, 90):>4.1f}%")
    print("(ms from the step's first op to its first response, and the time before it in which no device"
          " computed)\n")
    print(f"{'graph':<34} {'quiet':>8} {'n':>6} {'delivery':>9} {'wait':>7} {'share of wait time':>18}")
    for name, c in pooled.items():
        for what, m in (("< 20 ms", c["quiet"] < QUIET_US), (">= 20 ms", c["quiet"] >= QUIET_US)):
            share = np.clip(c["wait"][m], 0, None).sum() / max(np.clip(c["wait"], 0, None).sum(), 1e-9)
            med = {k: np.median(c[k][m]) if m.any() else np.nan for k in ("delivery", "wait")}
            print(f"{name[:34]:<34} {what:>8} {int(m.sum()):>6} {med['delivery']:>9.0f} {med['wait']:>7.0f} "
                  f"{100 * share:>16.0f}%")
    print("(quiet: time since the step's last RPC ended, on any link, when the producer ended;"
          " >= 20 ms holds the step's first transfers)\n")


def _response_table(data) -> None:
    print(f"{'graph':<34} {'resp.':>6} {'computing':>9} {'op ready':>8} {'nothing':>7} "
          f"{'both idle':>9} {'delivery':>8} {'else':>6} {'spacing p25':>11} {'p50':>5}")
    for name, (g, prof, recs, _) in data.items():
        rows = [response_context(g, st, rec.placement) for label, rec in recs if not label.startswith("single")
                for st in rec.steps]
        c = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        s, idle = c["sender"], c["both_idle"]
        print(f"{name[:34]:<34} {len(s):>6} {100 * np.mean(s == 0):>8.0f}% {100 * np.mean(s == 1):>7.0f}% "
              f"{100 * np.mean(s == 2):>6.0f}% {100 * idle.mean():>8.0f}% {np.median(c['delivery'][idle]):>8.0f} "
              f"{np.median(c['delivery'][~idle]):>6.0f} {np.percentile(c['spacing'], 25):>11.0f} "
              f"{np.median(c['spacing']):>5.0f}")
    print("(the sender when a response started: computing, idle with an op ready, idle with nothing ready; both idle:"
          f" neither end computed in the {IDLE_WINDOW_US:g} µs after the producer's end, its median delivery in µs"
          " beside the others'; spacing: µs between consecutive response starts to one receiving device)\n")


def _replay_table(data, grid) -> None:
    print(f"{'graph':<34} " + " ".join(f"{f'{x:g}+{y:g}/MB':>16}" for x, y in grid))
    for name, (g, prof, recs, _) in data.items():
        cells = []
        for x, y in grid:
            spans = [(traced_order_span(g, st, rec.placement, x, y * 1e-6), st.span_us)
                     for label, rec in recs if not label.startswith("single") for st in rec.steps]
            err = np.array([100.0 * (r - m) / m for r, m in spans])
            cells.append(f"{np.median(err):+5.1f}|{np.median(np.abs(err)):4.1f}|{np.abs(err).max():4.0f}")
        print(f"{name[:34]:<34} " + " ".join(f"{s:>16}" for s in cells))
    print("(replay error against the traced span, %: median | median of |error| | max |error|)\n")


def _order_tables(data, lone_links, cost) -> None:
    """Which order the executor runs a device's ready ops in, and what it does to a
    replay on lone-transfer links: the traced order against the simulator's."""
    from timeline_fit import with_message_costs

    from placetool.costmodel import CostModel

    print(f"{'graph':<34} {'choices':>8} {'simulator':>10} {'earliest':>9} {'latest':>7} {'mixed':>7} "
          f"{'remote run':>10}")
    for name, (g, prof, recs, _) in data.items():
        rows = [order_agreement(g, st) for label, rec in recs for st in rec.steps]
        n = sum(r["decisions"] for r in rows)
        share = {k: sum(r[k] * r["decisions"] for r in rows if r["decisions"]) / max(n, 1)
                 for k in ("simulator", "earliest_ready", "latest_ready")}
        mixed = sum(r["mixed"] for r in rows)
        remote = sum(r["remote_chosen"] * r["mixed"] for r in rows if r["mixed"]) / max(mixed, 1)
        print(f"{name[:34]:<34} {n:>8} {100 * share['simulator']:>9.1f}% {100 * share['earliest_ready']:>8.1f}% "
              f"{100 * share['latest_ready']:>6.1f}% {mixed:>7} {100 * remote:>9.1f}%")
    print("(share of a device's choices among two or more ready ops that each order agrees with, ties agreeing;"
          " mixed: choices between an op readied by a transfer and one readied on the device; remote run: the"
          " share of those in which the transfer's op ran)\n")
    a, k = cost
    print(f"{'graph':<34} {'placements':<10} {'traced order':>13} {'simulator':>10}   "
          f"(lone-transfer deliveries, {a:g} µs + {k:g} µs/MB per message on both ends, beside the wire)")
    for name, (g, prof, recs, _) in data.items():
        cl = lone_links(prof)
        cm_cl = with_message_costs(lone_links(prof, "aside"), a, k * 1e-6)
        err = {"designed": ([], []), "searched": ([], [])}
        for label, rec in recs:
            if label.startswith("single"):
                continue
            p = np.ascontiguousarray(rec.placement, np.int32)
            kind = err["designed" if ":" in label else "searched"]
            for st in rec.steps:
                span = traced_order_span(g, st, p, a, k * 1e-6, links=(cl.latency_us, cl.bandwidth_bytes_per_us))
                T = np.repeat(np.where(st.traced, st.op_us, 0.0)[:, None], rec.n_devices, axis=1)
                sim = CostModel(g, cm_cl, op_times=T).simulate(p).step_time_us
                kind[0].append(100.0 * (span - st.span_us) / st.span_us)
                kind[1].append(100.0 * (sim - st.span_us) / st.span_us)
        for what, (tr, sm) in err.items():
            print(f"{name[:34]:<34} {what:<10} {np.median(tr):>+12.1f}% {np.median(sm):>+9.1f}%")
    print("(median error against the traced span, %; searched: metis, heft, m-sct, sa)")


def main(argv=None) -> int:
    from timeline_fit import load_dir, lone_links

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--costs", default="0:0,20:0,20:150,30:150,20:250",
                    help="per-message costs to replay with, a:k,... (µs per message : µs per MB)")
    ap.add_argument("--lone-cost", default="50:300",
                    help="per-message cost a:k of the replay on lone-transfer links (µs : µs per MB)")
    a = ap.parse_args(argv)
    grid = [tuple(float(v) for v in c.split(":")) for c in a.costs.split(",")]
    lone_cost = tuple(float(v) for v in a.lone_cost.split(":"))
    data = {d.name: load_dir(d) for d in sorted(Path(a.dir).iterdir()) if (d / "profile.json").exists()}
    if not data:
        raise SystemExit(f"{a.dir}: no recorded graphs (run timeline_fit.py record first)")
    _transfer_tables(data, lone_links)
    _response_table(data)
    _replay_table(data, grid)
    _order_tables(data, lone_links, lone_cost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
