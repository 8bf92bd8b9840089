"""``placetool import``: trace a TensorFlow/Keras model into a placetool graph file."""

from __future__ import annotations

import time

import click

from placetool.costmodel.errors import UserError

from .common import check_writable, emit_json, json_option


@click.command("import")
@click.argument("source")
@click.option("--out", "-o", "out", required=True, type=click.Path(dir_okay=False),
              help="Graph file to write (.npz).")
@click.option("--mode", type=click.Choice(["train", "infer"]), default="train", show_default=True,
              help="train: forward+loss+gradients+updates; infer: forward only.")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="Fixed batch size (required where the model's batch is dynamic).")
@click.option("--optimizer", default="sgd", show_default=True,
              help="Keras optimizer name for the training step (sgd, adam, rmsprop, ...).")
@click.option("--name", default=None, help="Graph name (default: from SOURCE).")
@json_option
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors (as show does).")
def import_cmd(source, out, mode, batch, optimizer, name, as_json, quiet):
    """Import SOURCE into a graph file.

    SOURCE is a zoo name (python -m placetool.costmodel.tf.zoo --help), module:function returning a
    Keras model (importable from the current directory), a SavedModel directory, or a
    GraphDef file (.pb/.pbtxt).
    """
    from placetool.costmodel.tf.session import require_tf

    require_tf()
    check_writable(out, "--out", inputs={"SOURCE": source})
    from placetool.costmodel.tf.importer import import_graph

    t = time.perf_counter()
    g = import_graph(source, mode=mode, batch=batch, optimizer=optimizer,
                     **({"name": name} if name else {}))
    secs = time.perf_counter() - t
    if g.n_ops == 0:
        raise UserError(f"{source}: the imported graph has no ops to place; {out} not written")
    g.save(out)
    s = g.summary()
    s.update(out=str(out), seconds=round(secs, 3), mode=mode)
    if as_json:
        emit_json(s)
    elif not quiet:
        click.echo(f"{source}: {s['ops']} ops, {s['edges']} edges, {s['groups']} groups, "
                   f"{s['pinned_ops']} pinned, {s['total_flops'] / 1e9:.3f} GFLOP, "
                   f"{s['param_bytes'] / 2**20:.1f} MiB params -> {out} ({secs:.1f} s)")
