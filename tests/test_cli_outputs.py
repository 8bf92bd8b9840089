"""Outputs that cannot be written fail before the work, in one line naming the path,
exit 2, and leave no half-written file. Read-only and full file systems are real
mounts in a private mount namespace (``unshare``; skipped where that is not allowed)."""

import functools
import json
import shutil
import subprocess
import sys
import time

import pytest

RO = 'mount -t tmpfs -o ro,size=1m tmpfs "$0" && exec "$@"'
RO_BIND = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
FULL = 'mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@"'
SWEEP = '[sweep]\ngraphs = ["synthetic-40"]\nclusters = ["k80x2"]\nmethods = ["single", "random"]\nbudget_evals = 8\n'


@functools.cache
def can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs -o ro tmpfs "$0"', "/tmp"], capture_output=True)
    return r.returncode == 0


def placetool(*args, cwd=None, mount=None, at=None, timeout=300):
    cmd = [sys.executable, "-m", "placetool.cli.main", *map(str, args)]
    if mount:
        if not can_mount():
            pytest.skip("needs a private mount namespace (root and unshare)")
        at.mkdir(exist_ok=True)
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(at), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)


def one_line_error(r, *words, code=2):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert str(w) in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize("args", [
    ["search", "-g", "synthetic-300", "-m", "sa", "--budget-seconds", "60", "-o", "{RO}/x.json"],
    ["search", "-m", "rl", "--logdir", "{RO}/logs"],
    ["import", "mlp", "-o", "{RO}/g.npz"],
    ["calibrate", "-g", "mlp", "--local", "-o", "{RO}/p.json"],
    ["rl", "pretrain", "-g", "synthetic-50", "-o", "{RO}/policy"],
    ["rl", "pretrain", "-g", "synthetic-50", "-o", "pol", "--logdir", "{RO}/logs"],
    ["simulate", "--trace", "{RO}/t.json"],
    ["simulate", "--plot", "{RO}/g.png"],
    ["sweep", "s.toml", "--results", "{RO}/r.db"],
    ["sweep", "s.toml", "--results", "r.db", "--placements-dir", "{RO}/pl"],
], ids=lambda a: " ".join(a[:2]) + " " + next(x for x in a if "{RO}" in x).split("/")[-1])
def test_read_only_output_fails_before_the_work(tmp_path, args):
    (tmp_path / "s.toml").write_text(SWEEP)
    ro = tmp_path / "ro"
    t = time.perf_counter()
    r = placetool(*[a.replace("{RO}", str(ro)) for a in args], cwd=tmp_path, mount=RO, at=ro)
    one_line_error(r, ro, "Read-only file system")
    assert time.perf_counter() - t < 45  # never after a 60 s search
    assert not (tmp_path / "r.db").exists()  # sweep: no empty results file left behind
    assert not (tmp_path / "pol").exists()


def test_calibrate_checks_its_cluster_output_too(tmp_path):
    ro = tmp_path / "ro"
    r = placetool("calibrate", "-g", "mlp", "--local", "-o", tmp_path / "p.json", "--cluster-out", ro / "c.toml",
                  mount=RO, at=ro)
    one_line_error(r, "--cluster-out", ro / "c.toml")
    assert not (tmp_path / "p.json").exists()


@pytest.fixture(scope="module")
def results_db(tmp_path_factory):
    """A results store of one finished sweep of SWEEP (made once: a sweep starts a pool)."""
    d = tmp_path_factory.mktemp("store")
    (d / "s.toml").write_text(SWEEP)
    r = placetool("sweep", "s.toml", "--results", "r.db", "-n", "1", cwd=d)
    assert r.returncode == 0, r.stderr
    return d / "r.db"


def test_report_to_read_only_folder(tmp_path, results_db):
    ro = tmp_path / "ro"
    r = placetool("report", results_db, "--out", ro / "rep", mount=RO, at=ro)
    one_line_error(r, "--out", ro / "rep")


def test_read_only_results_after_the_first_run(tmp_path, results_db):
    d = tmp_path / "res"
    d.mkdir()
    shutil.copy(results_db, d / "r.db")
    before = (d / "r.db").read_bytes()
    (d / "s.toml").write_text(SWEEP.replace("budget_evals = 8", "budget_evals = 9"))  # new points to run
    r = placetool("sweep", "s.toml", "--results", "r.db", "-n", "1", "-q", cwd=d, mount=RO_BIND, at=d)
    one_line_error(r, "r.db")
    assert (d / "r.db").read_bytes() == before
    # a dry run only reads, so it works there
    r = placetool("sweep", "s.toml", "--results", "r.db", "--dry-run", cwd=d, mount=RO_BIND, at=d)
    assert r.returncode == 0 and "to run" in r.stdout, r.stderr


def test_full_disk_during_trace_leaves_no_file(tmp_path):
    full = tmp_path / "full"
    r = placetool("simulate", "-g", "synthetic-2k", "--trace", full / "t.json", "--plot", full / "g.png",
                  mount=FULL, at=full)
    one_line_error(r, full, "No space left on device")
    assert list(full.iterdir()) == []  # the mount is gone with its namespace; nothing leaked here


def test_full_disk_during_sweep(tmp_path):
    full = tmp_path / "full"
    (tmp_path / "s.toml").write_text(SWEEP.replace('budget_evals = 8', f'seeds = {list(range(100))}\nbudget_evals = 8'))
    # placements elsewhere: only the results store fills the disk (200 rows of ~1 KB: more than 64 KB)
    r = placetool("sweep", tmp_path / "s.toml", "--results", full / "r.db", "--placements-dir", tmp_path / "pl",
                  "-n", "1", "-q", mount=FULL, at=full)
    one_line_error(r, full / "r.db", "full")


def test_plot_format_checked_before_simulating(tmp_path):
    r = placetool("simulate", "-g", "synthetic-50", "--plot", tmp_path / "out.xyz")
    one_line_error(r, "--plot", "out.xyz", ".png")
    r = placetool("simulate", "-g", "synthetic-50", "--plot", tmp_path / "out.svg", "--json")
    assert r.returncode == 0 and (tmp_path / "out.svg").read_text().lstrip().startswith("<?xml")


def test_output_that_is_a_folder(tmp_path):
    (tmp_path / "x.json").mkdir()
    one_line_error(placetool("search", "-g", "synthetic-50", "-m", "single", "-o", tmp_path / "x.json"),
                   "--out", "is a directory")


def test_errors_under_json_are_one_json_object(tmp_path):
    r = placetool("simulate", "-g", "nope", "--json")
    assert r.returncode == 2 and r.stdout == ""
    obj = json.loads(r.stderr)
    assert obj["exit_code"] == 2 and "nope" in obj["error"]
