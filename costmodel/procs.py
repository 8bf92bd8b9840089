"""Process helpers shared by the sweep pool and the TF worker testbed."""

from __future__ import annotations

import os


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
