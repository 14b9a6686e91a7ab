"""The Responses API's stored responses: each record is the response object as it was answered
and the conversation's items up to it (every earlier turn's input and output, then its own input),
so that a continuation (previous_response_id) or GET .../input_items needs that record alone,
whichever of its ancestors were dropped since.

    store = ResponseStore(home / "responses.sqlite3", max_records=256)
    store.put(Stored(response, items))    # then, past max_records, the least recently used go
    store.get("resp_...")                 # None when unknown, deleted or dropped
    store.get("resp_...", owner="alice")  # ... or another caller's (bubo.api.callers)

The records live in SQLite (the standard library's): each put is one transaction, so a record is
whole or absent, and they outlive the server. A file that cannot be opened or written (a folder
that is not writable, a full disk) does not stop the server: the store goes on in memory, keeps
what it had, and says why in the log and in `problem` (/health shows it). Every call runs in
gevent's thread pool when the caller is on the event loop (a commit may wait for the disk), one
at a time.

The KV context a response ended in is not held here: the prefix cache keeps the full blocks of
every prompt and answer (least recently used first out), so a continuation whose conversation is
still cached reads only its new tokens (and the last, partly filled block of the turn before);
one that was evicted (or comes after a restart) is read again from the stored items, with the
same answer."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gevent.monkey import get_original

from bubo.api.offload import blocking

log = logging.getLogger("bubo.api")
T = TypeVar("T")

DEFAULT_MAX_RECORDS = 256
FILE_NAME = "responses.sqlite3"
BUSY_TRIES = 3  # a file another server holds locked: each try waits up to 5 s (sqlite's timeout)
_SCHEMA = ("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, used REAL NOT NULL, record TEXT NOT NULL, "
           "owner TEXT)")


@dataclass
class Stored:
    """One stored response: the object as answered, and the conversation's items up to it (its
    input last), each with its id."""

    response: dict[str, Any]
    items: list[dict[str, Any]]
    owner: str | None = None  # the caller that stored it (a named key's; None: the unnamed caller)

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def history(self) -> list[dict[str, Any]]:
        """The items a continuation of this response starts with: its conversation, then its output."""
        return self.items + list(self.response.get("output") or [])


class ResponseStore:
    def __init__(self, path: Path | None, max_records: int = DEFAULT_MAX_RECORDS):
        """path None: in memory only (what an embedding program or a test gets by default)."""
        self.max_records = max_records
        self.path = path
        self.problem: str | None = None  # why the records are kept in memory only, when they should not be
        # the connection is used by one thread at a time (an OS lock: the pool's threads take it)
        self._lock = get_original("_thread", "allocate_lock")()
        self._conn = self._open(path)

    # --- the connection -----------------------------------------------------------------

    def _open(self, path: Path | None) -> sqlite3.Connection:
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(path, timeout=5.0, check_same_thread=False, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")  # a commit appends; readers of other servers go on
                conn.execute("PRAGMA synchronous=NORMAL")
                _create(conn)
                self._trim(conn)
                return conn
            except (OSError, sqlite3.Error) as e:
                self._degrade(f"cannot open {path}: {e}")
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        _create(conn)
        return conn

    def _degrade(self, why: str) -> None:
        self.problem = f"{why}; stored responses are kept in memory only (lost at exit)"
        log.warning("responses store: %s", self.problem)

    def _to_memory(self, e: sqlite3.Error) -> None:
        """The file failed a write: go on in memory with what it held (as far as it can be read)."""
        mem = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            self._conn.backup(mem)
        except sqlite3.Error:
            pass
        _create(mem)
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
        self._conn = mem
        self._degrade(f"writing {self.path} failed: {e}")

    def _trim(self, conn: sqlite3.Connection) -> None:
        """Drop the least recently used records past max_records."""
        conn.execute("DELETE FROM responses WHERE id IN (SELECT id FROM responses ORDER BY used DESC "
                     "LIMIT -1 OFFSET ?)", (self.max_records,))

    def _run(self, fn: Callable[[sqlite3.Connection], T], write: bool) -> T:
        """fn on the connection, one call at a time; in gevent's thread pool when called on the
        event loop. A write the file refuses moves the store to memory, and is done there."""
        def locked() -> T:
            with self._lock:
                for attempt in range(1, BUSY_TRIES + 1):
                    try:
                        return fn(self._conn)
                    except sqlite3.Error as e:
                        # another server on the same file holds its lock (past the 5 s wait): try
                        # again, then give up on this call; the file stays in use
                        if _busy(e) and attempt < BUSY_TRIES:
                            continue
                        if _busy(e) or not write or self.path is None or self.problem is not None:
                            raise
                        self._to_memory(e)
                        return fn(self._conn)
                raise AssertionError("unreachable")
        return blocking(locked)

    # --- the records --------------------------------------------------------------------

    def put(self, rec: Stored) -> None:
        """Keep rec (whole, or not at all); past max_records the least recently used go."""
        if self.max_records <= 0:
            return
        text = json.dumps({"response": rec.response, "items": rec.items}, ensure_ascii=False)

        def put(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")  # a refusal here leaves no transaction open
            try:
                conn.execute("INSERT OR REPLACE INTO responses (id, used, record, owner) VALUES (?, ?, ?, ?)",
                             (rec.id, time.time(), text, rec.owner))
                self._trim(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        try:
            self._run(put, write=True)
        except sqlite3.Error as e:  # the file is busy with another server: this one record is not kept
            log.warning("responses store: response %s was not stored: %s", rec.id, e)

    def get(self, id: str, owner: str | None = None) -> Stored | None:
        """The record (now the most recently used), or None (also when another caller than owner
        stored it)."""
        def get(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT record FROM responses WHERE id = ? AND owner IS ?", (id, owner)).fetchone()
            if row is None:
                return None
            try:
                conn.execute("UPDATE responses SET used = ? WHERE id = ?", (time.time(), id))
            except sqlite3.Error:
                pass  # a read-only moment of the file: the order of use is a hint, the record is what counts
            return str(row[0])
        text = self._run(get, write=False)
        if text is None:
            return None
        data = json.loads(text)
        return Stored(data["response"], data["items"], owner)

    def delete(self, id: str, owner: str | None = None) -> bool:
        """Forget owner's record; False when there was none."""
        def delete(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM responses WHERE id = ? AND owner IS ?", (id, owner)).rowcount > 0
        return self._run(delete, write=True)

    def ids(self, owner: str | None = None, limit: int = DEFAULT_MAX_RECORDS) -> list[str]:
        """owner's records' ids, the most recently used first (at most limit)."""
        def ids(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT id FROM responses WHERE owner IS ? ORDER BY used DESC LIMIT ?", (owner, limit))
            return [str(r[0]) for r in rows]
        return self._run(ids, write=False)

    def __len__(self) -> int:
        return self._run(lambda conn: int(conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0]), write=False)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _create(conn: sqlite3.Connection) -> None:
    """The table, and its owner column in a file made before callers had names (its records are
    the unnamed caller's)."""
    conn.execute(_SCHEMA)
    if "owner" not in [row[1] for row in conn.execute("PRAGMA table_info(responses)")]:
        conn.execute("ALTER TABLE responses ADD COLUMN owner TEXT")


def _busy(e: sqlite3.Error) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text
