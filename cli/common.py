"""Options and helpers shared by the commands."""

from __future__ import annotations

import json
import sys

import click

from placetool.costmodel.errors import UserError, atomic_write

DEFAULT_GRAPH = "synthetic-1k"
DEFAULT_CLUSTER = "k80x4"


def graph_option(default=DEFAULT_GRAPH):
    return click.option("--graph", "-g", default=default, show_default=True,
                        help="Bundled graph name or path to a graph file.")


def cluster_option(default=DEFAULT_CLUSTER):
    return click.option("--cluster", "-c", default=default, show_default=True,
                        help="Bundled cluster preset or path to a cluster TOML file.")


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


def format_options(f):
    """``--format png|pdf|svg`` and ``--dpi`` for every command that writes a figure."""
    f = click.option("--dpi", type=click.IntRange(min=50, max=1200), default=200, show_default=True,
                     help="Resolution of PNG figures.")(f)
    f = click.option("--format", "fmt", type=click.Choice(["png", "pdf", "svg"]), default=None,
                     help="Figure format (default: from the file suffix; png for folders).")(f)
    return f


def load_problem(graph: str, cluster: str, profile: str | None = None):
    """(graph, cluster, CostModel) from names or paths; UserError on bad input."""
    from placetool.costmodel import CostModel, presets

    g = presets.load_graph(graph)
    c = presets.load_cluster(cluster)
    prof = None
    if profile:
        from placetool.costmodel.calibration import load_profile

        prof = load_profile(profile)
    return g, c, CostModel(g, c, profile=prof)


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=_jsonable))


def write_json(path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=1, default=_jsonable) + "\n")


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def check_writable(path) -> None:
    """Fail before any work if an output path's folder does not exist."""
    from pathlib import Path

    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UserError(f"cannot write {path}: folder {parent} does not exist")


def fmt_us(us: float) -> str:
    """A step time for people: 1,234.5 µs or 12.3 ms or 1.23 s."""
    if us != us or us == float("inf"):
        return "inf"
    if us < 1e4:
        return f"{us:,.1f} µs"
    if us < 1e7:
        return f"{us / 1e3:,.2f} ms"
    return f"{us / 1e6:,.3f} s"


def progress(total: int | None, label: str, enabled: bool = True):
    """A progress bar on stderr (only on a terminal)."""
    return click.progressbar(length=total or 0, label=label, file=sys.stderr,
                             show_eta=True, show_percent=True) if enabled and sys.stderr.isatty() else _NoBar()


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def update(self, n, current_item=None):
        pass
