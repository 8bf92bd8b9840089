"""The TensorFlow bridge: import, model zoo, runner, testbed, calibration, export.

Nothing here imports TensorFlow until it is used.
"""


def __getattr__(name):
    # `from placetool.costmodel.tf import apply_placement` without importing TF up front
    if name in ("apply_placement", "run_export", "write_export"):
        from . import export

        return getattr(export, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
