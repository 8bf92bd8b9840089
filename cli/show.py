"""``placetool show``: a placement drawn on its graph."""

from __future__ import annotations

import click

from .common import (check_writable, cluster_option, emit_json, format_options, graph_option, json_option,
                     load_problem)


@click.command()
@graph_option()
@cluster_option()
@click.option("--placement", "-p", default="round-robin", show_default=True,
              help="A placement JSON file, single:DEVICE, round-robin or random[:SEED].")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="Figure to write: .svg, .png or .pdf.")
@click.option("--by", type=click.Choice(["auto", "layer", "scope", "group", "op"]), default="auto",
              show_default=True,
              help="What one box stands for (per device): the graph's layer tags, name scopes, colocation "
                   "groups or single ops; auto: ops for tiny graphs, else layers, else scopes.")
@click.option("--depth", type=click.IntRange(min=1), default=2, show_default=True,
              help="Name-scope levels with --by scope.")
@click.option("--max-layers", type=click.IntRange(min=2), default=60, show_default=True,
              help="With --by layer: merge consecutive layers into ranges beyond this many.")
@click.option("--engine", type=click.Choice(["auto", "dot", "matplotlib"]), default="auto", show_default=True,
              help="Graphviz dot (any size; needs the graphviz package) or pure matplotlib (small drawings).")
@format_options
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
@json_option
def show(graph, cluster, placement, out, by, depth, max_layers, engine, fmt, dpi, quiet, as_json):
    """Draw PLACEMENT on GRAPH: boxes coloured by device, transfers as thick arrows with their bytes."""
    from placetool.costmodel.draw import draw_placement
    from placetool.costmodel.trace import figure_format

    check_writable(out, inputs={"--graph": graph, "--cluster": cluster, "--placement": placement})
    figure_format(out, fmt)
    g, cl, cm = load_problem(graph, cluster)
    from .simulate import parse_placement

    p = parse_placement(placement, cm)
    info = draw_placement(g, cl, p, out, by=by, depth=depth, engine=engine, fmt=fmt, dpi=dpi,
                          max_units=max_layers)
    info = {"out": out, "graph": g.name, "cluster": cl.name, "placement": placement, **info}
    if as_json:
        emit_json(info)
    elif not quiet:
        click.echo(f"{g.name} ({g.n_ops} ops) as {info['boxes']} boxes by {info['by']}, "
                   f"{info['transfer_arrows']} transfer arrows ({info['transfer_bytes']:,} bytes) "
                   f"drawn with {info['engine']} to {out}")
