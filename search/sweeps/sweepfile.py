"""Sweep files: the TOML grid of (graph, cluster, method, seed, budget, options) that
``placetool sweep`` runs (:mod:`placetool.search.sweeps.sweep`), read and checked before
any run starts: names, types, option names against each method's signature. Relative
paths are taken from the sweep file's folder.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from placetool.costmodel.errors import UserError

SWEEP_KEYS = {"name", "graphs", "clusters", "methods", "seeds", "budget_seconds", "budget_evals",
              "timeout_seconds"}
TOP_KEYS = {"sweep", "options"}


class SweepError(UserError):
    """A sweep file that cannot run as written; the message names the file and field."""


# --------------------------------------------------------------------- the file
@dataclass(frozen=True)
class Run:
    """One grid point, with what a worker needs to run it (all plain, picklable data)."""

    graph: str                 # as written in the sweep file (the name reported)
    graph_source: str          # a bundled/synthetic name or an absolute path
    cluster: str
    cluster_source: str
    method: str
    seed: int
    budget_evals: int | None
    budget_seconds: float | None
    options: tuple = ()        # sorted (name, value) pairs
    placements_dir: str | None = None
    timeout_seconds: float | None = None

    @property
    def budget(self) -> str:
        return budget_label(self.budget_evals, self.budget_seconds)

    @property
    def options_json(self) -> str:
        return json.dumps(dict(self.options), sort_keys=True)

    @property
    def key(self) -> tuple:
        """The store's unique key (see :data:`placetool.search.sweeps.store.KEY`)."""
        return (self.graph, self.cluster, self.method, self.seed, self.budget, self.options_json)

    def __hash__(self) -> int:  # option values may be lists or tables (unhashable)
        return hash(self.key)

    def label(self) -> str:
        return f"{self.method} on {self.graph}/{self.cluster} seed {self.seed}"


def budget_label(evals, seconds) -> str:
    parts = []
    if evals is not None:
        parts.append(f"evals={int(evals)}")
    if seconds is not None:
        parts.append(f"seconds={float(seconds):g}")
    return ",".join(parts)


@dataclass
class Sweep:
    """A parsed, checked sweep file; :meth:`runs` is its grid."""

    path: Path
    name: str
    graphs: list[str]
    clusters: list[str]
    methods: list[str]
    seeds: list[int]
    budget_evals: int | None
    budget_seconds: float | None
    timeout_seconds: float | None = None
    options: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)  # ("graph"|"cluster", name) -> source

    def runs(self, placements_dir=None) -> list[Run]:
        out = []
        pdir = None if placements_dir is None else str(Path(placements_dir).resolve())
        for g in self.graphs:
            for c in self.clusters:
                for m in self.methods:
                    for s in self.seeds:
                        out.append(Run(g, self.sources["graph", g], c, self.sources["cluster", c], m, s,
                                       self.budget_evals, self.budget_seconds,
                                       tuple(sorted(self.options.get(m, {}).items())), pdir,
                                       self.timeout_seconds))
        return out

    def __len__(self) -> int:
        return len(self.graphs) * len(self.clusters) * len(self.methods) * len(self.seeds)


