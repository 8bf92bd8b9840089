"""Regenerate the bundled graphs (``data/graphs/NAME.npz``) from the zoo's builders.

    python -m placetool.costmodel.tf.zoo --all     # or: ... zoo NAME ...  (same as this module)
"""

from __future__ import annotations

import argparse
import sys
import time

from .importer import import_graph
from .zoo import BUNDLED, ZOO


def generate(name: str, out_dir=None, **kw):
    """Trace zoo model NAME in train mode and save it; returns (graph, seconds)."""
    from placetool.costmodel.presets import data_dir

    t = time.perf_counter()
    g = import_graph(name, mode="train", **kw)
    secs = time.perf_counter() - t
    g.meta["import_seconds"] = round(secs, 2)
    out = (out_dir or data_dir() / "graphs")
    g.save(f"{out}/{name}.npz")
    return g, secs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m placetool.costmodel.tf.zoo", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"zoo names ({', '.join(ZOO)})")
    ap.add_argument("--all", action="store_true", help="every bundled graph, smallest first")
    ap.add_argument("--out-dir", default=None, help="folder (default data/graphs)")
    a = ap.parse_args(argv)
    names = BUNDLED if a.all else a.names
    if not names:
        ap.error("give zoo names or --all")
    for n in names:
        if n not in ZOO:
            ap.error(f"unknown zoo model {n!r} (known: {', '.join(ZOO)})")
    for n in names:
        g, secs = generate(n, a.out_dir)
        print(f"{n}: {g.n_ops} ops, {g.n_edges} edges, {g.n_groups} groups, "
              f"{g.flops.sum() / 1e9:.1f} GFLOP, {secs:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
