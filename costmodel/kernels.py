"""Moved to :mod:`placetool.costmodel.engine` (state, queues, loop, checkpoints, entry
points); this module re-exports it for one release. The list schedulers' binary heaps
(``heap_push``, ``heap_pop``) are in :mod:`placetool.search.heaps`."""

from .engine import *  # noqa: F401,F403
from .engine import __all__  # noqa: F401
