"""The error every search raises for a problem, budget or method that cannot be run as asked."""

from __future__ import annotations

from placetool.costmodel.errors import UserError


class SearchError(UserError):
    """A search cannot run as asked (unknown method, bad budget, nothing fits)."""
