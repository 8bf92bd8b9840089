"""Entry point: a click group whose subcommands load on first use.

Each command lives in its own module and is imported only when run, so that
``placetool simulate`` never pays for TensorFlow, Optuna or Dask.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import sys
import threading

import click

from placetool.costmodel.errors import UserError

# name -> "module:attribute"
COMMANDS = {
    "simulate": "placetool.cli.simulate:simulate",
    "info": "placetool.cli.info:info",
    "import": "placetool.cli.importer:import_cmd",
    "search": "placetool.cli.search:search",
    "calibrate": "placetool.cli.hardware:calibrate",
    "verify": "placetool.cli.hardware:verify",
    "testbed": "placetool.cli.hardware:testbed",
    "sweep": "placetool.cli.sweep:sweep",
    "report": "placetool.cli.sweep:report",
    "rl": "placetool.cli.rl:rl",
    "export": "placetool.cli.export:export",
    "show": "placetool.cli.show:show",
}


#: exit statuses (README, "Exit codes")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class Terminated(SystemExit):
    """SIGTERM (``timeout``, Slurm, PBS): unwinds like Ctrl-C, so pools and workers are
    stopped by the ``finally`` blocks on the way out; uncaught, it still exits 143."""

    def __init__(self):
        super().__init__(EXIT_TERMINATED)


#: code a signal's exception must not be raised in. LLVM calls back into llvmlite through
#: ctypes while numba compiles (or loads its cache), and an exception raised in a ctypes
#: callback is printed and dropped: the signal was lost and a search ran on to the end of
#: its budget. Raised just after such a call, in numba's code generation, it can leave a
#: half-built library behind, and the process crashed on the way out (SIGSEGV, once in a
#: test run). So a signal waits while llvmlite, numba's compiler or its cache is on the
#: stack (not merely numba's typing of call arguments, which every compiled call runs).
_DEFER_IN = tuple(os.path.join(*parts) for parts in [
    (os.sep, "llvmlite", ""), ("numba", "core", "compiler.py"), ("numba", "core", "codegen.py"),
    ("numba", "core", "caching.py")])
#: while a signal waits: (its exception class, the SIGALRM handler to put back)
_pending = None


def _in_compiler(frame) -> bool:
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _DEFER_IN):
            return True
        frame = frame.f_back
    return False


def _raise_when_safe(exc_type, frame) -> None:
    """Raise ``exc_type`` now, or, inside the compiler, once it has returned (checked
    every 50 ms on SIGALRM)."""
    global _pending
    if _in_compiler(frame):
        if _pending is None:
            _pending = (exc_type, signal.signal(signal.SIGALRM, _retry))
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    _cancel_pending()
    raise exc_type()


def _cancel_pending() -> None:
    global _pending
    if _pending is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, _pending[1])
        _pending = None


def _retry(signum, frame):
    if _pending is not None:
        _raise_when_safe(_pending[0], frame)


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
    _raise_when_safe(Terminated, frame)


def _on_sigint(signum, frame):
    _raise_when_safe(KeyboardInterrupt, frame)


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="placetool")
def cli():
    """placetool: place neural-network dataflow graphs on devices.

    Times are in microseconds, sizes in bytes. Graphs and clusters are given by bundled
    name (see `placetool info --list`) or by path.
    """


def fail(message: str, code: int, as_json: bool) -> None:
    """Print an error as one line on stderr (one JSON object under ``--json``) and exit."""
    message = " ".join(str(message).split())  # one line, whatever the exception held
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": code}), err=True)
    else:
        click.echo(f"placetool: {'error: ' if code == EXIT_USAGE else ''}{message}", err=True)
    if any(t.name == "SessionCloseThread" and t.is_alive() for t in threading.enumerate()):
        # TF still closing a session whose worker died: that thread sits in C++, and
        # interpreter shutdown would abort the process (SIGABRT) under it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv=None) -> None:
    """Run the CLI. Exit 0 ok, 1 nothing feasible or a run failed, 2 a user mistake (one
    line on stderr, no traceback), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    try:
        prev_term = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (embedded use): leave signals alone
        prev_term = None
    # Ctrl-C as Python's own handler would, but not inside the compiler; an ignored SIGINT
    # (a shell's background job) stays ignored
    prev_int = signal.getsignal(signal.SIGINT) if prev_term is not None else None
    if prev_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        rv = cli.main(args=args, prog_name="placetool", standalone_mode=False)
    except click.exceptions.Abort:
        fail("interrupted", EXIT_INTERRUPTED, as_json)
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx is not None else "placetool"
        fail(f"{e.format_message()} (see `{cmd} --help`)", EXIT_USAGE, as_json)
    except click.ClickException as e:
        fail(e.format_message(), e.exit_code, as_json)
    except UserError as e:
        fail(str(e), EXIT_USAGE, as_json)
    except OSError as e:  # a file system problem the command did not name itself
        where = f"{e.filename}: " if e.filename else ""
        fail(f"{where}{e.strerror or e}", EXIT_USAGE, as_json)
    except KeyboardInterrupt:
        fail("interrupted", EXIT_INTERRUPTED, as_json)
    except Terminated:
        fail("terminated", EXIT_TERMINATED, as_json)
    finally:
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)
        if prev_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, prev_int)
        _cancel_pending()  # a signal still waiting when the command ended has nothing left to stop
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
