"""No orphans: a sweep (process pool on forkserver) or a search stopped by SIGTERM or
SIGKILL leaves none of its child processes running, as ``ps`` would show."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import ForegroundRun

SWEEP = """[sweep]
graphs = ["synthetic-300"]
clusters = ["k80x2"]
methods = ["sa"]
seeds = [0, 1, 2, 3]
budget_seconds = 60
"""


def session_pids(sid: int) -> list[int]:
    """Every live (non-zombie) process of session ``sid``, wherever it was reparented."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            out.append(int(d.name))
    return out


@pytest.fixture
def start(tmp_path):
    """Start placetool in a new session: every descendant carries its id, even after the
    parent is gone. Whatever is left at the end is killed (after the test has looked)."""
    started = []

    def run(args):
        p = subprocess.Popen([sys.executable, "-m", "placetool.cli.main", *args], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        started.append(p.pid)
        return p

    yield run
    for sid in started:
        for pid in session_pids(sid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_for(cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_sweep_pool_leaves_no_orphans(tmp_path, start, sig):
    (tmp_path / "s.toml").write_text(SWEEP)
    p = start(["sweep", "s.toml", "--results", "r.db", "--workers", "2"])
    # parent + forkserver + 2 workers (+ the resource tracker) once the pool runs
    assert wait_for(lambda: len(session_pids(p.pid)) >= 4, 90), (session_pids(p.pid), p.poll())
    time.sleep(1.0)
    p.send_signal(sig)
    code = p.wait(timeout=30)
    assert code == (143 if sig == signal.SIGTERM else -9), p.stderr.read()
    assert wait_for(lambda: not session_pids(p.pid), 5), \
        [Path(f"/proc/{q}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for q in session_pids(p.pid)]
    if sig == signal.SIGTERM:
        err = p.stderr.read()
        assert err.strip().splitlines()[-1] == "placetool: terminated", err


POOL_WORKER_DIES = """
import os
from concurrent.futures import ProcessPoolExecutor
from placetool.search.sweeps import sweep

def die(_):
    os._exit(3)  # as SIGKILL would: no handler, no finalizer

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=sweep._mp_context(), initializer=sweep._init_worker,
                             initargs=(1, os.getpid())) as pool:
        try:
            pool.submit(die, 0).result()
        except Exception as e:
            print(type(e).__name__)
"""


def test_a_killed_pool_worker_leaves_nothing_for_the_resource_tracker(tmp_path):
    """A sweep worker that dies without cleaning up (killed after SIGTERM's grace, a crash)
    held no named semaphore: no "leaked semaphore" warning follows the driver's last line."""
    (tmp_path / "dies.py").write_text(POOL_WORKER_DIES)
    r = subprocess.run([sys.executable, "dies.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "BrokenProcessPool", r.stderr
    assert "leaked" not in r.stderr and "resource_tracker" not in r.stderr, r.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["INT", "TERM"])
def test_interrupted_search_keeps_the_best_so_far(tmp_path, sig, code):
    """Ctrl-C or SIGTERM during `search`: the best placement found so far is written and
    printed, the exit status says why, and no process of the run is left."""
    import json

    # stderr on a terminal, so the progress bar shows: it says when a placement was scored
    with ForegroundRun(["search", "-g", "synthetic-300", "-c", "k80x2", "-m", "sa", "--budget-seconds", "300",
                        "-o", "best.json"], tmp_path) as run:
        p = run.proc
        assert wait_for(lambda: b"best " in run.seen, 120), (bytes(run.seen), p.poll())
        p.send_signal(sig)
        try:
            out, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within 60 s of {sig.name}; its terminal said:\n" + "\n".join(run.lines()[-60:]))
    err = bytes(run.seen).decode(errors="replace")
    assert p.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last == f"placetool: {'interrupted' if code == 130 else 'terminated'} after " + last.split(" after ")[1]
    assert "best.json" in last
    assert "step time" in out and "placement written to best.json" in out  # the result, printed
    doc = json.loads((tmp_path / "best.json").read_text())
    assert len(doc["devices"]) == 300 and doc["step_time_us"] > 0
    assert wait_for(lambda: not session_pids(p.pid), 5)


def test_a_signal_inside_the_compiler_is_raised_once_it_returns():
    """SIGTERM landing while LLVM calls back into llvmlite through ctypes (numba compiling
    or loading its cache) is not lost: ctypes would print and drop an exception raised in
    the callback, so it is raised once the callback has returned."""
    import ctypes

    from placetool.cli import main as cli_main

    # a real ctypes callback whose code counts as llvmlite's, as LLVM's object-cache one does
    src = "def callback():\n    import os, signal, time\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(0.2)\n"
    ns = {}
    exec(compile(src, os.path.join(os.sep, "site-packages", "llvmlite", "binding", "callback.py"), "exec"), ns)
    callback = ctypes.CFUNCTYPE(None)(ns["callback"])
    prev_alrm = signal.getsignal(signal.SIGALRM)
    with pytest.raises(cli_main.Terminated), cli_main.signals_unwind():
        callback()  # the signal arrives inside; the callback returns normally ...
        time.sleep(1.0)  # ... and the exception comes here, before the sleep
    assert cli_main._pending is None and signal.getsignal(signal.SIGALRM) is prev_alrm
    assert sys.gettrace() is None


def test_a_signal_waiting_on_the_compiler_is_raised_before_the_next_compilation():
    """A cold numba cache compiles kernel after kernel with only moments in between; a
    signal that landed in one compilation is raised as soon as it returns, not at the
    end of the chain (a 50 ms timer alone found the gaps too seldom: 17-37 s, or more)."""
    import ctypes

    from placetool.cli import main as cli_main

    src = ("def callback():\n    import os, signal, time\n    os.kill(os.getpid(), signal.SIGTERM)\n"
           "    time.sleep(0.2)\n"
           "def compile_next(started):\n    import time\n    started.append(1)\n    time.sleep(0.5)\n")
    ns = {}
    exec(compile(src, os.path.join(os.sep, "site-packages", "llvmlite", "binding", "callback.py"), "exec"), ns)
    callback = ctypes.CFUNCTYPE(None)(ns["callback"])
    started = []
    with pytest.raises(cli_main.Terminated), cli_main.signals_unwind():
        callback()  # the signal arrives inside the first "compilation" ...
        ns["compile_next"](started)  # ... and the next one starts at once
    assert started == [] and cli_main._pending is None and sys.gettrace() is None


def test_a_signal_swallowed_on_its_way_stops_the_search_at_its_next_placement():
    """SIGTERM's exception caught and dropped on its way out (by C code that clears
    errors, or a broad ``except``) must not let `search` run on to the end of its
    budget: the progress report of the next scored placement raises it again."""
    from placetool import search as S
    from placetool.cli import main as cli_main
    from placetool.cli.common import load_problem
    from placetool.cli.search import _Bar

    _, _, cm = load_problem("synthetic-300", "k80x2", None)
    problem, budget = S.Problem(cm), S.Budget(seconds=60)
    with pytest.raises(cli_main.Terminated), cli_main.signals_unwind():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)
        except BaseException:  # swallowed
            pass
        t0 = time.monotonic()
        S.run("random", problem, budget, progress=_Bar(budget, False))
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("sig,exc", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)],
                         ids=["INT", "TERM"])
def test_a_signal_inside_a_finalizer_is_raised_once_it_returns(sig, exc):
    """Python runs a signal's handler wherever the main thread is, a ``__del__`` too, and
    drops an exception raised there (printed as "Exception ignored"): the command would
    run on to the end of its budget. The exception is raised again once out."""
    import gc

    from placetool.cli import main as cli_main

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), sig)
            time.sleep(0.2)  # the handler runs in here, and its exception is dropped

    prev = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.unraisablehook
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground
    try:
        with pytest.raises(exc), cli_main.signals_unwind():
            a = Finalized()
            a.cycle = a
            del a
            gc.collect()  # runs __del__ ...
            time.sleep(1.0)  # ... and the exception comes here, within 50 ms
        assert cli_main._pending is None and cli_main._raised is None
    finally:
        signal.signal(signal.SIGINT, prev[0])
        signal.signal(signal.SIGTERM, prev[1])
    assert sys.unraisablehook is prev[2]


def test_a_signal_during_an_import_is_raised_once_the_module_is_loaded(tmp_path, monkeypatch):
    """An exception raised in the middle of an import leaves a module half run (and C code
    under an import may drop it): the signal waits until the import is done."""
    from placetool.cli import main as cli_main

    (tmp_path / "slow_module_for_signals.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.2)\ncomplete = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(cli_main.Terminated), cli_main.signals_unwind():
        import slow_module_for_signals  # the signal arrives while its body runs ...

        assert slow_module_for_signals.complete
        time.sleep(1.0)  # ... and the exception comes here, within 50 ms
    assert sys.modules["slow_module_for_signals"].complete
    del sys.modules["slow_module_for_signals"]


BOXING = """
import os, signal, sys, threading, time
from typing import NamedTuple
import numpy as np
from numba import njit
from placetool.cli.main import signals_unwind

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground

class Pair(NamedTuple):
    a: np.ndarray
    b: np.ndarray

@njit
def slow_pair(n):
    s = 0.0
    for i in range(n):
        s += np.sqrt(i)
    return Pair(np.full(2, s), np.ones(3))

slow_pair(10)
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    with signals_unwind():
        r = slow_pair(1_000_000_000)  # the signal arrives in here (a second or so)
        time.sleep(1.0)
        print("not interrupted")
except KeyboardInterrupt:
    print("interrupted after the call returned", type(globals().get("r")).__name__)
"""


def test_a_signal_while_compiled_code_returns_a_named_tuple_is_raised_after_it():
    """A signal that arrives while a compiled function runs is handled when it boxes its
    result, inside numba's unpickler (called from compiled code to build the named tuple):
    raised there, the process crashed (SIGSEGV). It is raised once the call has returned.
    (The signal comes 0.2 s into a call of about a second, so a slow start still sees it.)"""
    p = subprocess.run([sys.executable, "-c", BOXING], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == ["interrupted after the call returned Pair"], p.stdout
