"""The error the rl modules raise when a policy cannot be built, loaded or used.

Its own module so that :mod:`placetool.rl.gdp_net` (the network in numpy) and
:mod:`placetool.rl.policies` (which builds on it) both raise it without importing each
other; :mod:`placetool.rl.policies` re-exports it.
"""

from __future__ import annotations

from placetool.costmodel.errors import UserError


class PolicyError(UserError):
    """A policy cannot be built, loaded or used as asked."""
