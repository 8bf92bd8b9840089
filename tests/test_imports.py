"""Everything imports the package as ``placetool.*``, never as the bare folders.

The folders ``costmodel/``, ``search/``, ``rl/`` and ``cli/`` sit at the top of the
repository and install as ``placetool.costmodel`` ... . Wherever the repository's root is
on ``sys.path`` (a benchmark that put it there, pytest's rootdir, ``python -c`` run from
it), ``import costmodel`` also works, and loads a second copy of each module: its own
numba kernels, classes that ``isinstance`` does not recognise, state that is not shared.
So no module, benchmark or test may import the bare names, in code, in a docstring's
examples or in a script it builds as a string, and no benchmark edits ``sys.path``.
"""

from __future__ import annotations

import ast
import doctest
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BARE = {"costmodel", "search", "rl", "cli", "data"}
PACKAGE = ("placetool", "costmodel", "search", "rl", "cli", "data")


def sources() -> list[Path]:
    files = [p for d in (*PACKAGE, "benchmarks", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    return [p for p in files if "__pycache__" not in p.parts and p != Path(__file__).resolve()]  # not the examples below


def code_in(tree: ast.AST):
    """(code, first line) of the module, then of each string in it that is Python (a
    script built for a subprocess) and of each docstring example."""
    yield tree, 0
    parser = doctest.DocTestParser()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value):
            continue
        text = node.value
        pieces = ([(ex.source, ex.lineno) for ex in parser.get_examples(text)] if ">>>" in text
                  else [(textwrap.dedent(text), 0)])
        for piece, offset in pieces:
            try:
                yield ast.parse(piece), node.lineno - 1 + offset
            except SyntaxError:  # prose, or a fragment of a script
                pass


def bare_imports(path: Path) -> list[str]:
    out = []
    for tree, first in code_in(ast.parse(path.read_text(), str(path))):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            out += [f"line {first + node.lineno}: {n}" for n in names if n.split(".")[0] in BARE]
    return out


def test_sources_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in sources()}
    assert {"costmodel/kernels.py", "search/registry.py", "rl/env.py", "cli/main.py", "benchmarks/simulator.py",
            "tests/helpers.py"} <= names


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_bare_imports(path):
    assert not bare_imports(path), f"{path.relative_to(ROOT)} imports the bare folders, not placetool.*"


def test_the_check_sees_each_form(tmp_path):
    code = '''
import costmodel.kernels
from search import run
def f():
    from rl.env import PlacementEnv
SCRIPT = "import sys\\nfrom cli.main import main\\n"
"""
>>> from costmodel import CostModel
"""
from placetool.search import run
from . import base
from tests.helpers import cluster
'''
    f = tmp_path / "m.py"
    f.write_text(code)
    assert {line.split(": ")[1] for line in bare_imports(f)} == {"costmodel.kernels", "search", "rl.env", "cli.main",
                                                                "costmodel"}


def sys_path_edits(path: Path) -> list[str]:
    out = []
    for tree, first in code_in(ast.parse(path.read_text(), str(path))):
        for node in ast.walk(tree):
            # sys.path.insert(...), sys.path.append(...), sys.path[...] = ..., sys.path = ...
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                    and node.value.id == "sys":
                out.append(f"line {first + node.lineno}")
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_leave_sys_path_alone(path):
    assert not sys_path_edits(path), f"{path.name} reads or edits sys.path: import the installed package instead"
