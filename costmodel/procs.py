"""Process and thread helpers: whether a process runs (the sweep pool, the TF worker
testbed), the threads the simulators share their work out to, and a file descriptor sent
elsewhere while C code prints on it."""

from __future__ import annotations

import contextlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor


@contextlib.contextmanager
def fd_redirected(fd: int, to: int | None = None):
    """File descriptor ``fd`` goes to descriptor ``to`` meanwhile (None: the null device):
    for what C and C++ libraries print past Python's streams (METIS on stdout, TensorFlow's
    profiler client), so that ``--json`` output stays JSON. Python's and C's buffers are
    flushed on the way in and out, so nothing lands on the wrong side."""
    import ctypes

    libc = ctypes.CDLL(None)

    def flush():
        sys.stdout.flush()
        sys.stderr.flush()
        libc.fflush(None)

    flush()
    saved = os.dup(fd)
    try:
        if to is None:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        else:
            os.dup2(to, fd)
        yield
    finally:
        flush()
        os.dup2(saved, fd)
        os.close(saved)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (an ended child that
    nobody has waited for yet). A process owned by another user counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no /proc (not Linux), or it ended just now: kill(0) said it was there
        return True


_POOL: list = [None, 0, 0]  # the shared threads: executor, its size, the process that made it


def thread_pool(n: int) -> ThreadPoolExecutor:
    """At least ``n`` threads, shared by every caller in this process (made again in a
    forked child, which has none of its parent's threads and would wait on them forever)."""
    pool, size, pid = _POOL
    if pool is None or size < n or pid != os.getpid():
        # room for a thread per core from the start (the executor starts threads only as
        # work needs them), so a caller asking for more threads later seldom replaces it:
        # a replaced pool's threads would idle on, since a caller may still hold it
        size = max(n, os.cpu_count() or 1)
        _POOL[:] = [ThreadPoolExecutor(size, thread_name_prefix="placetool"), size, os.getpid()]
    return _POOL[0]


def run_shares(k: int, share) -> list:
    """``[share(0), ..., share(k - 1)]``: share 0 on this thread, the others on
    :func:`thread_pool`'s threads at the same time (the shares run compiled code that
    releases the GIL)."""
    pool = thread_pool(k - 1) if k > 1 else None
    futures = [pool.submit(share, t) for t in range(1, k)]
    first = share(0)
    return [first] + [f.result() for f in futures]
