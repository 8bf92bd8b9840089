"""Benchmark: import time of the Inception-V3 training graph, and the bundled zoo's sizes.

    python benchmarks/import_zoo.py [--model inception_v3] [--repeat 1] [--json] [--no-import]

Part 1 imports MODEL in train mode in this process (loading TensorFlow is timed
separately, before) and splits the median import time into building the Keras model
(layers, variable initialisation), tracing (tf.function + gradients + optimizer) and
conversion to an OpGraph (shapes, FLOPs, groups, layer tags). Part 2 reads every bundled
``data/graphs/*.npz`` (no TensorFlow) and prints ops, edges, groups, GFLOPs, parameter
MiB, file size and the import seconds recorded when the file was generated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def bench_import(model: str, repeat: int) -> dict:
    t = time.perf_counter()
    from placetool.costmodel.tf.session import import_tf

    import_tf()
    from placetool.costmodel.tf.importer import trace

    tf_import = time.perf_counter() - t
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        tr = trace(model, mode="train")
        total = time.perf_counter() - t
        runs.append((total, tr.graph.meta["trace_seconds"], tr.graph.meta["convert_seconds"]))
    g = tr.graph
    return {
        "model": model, "batch": g.meta["batch"], "ops": g.n_ops, "edges": g.n_edges,
        "tf_import_s": round(tf_import, 2),
        "import_s_median": round(statistics.median(r[0] for r in runs), 2),
        "trace_s_median": round(statistics.median(r[1] for r in runs), 2),
        "convert_s_median": round(statistics.median(r[2] for r in runs), 2),
        "build_s_median": round(statistics.median(r[0] - r[1] - r[2] for r in runs), 2),
        "repeat": repeat,
    }


def zoo_table() -> list[dict]:
    from placetool.costmodel.graph import load
    from placetool.costmodel.presets import data_dir

    rows = []
    for p in sorted((data_dir() / "graphs").glob("*.npz"), key=lambda p: p.stat().st_size):
        g = load(p)
        rows.append({
            "graph": p.stem, "ops": g.n_ops, "edges": g.n_edges, "groups": g.n_groups,
            "pinned": int((g.allowed != 3).sum()), "gflops": round(g.flops.sum() / 1e9, 1),
            "param_mib": round(g.param_bytes.sum() / 2**20, 1),
            "file_kib": round(p.stat().st_size / 1024, 1),
            "expert": g.meta.get("expert", ""), "import_s": g.meta.get("import_seconds"),
        })
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="inception_v3")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-import", action="store_true", help="only the table of bundled graphs")
    a = ap.parse_args(argv)
    out = {"import": None if a.no_import else bench_import(a.model, a.repeat), "zoo": zoo_table()}
    out["zoo_total_kib"] = round(sum(r["file_kib"] for r in out["zoo"]), 1)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    if out["import"]:
        b = out["import"]
        print(f"import {b['model']} (train, batch {b['batch']}): {b['ops']} ops, {b['edges']} edges")
        print("| TF import s | import s (median of %d) | = build model s | + trace s | + convert s |"
              % b["repeat"])
        print("|---:|---:|---:|---:|---:|")
        print(f"| {b['tf_import_s']} | {b['import_s_median']} | {b['build_s_median']} | "
              f"{b['trace_s_median']} | {b['convert_s_median']} |")
        print()
    cols = ["graph", "ops", "edges", "groups", "pinned", "gflops", "param_mib", "file_kib", "expert", "import_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" if c in ("graph", "expert") else "---:" for c in cols) + "|")
    for r in out["zoo"]:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    print(f"\ntotal size of data/graphs/*.npz: {out['zoo_total_kib']:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
