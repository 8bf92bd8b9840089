"""The tests' helpers (``tests/helpers.py``) for the benchmarks that reuse them, loaded
from their file.

The benchmarks import placetool as installed and put nothing on ``sys.path``: with the
repository's root there, ``costmodel``, ``search`` and ``rl`` would also import a second
time under their bare names. A script run as ``python benchmarks/NAME.py`` finds this
module beside it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "tests" / "helpers.py"


def _load(path: Path, name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


#: ``tests/helpers.py`` as a module (``random_problem``, ``ForegroundRun``, ...)
helpers = _load(HELPERS, "placetool_tests_helpers")
