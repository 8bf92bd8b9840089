"""``placetool export``: a placement as a runnable TensorFlow graph with every op's device set."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from placetool.costmodel.errors import UserError

from .common import check_writable, emit_json, json_option
from .hardware import check_cluster_matches, check_model_source, parse_zoo_args, source_options, trace_source


@click.command("export")
@click.option("--graph", "-g", "source", required=True,
              help="Model to trace: zoo name or module:function (as for verify).")
@source_options
@click.option("--placement", "-p", required=True,
              help="A placement JSON file, single:DEVICE, round-robin or random[:SEED].")
@click.option("--cluster", "-c", default=None,
              help="Cluster the placement's device names belong to (default: the one the file names).")
@click.option("--testbed", "testbed_n", type=click.IntRange(min=1), default=None,
              help="Name the devices of an N-worker testbed (/job:worker/replica:0/task:K/device:CPU:0).")
@click.option("--testbed-device", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
              help="With --testbed: each worker's device kind.")
@click.option("--cluster-spec", "cluster_spec", type=click.Path(dir_okay=False),
              help='Name the devices of a TF cluster spec JSON ({"worker": [...]} or with "devices").')
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Folder for graph.pb, export.json and placement.json.")
@click.option("--force", is_flag=True, help="Write into an --out folder that is not empty (its graph.pb, "
              "placement.json and export.json are replaced; other files are left).")
@click.option("--quiet", "-q", is_flag=True, help="No progress messages.")
@json_option
def export(source, batch, mode, optimizer, zoo_args, placement, cluster, testbed_n, testbed_device,
           cluster_spec, out, force, quiet, as_json):
    """Write the traced step of GRAPH as a GraphDef whose ops carry the placement's TF devices.

    Device strings: those of --testbed N or --cluster-spec FILE; else the cluster's
    recorded TF devices (placetool calibrate); else this process's (/device:CPU:0,
    /device:GPU:k). Run it with placetool.costmodel.tf.run_export or any TF1 Session.
    """
    from placetool.costmodel import CostModel, presets
    from placetool.costmodel.placement import Placement

    from .simulate import check_placement_spec, parse_placement

    if testbed_n and cluster_spec:
        raise UserError("give only one of --testbed N, --cluster-spec FILE")
    outp = Path(out)
    if outp.exists() and not outp.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    check_writable(out, "--out", folder=True)  # before the model is traced (seconds)
    if outp.is_dir() and not force and any(outp.iterdir()):
        # the export's files would replace theirs and sit mixed in with the rest
        raise UserError(f"export: --out {out} is not empty; give --force to write into it, or another --out")
    parse_zoo_args(zoo_args)  # malformed KEY=VALUE: an error before anything loads
    check_model_source(source)
    is_file = placement.endswith(".json") or "/" in placement
    if cluster is None:
        if not is_file:
            raise UserError(f"--placement {placement}: give --cluster for its device names")
        cluster = Placement.load(placement).cluster
        if not cluster:
            raise UserError(f"{placement}: names no cluster; give --cluster")
    cl = presets.load_cluster(cluster)
    spec = None
    if testbed_n:
        from placetool.costmodel.tf.testbed import ClusterSpec

        spec = ClusterSpec.for_workers(["localhost:0"] * testbed_n, testbed_device)
    elif cluster_spec:
        from placetool.costmodel.tf.testbed import ClusterSpec

        spec = ClusterSpec.load(cluster_spec)
    if spec is not None:
        check_cluster_matches(cl, spec)
    named = check_placement_spec(placement, cl)  # a malformed placement: before TensorFlow loads (seconds)
    if named is not None:
        check_one_process(cl, spec, named)
    from placetool.costmodel.tf.export import write_export

    if not (quiet or as_json):
        click.echo(f"tracing {source} ...", err=True)
    t = trace_source(source, zoo_args, mode=mode, batch=batch, optimizer=optimizer)
    cm = CostModel(t.graph, cl)
    p = parse_placement(placement, cm)
    reason = cm.violation(p)
    if reason:
        raise UserError(f"placement refused: {reason}")
    check_one_process(cl, spec, np.unique(p))
    step = Placement.load(placement).step_time_us if is_file else None
    pl = Placement.from_array(t.graph, cl, p, step)
    m = write_export(t, pl, cl, outp, spec=spec, source=source)
    summary = {"out": str(outp), "graph": m["graph"], "ops": m["n_ops"], "cluster": cl.name,
               "devices_used": m["devices_used"], "files": [str(outp / f) for f in
                                                             ("graph.pb", "placement.json", "export.json")]}
    if as_json:
        emit_json(summary)
        return
    click.echo(f"{m['graph']} ({m['n_ops']} ops) placed on {len(m['devices_used'])} device(s):")
    for d in m["devices_used"]:
        click.echo(f"  {d}")
    click.echo(f"wrote {outp}/graph.pb, placement.json, export.json")


def check_one_process(cl, spec, used) -> None:
    """Without a cluster spec or recorded TF devices, the export names the devices of one
    TF process, which has one CPU: a placement on a second CPU device could not run."""
    from placetool.costmodel.placement import tf_device_names

    meta = (cl.metadata or {}).get("tf_devices")
    if spec is not None or (isinstance(meta, list) and len(meta) == cl.n_devices):
        return
    names = tf_device_names(cl)
    for i in sorted(int(d) for d in used):
        if cl.kinds[i] == "cpu" and names[i] != "/device:CPU:0":
            raise UserError(f"export: cluster {cl.name!r} device {cl.names[i]!r} would be {names[i]}, which one "
                            "TensorFlow process does not have; give --testbed N or --cluster-spec FILE for "
                            "several CPU workers, or a cluster written by placetool calibrate")
