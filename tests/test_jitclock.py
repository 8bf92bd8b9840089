"""The work clock: budgets leave out the time numba spends compiling kernels."""

import time

import numba
import numpy as np
import pytest
from numba.core import event

from placetool.costmodel import CostModel, presets
from placetool.costmodel.jitclock import compile_seconds, work_clock
from placetool.search import Budget, Problem, Tracker, run
from placetool.search import registry as B

from .helpers import compiling


def _fresh_kernel(terms: int = 1, module: str = __name__):
    """A kernel no process has compiled yet (no cache): ``terms`` statements long, its
    function defined in ``module`` (as numba's compile event reports it)."""
    body = "\n".join(f"    s += x[{i % 7}] * {i + 1}.0" for i in range(terms))
    scope = {"__name__": module}
    exec(f"def f(x):\n    s = 0.0\n{body}\n    return s\n", scope)
    return numba.njit(cache=False)(scope["f"])


def test_a_first_call_counts_as_compiling_and_a_second_does_not():
    f, x = _fresh_kernel(200), np.arange(7.0)
    c0, t0 = compile_seconds(), time.perf_counter()
    assert f(x) == sum(x[i % 7] * (i + 1) for i in range(200))
    first, compiled = time.perf_counter() - t0, compile_seconds() - c0
    # a first call is its compile and a few microseconds of dispatch and running
    assert 0.5 * first < compiled <= first
    c1 = compile_seconds()
    f(x)
    assert compile_seconds() == c1


def test_work_clock_stands_still_while_compiling():
    w0, c0 = work_clock(), compile_seconds()
    compiling(0.3)
    assert compile_seconds() - c0 >= 0.3
    assert work_clock() - w0 < 0.1


def test_nested_compiles_count_once():
    c0 = compile_seconds()
    with event.trigger_event("numba:compile", data={}):
        compiling(0.2)  # a callee compiled inside its caller's compile
        time.sleep(0.1)
    assert 0.3 <= compile_seconds() - c0 < 0.4


def test_a_compile_that_fails_still_ends():
    w0 = work_clock()
    with pytest.raises(ValueError):
        with event.trigger_event("numba:compile", data={}):
            raise ValueError("typing error")
    time.sleep(0.2)
    assert work_clock() - w0 >= 0.2  # the clock runs again


def test_a_budget_of_seconds_is_not_spent_compiling():
    p = Problem(CostModel(presets.load_graph("synthetic-100"), presets.load_cluster("k80x2")))
    t = Tracker(p, Budget(seconds=0.2))
    compiling(0.4)
    assert not t.done() and t.seconds < 0.2 and t.compile_seconds >= 0.4
    with t.sub_budget(0.1):
        compiling(0.2)
        assert not t.done()


def _compiles_then_scores(problem, budget, seed, tracker):
    """A method whose kernels compile for longer than its budget, then score."""
    compiling(0.5)
    if tracker.done():
        return {"scored": 0}
    tracker.evaluate(np.zeros((1, problem.n_groups), np.int32))
    return {"scored": 1}


def test_a_cold_start_searches_its_whole_budget_and_reports_the_compile(monkeypatch):
    monkeypatch.setitem(B.REGISTRY, "compiles-then-scores", B.MethodInfo(
        "compiles-then-scores", _compiles_then_scores, "compiles, then scores", Budget(seconds=1.0), None))
    p = Problem(CostModel(presets.load_graph("synthetic-100"), presets.load_cluster("k80x2")))
    r = run("compiles-then-scores", p, Budget(seconds=0.3))
    assert r.metadata["scored"] == 1 and r.evaluations == 1
    assert r.seconds < 0.3 and r.compile_seconds >= 0.5
    assert r.to_dict()["compile_seconds"] == r.compile_seconds


def test_the_cli_says_once_why_a_first_run_pauses(monkeypatch, capsys):
    from placetool.cli import common

    monkeypatch.setattr(common, "_COMPILE_NOTED", [])
    x = np.arange(2.0)
    with common.compile_note(True):
        _fresh_kernel(module="someone.else")(x)  # not one of placetool's kernels: nothing to explain
    assert capsys.readouterr().err == ""
    with common.compile_note(False):
        _fresh_kernel(module="placetool.costmodel.kernels_of_a_test")(x)  # --quiet, --json
    assert capsys.readouterr().err == ""
    with common.compile_note(True):
        _fresh_kernel(module="placetool.costmodel.kernels_of_a_test")(x)
        _fresh_kernel(module="placetool.search.kernels_of_a_test")(x)
    assert capsys.readouterr().err == common.COMPILE_NOTE + "\n"
    with common.compile_note(True):
        _fresh_kernel(module="placetool.costmodel.kernels_of_a_test")(x)  # said already in this process
    assert capsys.readouterr().err == ""


def test_the_note_leaves_out_the_objmode_block_that_every_process_compiles(monkeypatch, capsys):
    """The list schedulers' clock reading (``with objmode``) compiles in every process,
    warm cache or not: saying "compiling ..., once" for it on every run was untrue."""
    import subprocess
    import sys

    from placetool.cli import common

    code = ("from placetool.cli import common\n"
            "from placetool.search.listsched_kernels import _out_of_time\n"
            "with common.compile_note(True):\n"
            "    _out_of_time(64, 1e300)\n")
    # fresh processes: the first may fill numba's cache for the kernel itself (a real
    # first run, which the note is for); in the second only the block compiles
    for _ in range(2):
        warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert common.COMPILE_NOTE not in warm.stderr
    monkeypatch.setattr(common, "_COMPILE_NOTED", [])
    with common.compile_note(True):
        _fresh_kernel(module="placetool.search.kernels_of_a_test")(np.arange(2.0))
    assert capsys.readouterr().err == common.COMPILE_NOTE + "\n"  # other kernels still say it


def test_a_child_forked_during_a_compile_has_a_running_clock():
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with event.trigger_event("numba:compile", data={}):  # another thread's compile, as the fork sees it
        q = ctx.Queue()
        child = ctx.Process(target=_report_clock, args=(q,))
        child.start()
        advanced = q.get(timeout=30)
        child.join(30)
    assert advanced >= 0.2


def _report_clock(q):
    w0 = work_clock()
    time.sleep(0.2)
    q.put(work_clock() - w0)


def test_an_end_without_its_start_leaves_the_clock_running():
    """Ctrl-C can land in the listener's start before it counts; numba still sends the end."""
    event.end_event("numba:compile", data={})
    w0 = work_clock()
    time.sleep(0.2)
    assert work_clock() - w0 >= 0.2
    c0 = compile_seconds()
    compiling(0.2)
    assert 0.2 <= compile_seconds() - c0 < 0.3


@pytest.mark.timeout(30)
def test_a_signal_handler_can_read_the_clock_while_its_thread_holds_it():
    """A sweep run's timeout handler reads the clock; the signal may land while the
    same thread is inside a reading."""
    from placetool.costmodel import jitclock

    with jitclock._COMPILES._lock:  # as if interrupted inside read()
        assert work_clock() > 0 and compile_seconds() >= 0