def load_sweep(path) -> Sweep:
    """Read and check a sweep file; :class:`SweepError` names the field at fault."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: not valid TOML ({e})") from None
    except RecursionError:
        raise SweepError(f"{path}: not valid TOML (nested too deeply)") from None
    except IsADirectoryError:
        raise SweepError(f"{path}: is a folder, not a sweep file") from None
    return parse_sweep(doc, path)


def parse_sweep(doc: dict, path=Path("<sweep>")) -> Sweep:
    """Check a sweep document (the parsed TOML) and resolve its names."""
    path = Path(path)
    where = str(path)
    extra = set(doc) - TOP_KEYS
    if extra:
        raise SweepError(f"{where}: unknown table or key {sorted(extra)[0]!r} (expected [sweep] and [options.METHOD])")
    sw = doc.get("sweep")
    if not isinstance(sw, dict):
        raise SweepError(f"{where}: no [sweep] table")
    extra = set(sw) - SWEEP_KEYS
    if extra:
        raise SweepError(f"{where}: [sweep] has unknown key {sorted(extra)[0]!r} (known: {', '.join(sorted(SWEEP_KEYS))})")

    def names(key):
        v = sw.get(key)
        if v is None:
            raise SweepError(f"{where}: [sweep] {key} is missing")
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
            raise SweepError(f"{where}: [sweep] {key} must be a non-empty list of names")
        _no_duplicates(where, key, v)
        return v

    graphs, clusters, methods = names("graphs"), names("clusters"), names("methods")
    seeds = sw.get("seeds", [0])
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise SweepError(f"{where}: [sweep] seeds must be a non-empty list of integers >= 0")
    _no_duplicates(where, "seeds", seeds)
    evals = sw.get("budget_evals")
    seconds = sw.get("budget_seconds")
    if evals is None and seconds is None:
        raise SweepError(f"{where}: [sweep] needs budget_seconds or budget_evals")
    if evals is not None and (not isinstance(evals, int) or isinstance(evals, bool) or evals <= 0):
        raise SweepError(f"{where}: [sweep] budget_evals must be a positive integer, got {evals!r}")
    if seconds is not None and (not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
                                or not 0 < seconds < float("inf")):
        raise SweepError(f"{where}: [sweep] budget_seconds must be a positive finite number, got {seconds!r}")
    timeout = sw.get("timeout_seconds")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or not 0 < timeout < float("inf")):
        raise SweepError(f"{where}: [sweep] timeout_seconds must be a positive finite number, got {timeout!r}")
    name = sw.get("name", path.stem)
    if not isinstance(name, str):
        raise SweepError(f"{where}: [sweep] name must be a string")

    base = path.resolve().parent
    sources = {}
    for g in graphs:
        sources["graph", g] = _graph_source(g, base, where)
    for c in clusters:
        sources["cluster", c] = _cluster_source(c, base, where)
    options = _check_methods(methods, doc.get("options", {}), where)
    return Sweep(path, name, graphs, clusters, methods, list(seeds), evals,
                 None if seconds is None else float(seconds), None if timeout is None else float(timeout),
                 options, sources)


def _no_duplicates(where, key, values) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise SweepError(f"{where}: [sweep] {key} lists {v!r} twice")
        seen.add(v)


def _local_path(name: str, base: Path) -> Path | None:
    for p in (base / name, Path(name)):
        if p.is_file():
            return p.resolve()
    return None


def _graph_source(name: str, base: Path, where: str) -> str:
    from placetool.costmodel import presets

    p = _local_path(name, base)
    if p is not None:
        return str(p)
    try:
        synthetic = presets._synthetic_size(name)
    except UserError as e:  # synthetic-N of a size not generated
        raise SweepError(f"{where}: {e}") from None
    if (presets.data_dir() / "graphs" / f"{name}.npz").is_file() or synthetic is not None:
        return name
    raise SweepError(f"{where}: unknown graph {name!r}: not a file, and not one of {', '.join(presets.list_graphs())}")


def _cluster_source(name: str, base: Path, where: str) -> str:
    from placetool.costmodel import presets

    p = _local_path(name, base)
    src = str(p) if p is not None else name
    if p is None and not (presets.data_dir() / "clusters" / f"{name}.toml").is_file():
        raise SweepError(f"{where}: unknown cluster {name!r}: not a file, and not one of "
                         f"{', '.join(presets.list_clusters())}")
    try:
        presets.load_cluster(src)  # cheap; a malformed cluster file fails here, not in 100 runs
    except UserError as e:
        raise SweepError(f"{where}: cluster {name!r}: {e}") from None
    return src


def _check_methods(methods: list[str], options, where: str) -> dict:
    from placetool import search

    known = search.methods()
    for m in methods:
        if m not in known:
            raise SweepError(f"{where}: unknown method {m!r} (known: {', '.join(known)})")
    if not isinstance(options, dict):
        raise SweepError(f"{where}: options must be tables [options.METHOD]")
    for m, opts in options.items():
        if m not in methods:
            raise SweepError(f"{where}: [options.{m}] is for a method the sweep does not run")
        if not isinstance(opts, dict):
            raise SweepError(f"{where}: [options.{m}] must be a table of option = value")
    out = {}
    for m in methods:
        try:
            search.get(m)
        except UserError:
            raise
        except Exception as e:  # a method module that does not import: fail now, not in every run
            raise SweepError(f"{where}: method {m!r} cannot be loaded ({type(e).__name__}: {e})") from None
        if m in options:
            try:
                out[m] = search.check_options(m, options[m])  # names and kinds, before any run
            except search.SearchError as e:
                raise SweepError(f"{where}: [options.{m}] {e}") from None
    return out
