"""Options and helpers shared by the commands.

One vocabulary across commands: ``-g/--graph``, ``-c/--cluster``, ``-p/--placement``,
``-o/--out``, ``--profile FILE``, ``--budget-seconds/--budget-evals``, ``-n/--workers``,
``-q/--quiet`` and ``--json`` mean the same thing wherever they appear. Spellings that
earlier releases used are still accepted (``old=``) but no longer shown in ``--help``.
"""

from __future__ import annotations

import functools
import json
import sys
from contextlib import contextmanager

import click

from placetool.costmodel.errors import UserError, atomic_write

DEFAULT_GRAPH = "synthetic-1k"
DEFAULT_CLUSTER = "k80x4"


class Option(click.Option):
    """A click option whose ``old`` spellings still parse but are hidden from ``--help``."""

    def __init__(self, param_decls=None, old=(), **kw):
        super().__init__(list(param_decls or ()) + list(old), **kw)
        self.old_opts = tuple(old)

    def get_help_record(self, ctx):
        opts, secondary = self.opts, self.secondary_opts
        self.opts = [o for o in opts if o not in self.old_opts]
        self.secondary_opts = [o for o in secondary if o not in self.old_opts]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts, self.secondary_opts = opts, secondary


def option(*decls, old=(), **kw):
    """``click.option`` with hidden old spellings (``old=("--graphs",)``)."""
    return click.option(*decls, cls=Option, old=old, **kw)


def graph_option(default=DEFAULT_GRAPH, multiple=False, required=False, name="graph", old=(), help=None):
    return option("--graph", "-g", name, default=None if (required or multiple) else default,
                  show_default=not (required or multiple) and default is not None, multiple=multiple,
                  required=required, old=old,
                  help=help or ("Bundled graph name or path to a graph file"
                                + ("; repeatable, or comma-separated." if multiple else ".")))


def cluster_option(default=DEFAULT_CLUSTER, multiple=False, name="cluster", old=(), help=None):
    return option("--cluster", "-c", name, default=(default,) if multiple and default else default,
                  show_default=default is not None, multiple=multiple, old=old,
                  help=help or ("Bundled cluster preset or path to a cluster TOML file"
                                + ("; repeatable, or comma-separated." if multiple else ".")))


def placement_option(default=None, required=False):
    return option("--placement", "-p", "placement", default=default, required=required,
                  show_default=default is not None,
                  help="A placement JSON file, single:DEVICE, round-robin or random[:SEED].")


def out_option(help, required=False, folder=False, default=None, name="out"):
    return option("--out", "-o", name, required=required, default=default, show_default=default is not None,
                  type=click.Path(file_okay=not folder, dir_okay=folder), help=help)


def profile_option(help="A measured profile (placetool calibrate) for op times."):
    return option("--profile", "profile", type=click.Path(dir_okay=False), metavar="FILE", default=None, help=help)


def budget_options(seconds_help="Stop after this many seconds.", evals_help="Stop after this many simulated placements.",
                   seconds_default=None, seconds_old=()):
    def deco(f):
        f = option("--budget-evals", "budget_evals", type=click.IntRange(min=1), default=None, help=evals_help)(f)
        f = option("--budget-seconds", "budget_seconds", type=PositiveFloat(), default=seconds_default,
                   show_default=seconds_default is not None, old=seconds_old, help=seconds_help)(f)
        return f
    return deco


def workers_option(help, default=None, old=()):
    return option("--workers", "-n", "workers", type=click.IntRange(min=1), default=default,
                  show_default=default is not None, old=old, help=help)


quiet_option = option("--quiet", "-q", "quiet", is_flag=True, help="No progress or notes on stderr.")
json_option = option("--json", "as_json", is_flag=True,
                     help="Print one JSON object on stdout (errors: one JSON object on stderr).")


class PositiveFloat(click.ParamType):
    """A finite number > ``above`` (or >= ``at_least``): ``nan`` and ``inf`` are refused."""

    name = "float"

    def __init__(self, above: float = 0.0, at_least: float | None = None):
        self.above, self.at_least = above, at_least

    def convert(self, value, param, ctx):
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        lo_ok = x >= self.at_least if self.at_least is not None else x > self.above
        if not (lo_ok and x != float("inf")):
            bound = f">= {self.at_least:g}" if self.at_least is not None else f"> {self.above:g}"
            self.fail(f"{value!r} must be a finite number {bound}", param, ctx)
        return x


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
    cm = CostModel(g, c, profile=prof)
    reason = cm.stranded()  # no placement runs: say so before any command tries one
    if reason is not None:
        raise UserError(reason)
    return g, c, cm


def emit_json(obj) -> None:
    click.echo(json.dumps(_strict(obj), indent=2, default=_jsonable, allow_nan=False))


def write_json(path, obj) -> None:
    atomic_write(path, json.dumps(_strict(obj), indent=1, default=_jsonable, allow_nan=False) + "\n")


