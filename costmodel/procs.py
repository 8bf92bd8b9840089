"""Process and thread helpers: whether a process runs (the sweep pool, the TF worker
testbed), and the threads the simulators share their work out to."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor


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
