"""No orphans: a sweep (process pool on forkserver) or a search stopped by SIGTERM or
SIGKILL leaves none of its child processes running, as ``ps`` would show."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["INT", "TERM"])
def test_interrupted_search_keeps_the_best_so_far(tmp_path, start, sig, code):
    """Ctrl-C or SIGTERM during `search`: the best placement found so far is written and
    printed, the exit status says why, and no process of the run is left."""
    import json

    p = start(["search", "-g", "synthetic-300", "-c", "k80x2", "-m", "sa", "--budget-seconds", "300",
               "-o", "best.json", "--json"])
    time.sleep(12)  # load, compile from numba's cache, start annealing
    assert p.poll() is None, p.stderr.read()
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == code, err
    obj = json.loads(out)
    assert obj["interrupted"] is True and obj["evaluations"] > 0 and obj["out"] == "best.json"
    doc = json.loads((tmp_path / "best.json").read_text())
    assert doc["step_time_us"] == obj["step_time_us"] and len(doc["devices"]) == 300
    last = json.loads(err.strip().splitlines()[-1])
    assert last["exit_code"] == code and "best.json" in last["error"]
    assert wait_for(lambda: not session_pids(p.pid), 5)
