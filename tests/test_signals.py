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
