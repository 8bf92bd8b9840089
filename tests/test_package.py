"""The installed package, as a user gets it: a wheel, not the source tree.

Builds the wheel, installs it (non-editable, without dependencies) into a throw-away venv
that borrows this venv's dependencies through a ``.pth`` line, and runs it from an empty
folder holding its own ``rl/``, ``search/`` and ``cli/`` packages, which must not shadow
placetool's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZOO = {"densenet121", "gnmt4", "gnmt8", "inception_v3", "mobilenet_v2", "nasnet_mobile", "nmt", "resnet50", "rnnlm",
       "transformer", "wavenet", "xception"}
PRESETS = {"k40x2", "k40x4", "k40x8", "k80x2", "k80x4", "p100x4", "v100x8"}


def readme_example() -> str:
    """The Python block under the README's "Python API" heading."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run(args, cwd, timeout=300):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_readme_example_prints_a_real_step_time(tmp_path):
    r = _run([sys.executable, "-c", readme_example()], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    step, feasible, *_ = r.stdout.splitlines()[0].split()
    assert float(step) > 0 and feasible == "True"


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    # build from a clean copy: setuptools reuses a build/ folder, where modules deleted
    # from the source would live on and slip into the wheel
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
              "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    assert r.returncode == 0, r.stderr
    wheel = next((tmp / "dist").glob("placetool-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp).check_returncode()
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "zz_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
              "--no-deps", "--no-compile", str(wheel)], cwd=tmp)
    assert r.returncode == 0, r.stderr
    return wheel, venv


@pytest.fixture
def decoy_dir(tmp_path):
    """A working directory whose own rl/, search/ and cli/ would break a shadowed import."""
    for name in ("rl", "search", "cli", "costmodel"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('user package {name} imported')\n")
    return tmp_path


@pytest.mark.slow
def test_wheel_carries_the_data(wheel_venv):
    import zipfile

    names = zipfile.ZipFile(wheel_venv[0]).namelist()
    assert {f"placetool/data/graphs/{g}.npz" for g in ZOO} <= set(names)
    assert {f"placetool/data/clusters/{c}.toml" for c in PRESETS} <= set(names)
    assert "placetool/data/sweeps/example.toml" in names
    assert not any(n.split("/")[0] in {"rl", "search", "cli", "costmodel", "data"} for n in names)


@pytest.mark.slow
def test_installed_wheel_runs_from_any_directory(wheel_venv, decoy_dir):
    venv = wheel_venv[1]
    bin_ = venv / "bin"
    r = _run([str(bin_ / "python"), "-c", "import placetool.costmodel as c; print(c.__file__)"], cwd=decoy_dir)
    assert r.returncode == 0 and str(venv) in r.stdout, (r.stdout, r.stderr)

    r = _run([str(bin_ / "placetool"), "info", "--list", "--json"], cwd=decoy_dir)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert ZOO <= {g["name"] for g in listed["graphs"]}
    assert PRESETS == {c["name"] for c in listed["clusters"]}

    r = _run([str(bin_ / "placetool"), "simulate", "-g", "nmt", "-c", "k80x4", "-p", "round-robin", "--json"],
             cwd=decoy_dir)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["feasible"] and out["step_time_us"] > 0

    r = _run([str(bin_ / "python"), "-c", readme_example()], cwd=decoy_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == "True"
