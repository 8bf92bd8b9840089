"""The sweep results store: one SQLite table ``runs``, one row per grid point.

A grid point is (graph, cluster, method, seed, budget, options); the table has a unique
key on it, so re-running a sweep replaces a row instead of adding one, and a sweep can
skip the points already ``ok`` (resume). Only the sweep driver writes (workers return
their records to it), so there is a single writer and no locking between workers.

Several drivers may share one store (two ``placetool sweep`` runs on one file, on one
machine or on several over a shared disk): a driver *claims* a grid point (table
``claims``) before it starts it, so each point runs once and the drivers split the
grid. A claim whose driver died is taken over: at once on the same host (its pid is
gone), after ``CLAIM_LEASE_S`` without a heartbeat from another host.

>>> import tempfile, os
>>> s = ResultStore(os.path.join(tempfile.mkdtemp(), "r.db"))
>>> s.put({"graph": "g", "cluster": "c", "method": "single", "seed": 0, "budget": "evals=1",
...        "options": "{}", "status": "ok", "step_time_us": 5.0})
>>> s.put({"graph": "g", "cluster": "c", "method": "single", "seed": 0, "budget": "evals=1",
...        "options": "{}", "status": "ok", "step_time_us": 4.0})
>>> [r["step_time_us"] for r in s.rows()]
[4.0]
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

from placetool.costmodel.errors import UserError

SCHEMA_VERSION = 1
KEY = ("graph", "cluster", "method", "seed", "budget", "options")
CLAIM_LEASE_S = 2 * 3600.0  # a claim from another host with no heartbeat this long is dead

STATUSES = ("ok", "failed")
# (column, SQL type); the order is the table's column order.
COLUMNS = (
    ("graph", "TEXT NOT NULL"),
    ("cluster", "TEXT NOT NULL"),
    ("method", "TEXT NOT NULL"),
    ("seed", "INTEGER NOT NULL"),
    ("budget", "TEXT NOT NULL"),          # canonical, e.g. "evals=100,seconds=5"
    ("options", "TEXT NOT NULL"),         # canonical JSON of the method options
    ("graph_source", "TEXT"),             # what loads it: a bundled/synthetic name or a file path
    ("cluster_source", "TEXT"),
    ("budget_evals", "INTEGER"),
    ("budget_seconds", "REAL"),
    ("status", f"TEXT NOT NULL CHECK (status IN ({', '.join(repr(x) for x in STATUSES)}))"),
    ("step_time_us", "REAL"),
    ("feasible", "INTEGER"),
    ("lower_bound_us", "REAL"),
    ("evaluations", "INTEGER"),
    ("seconds", "REAL"),                  # the search's own time
    ("wall_seconds", "REAL"),             # the whole run: loading, search, writing the placement
    ("n_ops", "INTEGER"),
    ("n_groups", "INTEGER"),
    ("n_devices", "INTEGER"),
    ("error", "TEXT"),                    # "Type: message" of a failed run
    ("traceback", "TEXT"),
    ("attempts", "INTEGER"),              # > 1 when a worker died under the run
    ("numba_threads", "INTEGER"),         # numba threads the run was pinned to
    ("host", "TEXT"),
    ("versions", "TEXT"),                 # JSON {placetool, python, numpy, numba}
    ("timestamp", "TEXT"),                # ISO 8601 UTC, when the run finished
    ("placement_path", "TEXT"),
    ("history", "TEXT"),                  # JSON [[evaluations, seconds, best_step_us], ...]
    ("metadata", "TEXT"),                 # JSON, what the method returned
    ("compile_seconds", "REAL"),          # numba compiling during the search (a machine's first runs), not in `seconds`
)
NAMES = tuple(c for c, _ in COLUMNS)
JSON_COLUMNS = ("options", "versions", "history", "metadata")


def _where() -> str:
    return " AND ".join(f"{c} = ?" for c in KEY)


def _claim_dead(c, host: str, now: float, lease_s: float) -> bool:
    """A claim whose driver is gone: a dead pid on this host, or an old heartbeat."""
    if c["host"] == host and c["pid"] is not None:
        import os

        try:
            os.kill(int(c["pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        try:  # an ended (zombie) driver
            with open(f"/proc/{int(c['pid'])}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            pass
    return c["heartbeat"] is None or now - float(c["heartbeat"]) > lease_s


def _key(row) -> tuple:
    """A row's grid point key, checked with its status: a damaged page can decode
    without an SQLite error, as values of another type (a flipped record header)."""
    key = tuple(row[:len(KEY)])
    ok = all(isinstance(v, int if c == "seed" else str) for c, v in zip(KEY, key))
    if not ok or row[len(KEY)] not in STATUSES:
        raise ValueError(f"grid point {key!r} with status {row[len(KEY)]!r}")
    return key


class StoreError(UserError):
    """A results file that is not a placetool results store (or a newer one)."""


class ResultStore:
    """The ``runs`` table of one SQLite file; creates it on first use."""

    def __init__(self, path, create: bool = True):
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise StoreError(f"{self.path}: no such results file")
        if create and not self.path.resolve().parent.is_dir():
            raise StoreError(f"cannot write {self.path}: folder {self.path.resolve().parent} does not exist")
        try:
            # rollback journal (not WAL): results files often live on network file systems
            self.db = sqlite3.connect(str(self.path), timeout=60)
            self.db.row_factory = sqlite3.Row
            self._check_or_create(create)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a results database, or a damaged one ({e})") from None
        except sqlite3.Error as e:  # e.g. a read-only file system when the table must be created
            raise StoreError(f"cannot open {self.path}: {e}") from None

    def _check_or_create(self, create: bool) -> None:
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "runs" not in tables:
            if not create:
                raise StoreError(f"{self.path}: has no 'runs' table (not written by placetool sweep)")
            cols = ",\n  ".join(f"{c} {t}" for c, t in COLUMNS)
            with self.db:  # IF NOT EXISTS: another sweep may be creating the same new file right now
                self.db.execute(f"CREATE TABLE IF NOT EXISTS runs (\n  id INTEGER PRIMARY KEY,\n  {cols},\n"
                                f"  UNIQUE ({', '.join(KEY)})\n)")
                self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: results schema version {version}, this placetool reads {SCHEMA_VERSION}")
        have = {r[1] for r in self.db.execute("PRAGMA table_info(runs)")}
        missing = [c for c in NAMES if c not in have]
        for c in KEY + ("status",):
            if c in missing:
                raise StoreError(f"{self.path}: table 'runs' lacks column {c!r}")
        if missing and create:  # a store from an earlier placetool: add the newer (nullable) columns
            with self.db:
                for c in missing:
                    self.db.execute(f"ALTER TABLE runs ADD COLUMN {c} {dict(COLUMNS)[c]}")

    # ------------------------------------------------------------------ claims
    def _claims_table(self) -> None:
        with self.db:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS claims ({', '.join(KEY)}, owner TEXT NOT NULL, "
                            f"host TEXT, pid INTEGER, heartbeat REAL, UNIQUE ({', '.join(KEY)}))")

    def row_versions(self) -> dict:
        """Grid point key -> (status, timestamp), for every row."""
        q = f"SELECT {', '.join(KEY)}, status, timestamp FROM runs"
        with self._errors("cannot read"):
            return {_key(r): tuple(r[len(KEY):]) for r in self.db.execute(q)}

    def row_version(self, key: tuple):
        """(status, timestamp) of a grid point's row, or None: tells whether another
        driver has recorded it since."""
        with self._errors("cannot read"):
            r = self.db.execute(f"SELECT status, timestamp FROM runs WHERE {_where()}", key).fetchone()
        return None if r is None else tuple(r)

    def claim(self, key: tuple, owner: str, seen=None, lease_s: float = CLAIM_LEASE_S) -> bool:
        """Claim a grid point for ``owner`` before running it. False if another live
        driver holds it, or its row changed since ``seen`` (:meth:`row_version` when this
        driver planned its work): someone else ran it meanwhile."""
        import os
        import socket
        import time

        host, now = socket.gethostname(), time.time()
        with self._errors("cannot claim a run in"):
            self._claims_table()
            self.db.execute("BEGIN IMMEDIATE")  # one driver at a time decides
            try:
                r = self.db.execute(f"SELECT status, timestamp FROM runs WHERE {_where()}", key).fetchone()
                if (None if r is None else tuple(r)) != seen:
                    self.db.execute("ROLLBACK")
                    return False
                c = self.db.execute(f"SELECT owner, host, pid, heartbeat FROM claims WHERE {_where()}",
                                    key).fetchone()
                if c is not None and c["owner"] != owner and not _claim_dead(c, host, now, lease_s):
                    self.db.execute("ROLLBACK")
                    return False
                self.db.execute(f"INSERT OR REPLACE INTO claims ({', '.join(KEY)}, owner, host, pid, heartbeat) "
                                f"VALUES ({', '.join('?' * (len(KEY) + 4))})", (*key, owner, host, os.getpid(), now))
                self.db.execute("COMMIT")
                return True
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    def release(self, owner: str, key: tuple | None = None) -> None:
        """Drop ``owner``'s claim on ``key`` (all of its claims when ``key`` is None)."""
        with self._errors("cannot release a claim in"):
            self._claims_table()
            with self.db:
                if key is None:
                    self.db.execute("DELETE FROM claims WHERE owner = ?", (owner,))
                else:
                    self.db.execute(f"DELETE FROM claims WHERE {_where()} AND owner = ?", (*key, owner))

    def heartbeat(self, owner: str) -> None:
        """Mark ``owner``'s claims as held by a live driver."""
        import time

        with self._errors("cannot update claims in"):
            self._claims_table()
            with self.db:
                self.db.execute("UPDATE claims SET heartbeat = ? WHERE owner = ?", (time.time(), owner))

    # ------------------------------------------------------------------ writing
    def put(self, record: dict) -> None:
        """Insert a run, replacing the row with the same grid point; committed at once."""
        row = {c: record.get(c) for c in NAMES}
        for c in JSON_COLUMNS:
            if row[c] is not None and not isinstance(row[c], str):
                row[c] = json.dumps(row[c], sort_keys=True)
        for c in KEY:
            if row[c] is None:
                raise ValueError(f"a run record needs {c!r}")
        marks = ", ".join("?" for _ in NAMES)
        with self._errors("cannot record a run in"):
            with self.db:
                self.db.execute(
                    f"INSERT INTO runs ({', '.join(NAMES)}) VALUES ({marks}) "
                    f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET "
                    + ", ".join(f"{c} = excluded.{c}" for c in NAMES if c not in KEY),
                    [row[c] for c in NAMES],
                )

    @contextlib.contextmanager
    def _errors(self, doing: str):
        """SQLite and JSON failures (read-only or full disk, a damaged file) as a
        StoreError naming the file."""
        try:
            yield
        except sqlite3.IntegrityError:  # a record that breaks the schema: a bug, not the file
            raise
        except sqlite3.Error as e:
            raise StoreError(f"{doing} {self.path}: {e}") from None
        except (ValueError, UnicodeDecodeError) as e:  # a damaged JSON column
            raise StoreError(f"{doing} {self.path}: damaged row ({e})") from None

    # ------------------------------------------------------------------ reading
    def statuses(self) -> dict[tuple, str]:
        """Grid point key -> status, for every row."""
        q = f"SELECT {', '.join(KEY)}, status FROM runs"
        with self._errors("cannot read"):
            return {_key(r): r[-1] for r in self.db.execute(q)}

    def rows(self, status: str | None = None) -> list[dict]:
        """All rows (or those with one status) as dicts, JSON columns decoded."""
        q = "SELECT * FROM runs" + (" WHERE status = ?" if status else "") + " ORDER BY " + ", ".join(KEY)
        out = []
        with self._errors("cannot read"):
            for r in self.db.execute(q, (status,) if status else ()):
                d = {c: None for c in NAMES} | dict(r)
                for c in JSON_COLUMNS:
                    if d.get(c) is not None:
                        d[c] = json.loads(d[c])
                _check_types(d)
                out.append(d)
        return out

    def count(self, status: str | None = None) -> int:
        q = "SELECT COUNT(*) FROM runs" + (" WHERE status = ?" if status else "")
        with self._errors("cannot read"):
            return self.db.execute(q, (status,) if status else ()).fetchone()[0]

    def close(self) -> None:
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()
        return False


#: columns that hold numbers (SQLite would store any value in them)
NUMERIC = {c: (int,) if t.startswith("INTEGER") else (int, float) for c, t in COLUMNS
           if t.startswith(("INTEGER", "REAL"))}


def _check_types(row: dict) -> None:
    """A row edited by hand or damaged on disk: ValueError naming the run and column
    (reported as a damaged row), rather than a crash in whatever reads it."""
    for c, kinds in NUMERIC.items():
        v = row.get(c)
        if v is not None and (isinstance(v, bool) or not isinstance(v, kinds)):
            raise ValueError(f"run {_label(row)}: {c} holds {v!r}, not a number")
    if row.get("status") == "ok" and row.get("step_time_us") is None:
        raise ValueError(f"run {_label(row)}: finished but has no step_time_us")


def _label(row: dict) -> str:
    return "/".join(str(row.get(c)) for c in ("graph", "cluster", "method", "seed"))
