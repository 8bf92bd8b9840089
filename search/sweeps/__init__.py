"""Experiment tooling over the search methods: grids of runs and what they found.

:mod:`~placetool.search.sweeps.sweep` runs a grid of (graph, cluster, method, seed,
budget, options) in worker processes or on a Dask cluster,
:mod:`~placetool.search.sweeps.store` keeps each result as a row of an SQLite store, and
:mod:`~placetool.search.sweeps.report` turns a store into tables and figures
(``placetool sweep`` and ``placetool report``). No search method lives here: the registry
does not look in this package.
"""
