"""``placetool info``: what is in a graph (ops, edges, groups, pinned ops, FLOPs, bytes).

Never imports TensorFlow.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from collections import Counter

import click
import numpy as np

from placetool.costmodel.errors import UserError

from .common import emit_json, json_option


def graph_info(g, top: int = 10) -> dict:
    """A JSON-ready description of graph ``g``."""
    s = g.summary()
    order = np.argsort(-g.tensor_bytes, kind="stable")[:top]
    out_idx = g.tensor_output_index
    largest = [{"op": g.names[g.tensor_op[t]], "output": int(out_idx[t]),
                "op_type": g.op_types[g.tensor_op[t]], "bytes": int(g.tensor_bytes[t])}
               for t in order]
    pinned = np.flatnonzero(g.allowed != 3)
    sizes = np.bincount(g.group, minlength=g.n_groups)
    layers = g.layer[g.layer >= 0]
    s.update({
        "largest_group_ops": int(sizes.max()) if g.n_groups else 0,
        "multi_op_groups": int((sizes > 1).sum()),
        "pinned": [{"op": g.names[i], "op_type": g.op_types[i],
                    "kinds": [k for k, b in (("cpu", 1), ("gpu", 2)) if g.allowed[i] & b]}
                   for i in pinned[:top]],
        "largest_tensors": largest,
        "op_types": dict(Counter(g.op_types).most_common(top)),
        "layers": int(layers.max()) + 1 if layers.size else 0,
        "meta": g.meta,
    })
    return s


def list_info() -> dict:
    from placetool.costmodel import presets

    graphs = []
    gdir = presets.data_dir() / "graphs"
    for name in presets.list_graphs():
        p = gdir / f"{name}.npz"
        entry = {"name": name}
        if p.exists():
            entry["file_bytes"] = p.stat().st_size
            try:
                with zipfile.ZipFile(p) as z:
                    meta = json.loads(z.read("meta.json")).get("meta", {})
                for k in ("n_ops", "zoo_doc", "expert"):
                    if k in meta:
                        entry[k] = meta[k]
            except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
                entry["error"] = "unreadable"
        else:
            entry["synthetic"] = True
        graphs.append(entry)
    clusters = []
    for name in presets.list_clusters():
        try:
            c = presets.load_cluster(name)
            clusters.append({"name": name, "devices": c.names})
        except UserError as e:
            clusters.append({"name": name, "error": str(e)})
    return {"graphs": graphs, "clusters": clusters}


@click.command()
@click.option("--graph", "-g", default=None, help="Bundled graph name or path to a graph file.")
@click.option("--list", "list_", is_flag=True, help="List bundled graphs and cluster presets.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="How many of the largest tensors / pinned ops to show.")
@json_option
def info(graph, list_, top, as_json):
    """Describe a graph (--graph NAME|PATH) or list what is bundled (--list)."""
    if not list_ and graph is None:
        raise UserError("give --graph NAME|PATH or --list")
    if list_:
        d = list_info()
        if as_json:
            emit_json(d)
            return
        click.echo("graphs:")
        for e in d["graphs"]:
            extra = ("synthetic" if e.get("synthetic") else
                     f"{e.get('n_ops', '?')} ops, {e.get('file_bytes', 0) / 1024:,.0f} KiB"
                     + (f", {e['zoo_doc']}" if e.get("zoo_doc") else ""))
            click.echo(f"  {e['name']:<16} {extra}")
        click.echo("clusters:")
        for c in d["clusters"]:
            click.echo(f"  {c['name']:<16} {', '.join(c.get('devices', [])) or c.get('error')}")
        return
    from placetool.costmodel import presets

    g = presets.load_graph(graph)
    d = graph_info(g, top)
    if as_json:
        emit_json(d)
        return
    click.echo(f"graph {d['name']}: {d['ops']:,} ops, {d['edges']:,} edges "
               f"({d['control_edges']:,} control), {d['tensors']:,} tensors")
    click.echo(f"groups: {d['groups']:,} ({d['multi_op_groups']:,} with >1 op, largest "
               f"{d['largest_group_ops']} ops); pinned ops: {d['pinned_ops']:,}")
    click.echo(f"total FLOPs: {d['total_flops']:.4g}; parameter bytes: {d['param_bytes']:,}; "
               f"output bytes: {d['out_bytes']:,}; layers tagged: {d['layers']}")
    for k in ("expert", "mode", "batch", "optimizer", "zoo_doc"):
        if k in g.meta:
            click.echo(f"{k}: {g.meta[k]}")
    click.echo("largest tensors:")
    for t in d["largest_tensors"]:
        click.echo(f"  {t['bytes']:>14,} B  {t['op']}:{t['output']} ({t['op_type']})")
    if d["pinned"]:
        click.echo("pinned ops:")
        for p in d["pinned"]:
            click.echo(f"  {p['op']} ({p['op_type']}): {','.join(p['kinds'])} only")
    click.echo("op types: " + ", ".join(f"{k} {v}" for k, v in d["op_types"].items()))
