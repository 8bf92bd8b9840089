"""The docstrings' examples run, under the names a user imports (``placetool.*``).

``pytest --doctest-modules`` over ``costmodel/``, ``search/`` ... would import those
folders as the bare packages ``costmodel``, ``search`` ... (the repository root is their
parent), a second copy beside ``placetool.*``. So the modules are found here by their
files, mapped to their package names through pyproject.toml's ``package-dir``, and only
imported by the test that runs their examples: collecting imports nothing, TensorFlow
included. A module without ``>>>`` in its source is not imported at all.
"""

from __future__ import annotations

import doctest
import importlib
import io
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, Path]:
    """``{package name: folder}`` as pyproject.toml installs them."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in cfg["package-dir"].items()}


def modules() -> list[tuple[str, Path]]:
    """Every ``placetool.*`` module file, by its import name, sub-packages included."""
    out = {}
    for name, folder in package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.setdefault(".".join([name, *parts]), path)
    return sorted(out.items())


WITH_EXAMPLES = [(name, path) for name, path in modules() if ">>>" in path.read_text()]


def test_modules_with_examples_are_found():
    names = {n for n, _ in WITH_EXAMPLES}
    assert {"placetool.search.registry", "placetool.rl.env", "placetool.costmodel.graph"} <= names


@pytest.mark.parametrize("name", [n for n, _ in WITH_EXAMPLES])
def test_docstring_examples(name):
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]  # none: only comments
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t, out=out.write)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, out.getvalue()
