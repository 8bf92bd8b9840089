"""``placetool explain``: why a placement's measured step takes what it takes.

Either reads a timeline recorded before (``placetool explain rec.json``, with the graph
it was traced from: ``-g graph.npz``, else ``rec.npz`` beside it), or records one now:
``placetool explain -g mlp -p round-robin --testbed 2 [--save rec.json]`` traces the
placement's steps and the same steps on one device. See docs/explain.md.
"""

from __future__ import annotations

from pathlib import Path

import click

from placetool.costmodel.errors import UserError, atomic_output

from .common import check_writable, emit_json, fmt_us, json_option, placement_option, quiet_option
from .hardware import device_options, source_options


def _testbed_cluster(spec):
    """A cluster with the measured devices' names and kinds, for naming placements."""
    from placetool.costmodel.cluster import Cluster

    return Cluster.from_dict({
        "name": "measured",
        "devices": [{"name": f"{k}:{i}", "kind": k, "memory_bytes": 1 << 50} for i, k in enumerate(spec.kinds)],
        "links": {"default": {"latency_us": 0.0, "bandwidth_bytes_per_us": 1e12}},
    })


def _graph_for(timeline: str, graph: str | None):
    from placetool.costmodel import presets

    if graph:
        return presets.load_graph(graph)
    beside = Path(timeline).with_suffix(".npz")
    if not beside.exists():
        raise UserError(f"{timeline}: give the graph it was traced from with -g (no {beside.name} beside it)")
    return presets.load_graph(str(beside))


def _record(source, zoo_args, batch, mode, optimizer, placement, testbed_n, testbed_device, cluster_spec, local,
            timeout_s, steps, warmup, save, quiet):
    from placetool.costmodel import CostModel
    from placetool.costmodel.tf.session import require_tf

    from .hardware import devices, naming_lost_workers, parse_zoo_args, planned_spec, trace_source
    from .simulate import parse_placement

    require_tf()
    if save:
        check_writable(save, "--save")
        check_writable(str(Path(save).with_suffix(".npz")), "--save (its graph)", inputs={"--save": save})
    parse_zoo_args(zoo_args)
    spec0 = planned_spec(testbed_n, testbed_device, cluster_spec, local)
    if len(spec0.tf_devices) < 2:
        raise UserError("explain measures a placement split over devices: it needs 2 or more")
    from placetool.costmodel.tf.runner import check_placement
    from placetool.costmodel.tf.trace_capture import capture

    log = (lambda m: None) if quiet else (lambda m: click.echo(m, err=True))
    t = trace_source(source, zoo_args, mode=mode, batch=batch, optimizer=optimizer)
    cm = CostModel(t.graph, _testbed_cluster(spec0))
    p = parse_placement(placement, cm)
    reason = cm.violation(p)
    if reason:
        raise UserError(f"placement refused: {reason}")
    check_placement(t.graph, p, spec0)  # before any worker starts
    with devices(testbed_n, testbed_device, cluster_spec, local, timeout_s, log) as spec:
        with naming_lost_workers(spec):
            d = capture(t, p, spec, steps=steps, warmup=warmup, timeout_s=timeout_s, log=log)
    d["source"] = {"model": source, "batch": batch, "mode": mode, "placement": placement}
    if save:
        import json

        with atomic_output(save) as tmp_json, atomic_output(str(Path(save).with_suffix(".npz"))) as tmp_graph:
            Path(tmp_json).write_text(json.dumps(d) + "\n")
            t.graph.save(tmp_graph)
    return d, t.graph


@click.command()
@click.argument("timeline", required=False, type=click.Path(dir_okay=False))
@click.option("--graph", "-g", "graph", default=None,
              help="With TIMELINE: the graph it was traced from (file or bundled name; default: TIMELINE.npz). "
                   "Without: the model to trace and run (zoo name, module:function, SavedModel or .pb).")
@placement_option()
@click.option("--cluster", "-c", default=None,
              help="Also replay with this cluster's transfer model (e.g. a calibrated prof.toml).")
@click.option("--step", "step", type=click.IntRange(min=0), default=None,
              help="Which traced step to explain (default: the one of median span).")
@click.option("--top", type=click.IntRange(min=0), default=8, show_default=True,
              help="Transfers and ops listed in the table (the longest waits, the most inflated).")
@click.option("--steps", type=click.IntRange(min=1), default=3, show_default=True,
              help="Traced steps to record (placement and one device each).")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--save", default=None, type=click.Path(dir_okay=False),
              help="Write the recorded timeline here (JSON), and the graph beside it (.npz).")
@source_options
@device_options
@quiet_option
@json_option
def explain(timeline, graph, placement, cluster, step, top, steps, warmup, save, quiet, as_json, **dev):
    """Decompose a measured split step: per transfer, per op and per device, and replay it
    in the simulator with the traced op times."""
    from placetool.costmodel import presets
    from placetool.costmodel import timeline as TL

    if timeline:
        if placement or save:
            raise UserError("TIMELINE is a recorded step: -p and --save are for recording one (without TIMELINE)")
        if any(dev[k] for k in ("testbed_n", "cluster_spec", "local")):
            raise UserError("TIMELINE is a recorded step: --testbed, --cluster-spec and --local are for recording one")
        g = _graph_for(timeline, graph)
        cl = presets.load_cluster(cluster) if cluster else None
        rec = TL.load(timeline, g)
    else:
        if not graph or not placement:
            raise UserError("give a recorded TIMELINE file, or -g MODEL and -p PLACEMENT to record one")
        cl = presets.load_cluster(cluster) if cluster else None
        d, g = _record(graph, dev["zoo_args"], dev["batch"], dev["mode"], dev["optimizer"], placement,
                       dev["testbed_n"], dev["testbed_device"], dev["cluster_spec"], dev["local"], dev["timeout_s"],
                       steps, warmup, save, quiet or as_json)
        rec = TL.load(d, g)
    out = TL.explain(rec, step=step, cluster=cl)
    if as_json:
        emit_json(out)
        return
    _print(out, top)


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1e3:8.2f}"


