"""Bundled data: graphs and clusters by name, or from a path.

Names resolve in this order: an existing path; the bundled ``graphs/NAME.npz`` (or
``clusters/NAME.toml``) of :mod:`placetool.data`; for graphs, ``synthetic-1k``, ``synthetic-10k``,
``synthetic-50k`` (or ``synthetic-N``), generated deterministically on load.
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from . import cluster as _cluster
from . import graph as _graph
from .errors import UserError
from .synthetic import layered

SYNTHETIC = {"synthetic-1k": 1_000, "synthetic-10k": 10_000, "synthetic-50k": 50_000}
#: the largest synthetic-N generated on request (twenty times gnmt8's ops)
MAX_SYNTHETIC = 1_000_000


class UnknownName(UserError):
    """A graph or cluster name that is neither a file nor bundled."""


def data_dir() -> Path:
    """The bundled data folder, ``placetool.data`` (override with PLACETOOL_DATA)."""
    env = os.environ.get("PLACETOOL_DATA")
    return Path(env) if env else Path(str(resources.files("placetool.data")))


def list_graphs() -> list[str]:
    files = sorted(p.name.removesuffix(".npz") for p in (data_dir() / "graphs").glob("*.npz"))
    return files + list(SYNTHETIC)


def list_clusters() -> list[str]:
    return sorted(p.stem for p in (data_dir() / "clusters").glob("*.toml"))


def _synthetic_size(name: str) -> int | None:
    if name in SYNTHETIC:
        return SYNTHETIC[name]
    m = re.fullmatch(r"synthetic-(\d+)(k?)", name)
    if m:
        n = int(m.group(1)) * (1000 if m.group(2) else 1)
        if not 2 <= n <= MAX_SYNTHETIC:
            raise UnknownName(f"graph {name!r}: a synthetic graph has 2 to {MAX_SYNTHETIC:,} ops, not {n:,}")
        return n
    return None


def _file_or_bundled(s: str, suffix: str, folder: str, load):
    """``load`` of the file ``s`` names (a path, or anything ending in ``suffix``), else of the
    bundled ``folder/s<suffix>``; None where neither is there."""
    p = Path(s)
    if p.suffix == suffix or p.is_file():
        return load(p)
    bundled = data_dir() / folder / f"{s}{suffix}"
    return load(bundled) if bundled.exists() else None


def load_graph(name_or_path) -> "_graph.OpGraph":
    """A graph from a file path, a bundled name or a synthetic name."""
    s = str(name_or_path)
    g = _file_or_bundled(s, ".npz", "graphs", _graph.load)
    if g is not None:
        return g
    n = _synthetic_size(s)
    if n is not None:
        return layered(n, seed=n, name=s)
    raise UnknownName(f"unknown graph {s!r}: not a file, and not one of {', '.join(list_graphs())} "
                      f"(or synthetic-N for a generated graph of N ops)")


def load_cluster(name_or_path) -> "_cluster.Cluster":
    """A cluster from a TOML path or a bundled preset name."""
    s = str(name_or_path)
    c = _file_or_bundled(s, ".toml", "clusters", _cluster.load)
    if c is not None:
        return c
    raise UnknownName(f"unknown cluster {s!r}: not a file, and not one of {', '.join(list_clusters())}")
