"""Bundled data: graphs (``graphs/*.npz``), cluster presets (``clusters/*.toml``), example
sweeps (``sweeps/*.toml``); read through :mod:`importlib.resources`, so it works from a
wheel as well as from the source tree."""