def _print(e: dict, top: int) -> None:
    b = e["breakdown"]
    span = e["span_us"]
    median = " (the median span)" if e["step"] == e.get("median_step") else ""
    click.echo(f"{e['graph']} ({e['ops']} ops) on {', '.join(e['devices'])}: traced step {e['step']} of "
               f"{e['steps']}{median}")
    spans = e["spans_us"]
    line = f"step: traced span {fmt_us(span)} (steps {fmt_us(min(spans))} .. {fmt_us(max(spans))}), " \
           f"its wall time {fmt_us(e['wall_us'])}"
    if e["untraced_step_us"]:
        line += f"; untraced steps {fmt_us(e['untraced_step_us'])}"
    if e["single_step_us"]:
        line += f"; one device {fmt_us(e['single_step_us'])}"
    click.echo(line)
    click.echo("")
    click.echo("per device (ms)      ops     busy    ready transfer  nothing")
    for d in b["devices"]:
        click.echo(f"  {d['name']:<16} {d['ops']:>5} {_ms(d['busy_us'])} {_ms(d['ready_us'])} "
                   f"{_ms(d['transfer_us'])} {_ms(d['nothing_ready_us'])}")
    click.echo(f"no device ran an op for {fmt_us(b['none_busy_us'])} of the {fmt_us(span)} "
               f"({100 * b['none_busy_us'] / span:.0f}%), {fmt_us(b['none_busy_in_flight_us'])} of it with "
               "a transfer in flight")
    inf = e["inflation"]
    if inf:
        per = ", ".join(f"{e['devices'][d['device']]} x{d['ratio']:.2f}" for d in inf["devices"] if d["ratio"])
        click.echo(f"ops: {fmt_us(inf['split_us'])} in this placement against {fmt_us(inf['single_us'])} on one "
                   f"device (x{inf['ratio']:.2f}; {per}; medians over the traced steps)")
    if e.get("stolen"):
        click.echo("CPU the transfers took: " + ", ".join(
            f"{e['devices'][x['device']]} {fmt_us(x['stolen_us'])} (ops grew {fmt_us(x['inflation_us'])}, idle with "
            f"every input there {fmt_us(x['gaps_us'])})" for x in e["stolen"]))
    o = e.get("order")
    if o and o["decisions"]:
        line = (f"op order: of {o['decisions']} choices among ready ops, the simulator's order (earliest ready, "
                f"then rank) agrees with {100 * o['simulator']:.0f}%, latest ready first with "
                f"{100 * o['latest_ready']:.0f}%")
        if o["mixed"]:
            line += (f"; an op fed by a transfer ran before one readied on its device in "
                     f"{100 * o['remote_chosen']:.0f}% of {o['mixed']} such choices")
        click.echo(line)
    wire = e["median_wire_us"]
    click.echo(f"transfers: {e['n_data_transfers']} tensors"
               + (f" (median wire time {fmt_us(wire)})" if wire is not None else "")
               + f", {e['n_control_transfers']} control messages; the simulator counts "
               f"{e['simulated_transfers']} tensors")
    if top:
        xs = sorted([x for x in e["transfers"] if x["delivery_us"] is not None],
                    key=lambda x: -x["delivery_us"])[:top]
        if xs:
            click.echo("")
            click.echo("longest transfers (ms from the first op)   bytes prod.end resp.start arrival consumer "
                       "    wire delivery")
            for x in xs:
                name = (x["producer"] or x["edge"])[-36:]
                click.echo(f"  {name:<36} {x['src']}->{x['dst']} {x['bytes']:>7} {_ms(x['producer_end_us'])} "
                           f"{_ms(x['recv_start_us'])}  {_ms(x['recv_end_us'])} {_ms(x['consumer_start_us'])} "
                           f"{_ms(x['wire_us'])} {_ms(x['delivery_us'])}")
        if inf:
            ops = sorted([o for o in inf["ops"] if o["ratio"] is not None],
                         key=lambda o: -(o["split_us"] - o["single_us"]))[:top]
            if ops:
                click.echo("")
                click.echo("ops that grew most (µs)                      device    split   single   ratio")
                for o in ops:
                    click.echo(f"  {o['op'][-42:]:<42} {e['devices'][o['device']]:>7} {o['split_us']:8.1f} "
                               f"{o['single_us']:8.1f} {o['ratio']:7.2f}")
    click.echo("")
    click.echo("replay (the traced op times put into the simulator), against the traced span:")
    what = {"fifo": "simulator, traced link latency (one transfer at a time per link)",
            "concurrent": "same latency, transfers side by side",
            "idle": "side by side, each sent once its sender has no op ready",
            "traced": "each transfer its own traced delivery time",
            "cluster": "simulator with --cluster's transfer model",
            "workers": "--cluster's links, TensorFlow's run queue, CPU per message"}
    for k, r in e["replay"].items():
        click.echo(f"  {what[k]:<66} {fmt_us(r['replay_us']):>11}  {r['error_pct']:+7.1f}%")
