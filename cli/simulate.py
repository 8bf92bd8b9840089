"""``placetool simulate``: score one placement with the compiled simulator."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import numpy as np

from placetool.costmodel.errors import UserError, atomic_write

from placetool.costmodel.trace import figure_format

from .common import (check_writable, cluster_option, emit_json, fmt_us, format_options, graph_option,
                     json_option, load_problem, notes_compiles, placement_option, profile_option)


def parse_placement(spec: str, cm) -> np.ndarray:
    """SPEC: a placement JSON file, ``single:DEVICE``, ``round-robin`` or ``random[:SEED]``.

    ``single:DEVICE`` puts every op that has a kernel there on DEVICE (pinned groups go
    to the first device that can run them); ``round-robin`` and ``random`` deal whole
    groups to devices that can run them.
    """
    g = cm.graph
    if spec.startswith("single:"):
        return cm.single_device(spec.split(":", 1)[1])
    if spec == "round-robin":
        return g.to_placement(_assign_groups(cm, lambda k, ok: ok[k % len(ok)]))
    m = re.fullmatch(r"random(?::(\d+))?", spec)
    if m:
        rng = np.random.default_rng(int(m.group(1) or 0))
        return g.to_placement(_assign_groups(cm, lambda k, ok: ok[rng.integers(len(ok))]))
    if spec.endswith(".json") or "/" in spec or Path(spec).is_file():
        return cm.load_placement(spec)
    raise UserError(
        f"placement {spec!r}: expected a JSON file, 'single:DEVICE', 'round-robin' or 'random[:SEED]'"
    )


def check_placement_spec(spec: str, cluster) -> list[int] | None:
    """Check SPEC (as :func:`parse_placement` takes it) against the cluster alone, before a
    model is traced or a graph loaded: a malformed spec or file, or a device the cluster
    lacks, is a one-line error now. Returns the indices of the devices it names (None for
    ``round-robin`` and ``random``, which depend on the graph)."""
    if spec.startswith("single:"):
        return [cluster.device_index(spec.split(":", 1)[1])]
    if spec == "round-robin" or re.fullmatch(r"random(?::(\d+))?", spec):
        return None
    if spec.endswith(".json") or "/" in spec or Path(spec).is_file():
        from placetool.costmodel.placement import Placement, PlacementError

        pl = Placement.load(spec)
        used = set()
        for op, dev in pl.devices.items():
            try:
                used.add(cluster.device_index(dev))
            except UserError:
                raise PlacementError(f"{spec}: devices[{op!r}]: unknown device {dev!r} "
                                     f"(cluster {cluster.name!r} has {', '.join(cluster.names)})") from None
        return sorted(used)
    raise UserError(
        f"placement {spec!r}: expected a JSON file, 'single:DEVICE', 'round-robin' or 'random[:SEED]'"
    )


def _assign_groups(cm, choose) -> np.ndarray:
    out = np.empty(cm.graph.n_groups, np.int32)
    for k in range(cm.graph.n_groups):
        ok = np.flatnonzero(cm.group_device_ok[k])
        out[k] = choose(k, ok)
    return out


@click.command()
@graph_option()
@cluster_option()
@placement_option(default="round-robin")
@profile_option()
@json_option
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), help="Write a Chrome trace (Perfetto).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a Gantt chart of devices and links (PNG, PDF or SVG by suffix or --format).")
@click.option("--critical-path", "critical", is_flag=True,
              help="Also say where the simulated critical path spends the step: computing (per device), waiting "
                   "where it changes device, and the longest waits.")
@format_options
@notes_compiles
def simulate(graph, cluster, placement, profile, as_json, trace_path, plot_path, critical, fmt, dpi):
    """Simulate one placement of GRAPH on CLUSTER and print its step time."""
    inputs = {"--graph": graph, "--cluster": cluster, "--placement": placement, "--profile": profile}
    check_writable(trace_path, "--trace", inputs=inputs)
    check_writable(plot_path, "--plot", inputs={**inputs, "--trace": trace_path})
    if plot_path:
        try:  # a wrong suffix or format fails before any work
            figure_format(plot_path, fmt)
        except UserError as e:
            raise UserError(f"--plot {e}") from None
    g, cl, cm = load_problem(graph, cluster, profile)
    p = parse_placement(placement, cm)
    want_trace = bool(trace_path or plot_path or critical)
    r = cm.simulate(p, trace=want_trace)
    if want_trace and r.trace is None:
        raise UserError(f"no trace: placement is invalid ({r.reason})")
    if trace_path:
        # compact: a 50k-op trace is tens of MB, and nobody reads it without a viewer
        atomic_write(trace_path, json.dumps(r.trace.to_chrome(g, cl), separators=(",", ":")))
    if plot_path:
        r.trace.plot(g, cl, plot_path, lower_bound_us=cm.lower_bound_us(), fmt=fmt, dpi=dpi)
    out = {"graph": g.name, "cluster": cl.name, "placement": placement, **r.to_dict(),
           "lower_bound_us": cm.lower_bound_us()}
    if critical:
        from placetool.search.critical import path_breakdown

        out["critical_path"] = path_breakdown(cm, p, top=CRITICAL_TOP, result=r)
    if as_json:
        emit_json(out)
        return
    click.echo(f"{g.name} ({g.n_ops} ops) on {cl.name}, placement {placement}")
    click.echo(f"step time   {fmt_us(r.step_time_us)}   (lower bound {fmt_us(out['lower_bound_us'])})")
    click.echo(f"feasible    {'yes' if r.feasible else 'no: ' + str(r.reason)}")
    for name, b, m, cap in zip(cl.names, r.busy_us, r.peak_memory_bytes, cm.capacity):
        click.echo(f"  {name:<10} busy {fmt_us(b):>12}   peak memory {m / 2**20:10,.1f} MiB of {cap / 2**30:,.0f} GiB")
    if critical:
        _echo_path(out["critical_path"])
    if trace_path:
        click.echo(f"trace written to {trace_path}")
    if plot_path:
        click.echo(f"plot written to {plot_path}")


#: waits ``simulate --critical-path`` lists
CRITICAL_TOP = 10


def _echo_path(b: dict) -> None:
    step = max(b["step_time_us"], 1e-12)
    share = lambda us: f"{fmt_us(us)} ({100 * us / step:.1f}%)"  # noqa: E731
    mean = b["transfer_wait_us"] / max(b["device_changes"], 1)
    click.echo(f"critical path  {b['path_ops']:,} ops: computing {share(b['compute_us'])}, waiting at "
               f"{b['device_changes']:,} device changes {share(b['transfer_wait_us'])}, mean {fmt_us(mean)}")
    if b["start_us"] > 0 or b["other_gap_us"] > 0:
        click.echo(f"  before it starts {fmt_us(b['start_us'])}, other gaps {fmt_us(b['other_gap_us'])}")
    click.echo("  computing on it: " + ", ".join(f"{d} {fmt_us(us)}" for d, us in b["compute_by_device_us"].items()))
    if b["waits"]:
        click.echo("  longest waits (wait, link, bytes, when, producer -> consumer):")
    for w in b["waits"]:
        click.echo(f"    {fmt_us(w['wait_us']):>11}  {w['from_device']} -> {w['to_device']}  {w['bytes']:>13,} B  "
                   f"at {fmt_us(w['at_us'])}  {w['from_op']} -> {w['to_op']}")
