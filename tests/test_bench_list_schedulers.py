"""benchmarks/list_schedulers.py: one checkout paired with another in fresh processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_paired_with_itself_places_the_same_at_about_the_same_speed(tmp_path):
    # another "version": this same source as a placetool package of its own
    pkg = tmp_path / "placetool"
    pkg.mkdir()
    shutil.copy(ROOT / "placetool" / "__init__.py", pkg / "__init__.py")
    for name in ("costmodel", "search", "rl", "cli", "data"):
        (pkg / name).symlink_to(ROOT / name)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "list_schedulers.py"), "--instances",
                        "synthetic-1k:k80x4", "--reps", "1", "--rounds", "2", "--against", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=300, check=True)
    rows = json.loads(r.stdout)
    assert set(rows) == {f"synthetic-1k:k80x4/{d}/{k}" for d in ("all", "gpus") for k in ("heft", "rule", "m-etf")}
    for row in rows.values():
        assert row["same_placement"] and row["ms_this"] > 0 and row["ms_other"] > 0
        assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
    assert "round 2/2 done" in r.stderr
