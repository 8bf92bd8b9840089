"""Errors that mean "the user gave something wrong", and safe file writing."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


class UserError(ValueError):
    """Bad input from a user: the CLI prints the message on one line and exits 2."""


class OutputError(UserError, OSError):
    """A file that cannot be written (read-only or full disk, no permission); names it."""


@contextlib.contextmanager
def atomic_output(path):
    """A temporary path beside ``path`` (same suffix, for writers that pick a format by
    it) that replaces ``path`` only when the block ends without error: readers never see
    a half-written file. A failure is an :class:`OutputError` naming ``path``, and
    nothing is left behind. A symbolic link is written through (its target is replaced,
    the link stays); a device, pipe or socket is written into directly, as it cannot be
    replaced by a file."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file() and not path.is_dir():
        try:
            yield str(path)
        except OSError as e:
            if isinstance(e, UserError):
                raise
            raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
        os.close(fd)
        yield tmp
        # mkstemp makes 0600 files; outputs are shared (results, placements on shared disks)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, UserError):
            raise
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path, data: bytes | str) -> None:
    """Write a file all at once (see :func:`atomic_output`)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def read_parsed(path, parse, error, what: str, malformed: str, parse_errors, *, missing: str | None = None,
                unreadable: str = ""):
    """``parse(path)``; a missing, unreadable or malformed file raises ``error`` naming it:
    "no such {what} file" (or ``missing``), "is a folder, not a {what} file", "cannot
    read{unreadable} (...)", or "{malformed} (...)" for ``parse_errors`` (a RecursionError
    among them reads "nested too deeply")."""
    try:
        return parse(path)
    except FileNotFoundError:
        raise error(missing or f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a {what} file") from None
    except OSError as e:
        raise error(f"{path}: cannot read{unreadable} ({e.strerror or e})") from None
    except parse_errors as e:
        raise error(f"{path}: {malformed} ({'nested too deeply' if isinstance(e, RecursionError) else e})") from None


def read_json(path, what: str, error=UserError, **json_kw):
    """Parse a JSON file; a missing or malformed file raises ``error`` naming it.
    ``json_kw``: passed to ``json.loads`` (e.g. number hooks)."""
    import json

    path = Path(path)
    try:
        return json.loads(path.read_text(), **json_kw)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a {what} file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON (nested too deeply)") from None