def _strict(x):
    """``x`` with every infinite or NaN number made null: JSON has no Infinity, and
    strict readers (jq, JavaScript) reject Python's (an infeasible step time is inf)."""
    import math

    import numpy as np

    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return [_strict(v) for v in x.tolist()]
    return x


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def check_writable(path, option: str | None = None, folder: bool = False, inputs: dict | None = None) -> None:
    """Fail before any work if an output cannot be written (a read-only or full file
    system, a missing folder, a folder in place of a file...): a small temporary file is
    written and removed where it will go. ``option`` names the flag in the message;
    ``folder``: the output is a folder, created later if missing, so its nearest
    existing parent is tried. ``inputs`` ({flag: value}): the command's input files,
    none of which the output may be (writing it would destroy the input)."""
    import os
    import tempfile
    from pathlib import Path

    if path is None:
        return
    p = Path(path)
    what = f"{option} {path}" if option else str(path)
    for flag, value in (inputs or {}).items():
        if value is not None and _same_file(path, value):
            raise UserError(f"{what} is also the {flag} input; writing it would destroy that file")
    if folder:
        if p.exists() and not p.is_dir():
            raise UserError(f"cannot write {what}: exists and is not a folder")
        probe = p.resolve()
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise UserError(f"cannot write {what}: {probe} is not a folder")
    else:
        if p.is_dir():
            raise UserError(f"cannot write {what}: it is a folder")
        probe = p.resolve().parent
        if probe.exists() and not probe.is_dir():
            raise UserError(f"cannot write {what}: {probe} is a file, not a folder")
        if not probe.is_dir():
            raise UserError(f"cannot write {what}: folder {probe} does not exist")
        if p.exists() and not os.access(p, os.W_OK):
            raise UserError(f"cannot write {what}: the file is read-only")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".placetool-probe-")
        try:
            os.write(fd, b"\0" * 4096)  # a full disk often still takes an empty file
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as e:
        raise UserError(f"cannot write {what}: {e.strerror or e} ({probe})") from None


def _same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` both exist and are one file (through links too)."""
    import os

    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except (OSError, ValueError, TypeError):
        return False


def fmt_us(us: float) -> str:
    """A step time for people: 1,234.5 µs or 12.3 ms or 1.23 s."""
    if us != us or us == float("inf"):
        return "inf"
    if us < 1e4:
        return f"{us:,.1f} µs"
    if us < 1e7:
        return f"{us / 1e3:,.2f} ms"
    return f"{us / 1e6:,.3f} s"


class Progress:
    """A progress bar on stderr (only on a terminal) that can show the best step time so
    far beside the count, and reaches 100% when its work ended normally."""

    def __init__(self, total: int, label: str, enabled: bool = True, file=None):
        self.total, self.pos, self.best = max(int(total), 0), 0, None
        self.bar = None
        file = file or sys.stderr
        if enabled and file.isatty():
            self.bar = click.progressbar(length=self.total, label=label, file=file, show_eta=True,
                                         show_percent=True, item_show_func=self._show)

    def _show(self, _item):
        return None if self.best is None else f"best {fmt_us(self.best)}"

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, exc_type, *a):
        if self.bar is not None:
            if exc_type is None:
                self.advance_to(self.total)
            self.bar.__exit__(exc_type, *a)
        return False

    def advance_to(self, pos: int, best: float | None = None) -> None:
        """Move to ``pos`` of ``total`` (never back); ``best``: best step time so far, µs."""
        if best is not None and best == best and best != float("inf"):
            self.best = best
        pos = min(max(int(pos), self.pos), self.total)
        if self.bar is not None and (pos > self.pos or best is not None):
            self.bar.update(pos - self.pos, current_item=self.best)
        self.pos = pos

    def update(self, n: int = 1, best: float | None = None) -> None:
        self.advance_to(self.pos + n, best)


def progress(total: int | None, label: str, enabled: bool = True) -> Progress:
    """A :class:`Progress` bar of ``total`` steps."""
    return Progress(total or 0, label, enabled)


#: what :func:`compile_note` says
COMPILE_NOTE = ("placetool: compiling kernels for this machine, once (a minute or two; numba keeps them "
                "for later runs, and search budgets leave this time out)")


_COMPILE_NOTED: list = []  # [True] once said


@contextmanager
def compile_note(enabled: bool = True):
    """Say on stderr, once a process, when one of placetool's kernels starts compiling
    inside the ``with``, why a machine's first run (or the first after an upgrade)
    pauses: with numba's cache warm, none of them compiles."""
    if not enabled:
        yield
        return
    from numba.core import event
    from numba.core.dispatcher import ObjModeLiftedWith

    class _Note(event.Listener):
        def on_start(self, ev):
            d = (ev.data or {}).get("dispatcher")
            if isinstance(d, ObjModeLiftedWith):
                # a kernel's ``with objmode`` block (the list schedulers' clock reading) is
                # compiled again in every process, even from a warm cache, in a fraction of
                # a second: it is not the first run's pause, and "once" would be untrue
                return
            fn = getattr(d, "py_func", None)
            if not _COMPILE_NOTED and getattr(fn, "__module__", "").startswith("placetool."):
                _COMPILE_NOTED.append(True)
                # on a terminal, over the progress bar's line (it is drawn again on its next step)
                click.echo(("\r\033[K" if sys.stderr.isatty() else "") + COMPILE_NOTE, err=True)

        def on_end(self, ev):
            pass

    note = _Note()
    event.register("numba:compile", note)
    try:
        yield
    finally:
        event.unregister("numba:compile", note)


def notes_compiles(command):
    """Decorator (below ``@click.command``'s options): the command runs inside
    :func:`compile_note`, which is off under its ``--json`` or ``--quiet``."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        with compile_note(not (kwargs.get("as_json") or kwargs.get("quiet"))):
            return command(*args, **kwargs)

    return run
