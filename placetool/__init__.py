"""placetool: fast device placement for neural-network dataflow graphs.

The repository keeps ``costmodel/``, ``search/``, ``rl/``, ``cli/`` and ``data/`` at its
top; they install as ``placetool.costmodel``, ``placetool.search``, ``placetool.rl``,
``placetool.cli`` and ``placetool.data`` (see ``[tool.setuptools]`` in pyproject.toml), so
a user's own ``rl/`` or ``search/`` folder never shadows them.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("placetool")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
