"""Entry point: a click group whose subcommands load on first use.

Each command lives in its own module and is imported only when run, so that
``placetool simulate`` never pays for TensorFlow, Optuna or Dask.
"""

from __future__ import annotations

import contextlib
import functools
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
    "explain": "placetool.cli.explain:explain",
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
#: half-built library behind. And a compiled function boxing its result calls back into
#: numba's unpickler (``serialize.py``) for the classes it builds: Python runs a waiting
#: signal's handler there, compiled code does not expect an exception back, and the
#: process crashed (SIGSEGV) when the result was a named tuple, a SystemError otherwise.
#: An import is no place either: a module half run is left behind, and C code under an
#: import may clear the error (a Ctrl-C during `import networkx` was lost that way).
#: So a signal waits while llvmlite, numba's compiler, its cache or its unpickler, or an
#: import is on the stack (not merely numba's typing of call arguments, which every
#: compiled call runs).
_DEFER_IN = tuple(os.path.join(*parts) for parts in [
    (os.sep, "llvmlite", ""), ("numba", "core", "compiler.py"), ("numba", "core", "codegen.py"),
    ("numba", "core", "caching.py"), ("numba", "core", "serialize.py")]) + ("<frozen importlib.",)
#: frames of code that is no place for a raise of its own but runs between calls that are
#: (numba, llvmlite, the import machinery): a waiting signal is raised past them
_INTERNAL = (os.path.join(os.sep, "numba", ""),) + _DEFER_IN
#: while a signal waits: (its exception class, the SIGALRM handler to put back, the frame
#: traced to raise it in, the trace function to put back)
_pending = None
#: the exception a signal raised last, to know it again should it be dropped
_raised = None


def _in(frame, parts) -> bool:
    return any(part in frame.f_code.co_filename for part in parts)


def _unsafe_here(frame) -> bool:
    while frame is not None:
        if _in(frame, _DEFER_IN):
            return True
        frame = frame.f_back
    return False


def _resume_frame(frame):
    """The frame the stack unwinds to once the unsafe code on it has returned: the
    caller of its outermost unsafe frame (``frame`` itself where none is), or further out
    past numba's, llvmlite's and the import machinery's own frames."""
    outermost, f = None, frame
    while f is not None:
        if _in(f, _DEFER_IN):
            outermost = f
        f = f.f_back
    f = frame if outermost is None else outermost.f_back
    while f is not None and _in(f, _INTERNAL):
        f = f.f_back
    return f


def _raise_when_safe(exc_type, frame) -> None:
    """Raise ``exc_type`` now or, where that is unsafe (see ``_DEFER_IN``), once out of
    there (see :func:`_defer`)."""
    global _raised
    if _unsafe_here(frame):
        _defer(exc_type, frame)
        return
    _cancel_pending()
    _raised = exc_type()
    raise _raised


def _defer(exc_type, frame) -> None:
    """Raise ``exc_type`` once the unsafe code under ``frame`` has returned: at the first
    event of the frame it returns to (traced), or failing that at the first SIGALRM, every
    50 ms, that finds the stack safe. A cold numba cache compiles kernel after kernel with
    only moments in between: sampled alone, a signal waited for much of the chain (17-37 s
    on a first search, or more), and the trace costs only while one waits."""
    global _pending
    if _pending is None:
        previous = sys.gettrace()  # a debugger's or coverage's trace is left alone
        resume = _resume_frame(frame) if frame is not None and previous is None else None
        if resume is not None:
            resume.f_trace = _on_resume
            sys.settrace(_untraced)  # frames get line events only while a trace function is set
        _pending = (exc_type, signal.signal(signal.SIGALRM, _retry), resume, previous)
    signal.setitimer(signal.ITIMER_REAL, 0.05)


def _untraced(frame, event, arg):
    return None  # trace no new frame: only the resume frame's own trace function runs


def _on_resume(frame, event, arg):
    if _pending is None or frame is not _pending[2]:
        return None
    _raise_when_safe(_pending[0], frame)
    return _on_resume  # still unsafe (an import from here, say): the next event again


def _cancel_pending() -> None:
    global _pending
    if _pending is not None:
        exc_type, alarm, resume, previous = _pending
        _pending = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        if resume is not None:
            resume.f_trace = None
            sys.settrace(previous)


def _retry(signum, frame):
    if _pending is not None:
        _raise_when_safe(_pending[0], frame)


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
    _raise_when_safe(Terminated, frame)


def _on_sigint(signum, frame):
    _raise_when_safe(KeyboardInterrupt, frame)


def _on_unraisable(previous, u) -> None:
    # Python runs a signal handler wherever the main thread is, finalizers too (``__del__``,
    # weakref and ctypes callbacks): there the handler's exception is printed and dropped,
    # and the command would run on to the end of its budget. Raise it again once out.
    global _raised
    if u.exc_value is not None and u.exc_value is _raised:
        _raised = None
        _defer(type(u.exc_value), sys._getframe().f_back)  # the frame the finalizer interrupted
    else:
        previous(u)


def raise_if_stopped() -> None:
    """Raise again, where that is safe, the exception a signal raised if the command is
    still at work: called where work goes on (a search's progress), it stops a command
    whose exception was swallowed on its way out (C code that clears errors, a broad
    ``except``), which would otherwise run on to the end of its budget."""
    if _raised is not None and _pending is None:
        _raise_when_safe(type(_raised), sys._getframe().f_back)


@contextlib.contextmanager
def signals_unwind():
    """Within: SIGTERM raises :class:`Terminated` and Ctrl-C ``KeyboardInterrupt``
    (where Python's own handler is on; an ignored SIGINT stays ignored), but not inside
    numba's compiler or an import (it waits until that returns), and one a finalizer
    dropped is raised again. Main thread only; elsewhere (embedded use) signals are left
    alone."""
    global _raised
    try:
        prev_term = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        yield
        return
    prev_int = signal.getsignal(signal.SIGINT)
    if prev_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    prev_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_on_unraisable, prev_hook)
    try:
        yield
    finally:
        _raised = None
        sys.unraisablehook = prev_hook
        signal.signal(signal.SIGTERM, prev_term)
        if prev_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, prev_int)
        _cancel_pending()  # a signal still waiting when the command ended has nothing left to stop


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


def fail(message: str, code: int, as_json: bool, **extra) -> None:
    """Print an error as one line on stderr (one JSON object under ``--json``, with the
    keys of ``extra`` too) and exit."""
    message = " ".join(str(message).split())  # one line, whatever the exception held
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": code, **extra}), err=True)
    else:
        click.echo(f"placetool: {'error: ' if code == EXIT_USAGE else ''}{message}", err=True)
    if any(t.name in ("SessionCloseThread", "placetool-step") and t.is_alive() for t in threading.enumerate()):
        # TF still closing a session, or running a step, whose worker died: that thread
        # sits in C++, and interpreter shutdown would abort the process (SIGABRT) under it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv=None) -> None:
    """Run the CLI. Exit 0 ok, 1 nothing feasible or a run failed, 2 a user mistake (one
    line on stderr, no traceback), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    with signals_unwind():
        try:
            rv = cli.main(args=args, prog_name="placetool", standalone_mode=False)
        except click.exceptions.Abort:
            fail("interrupted", EXIT_INTERRUPTED, as_json)
        except click.exceptions.NoArgsIsHelpError as e:  # bare `placetool`: the help, as it is written
            click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message(), err=True)
            sys.exit(EXIT_USAGE)
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
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
