"""History: what the monitor receives, kept in SQLite, so a restart loses nothing that was written.

One file (default :func:`default_path`), opened by one monitor at a time (a
lock file beside it says so). Tables:

``frames``
    the monitor's frame table, with the same ids (``FrameTable`` ids), so
    stacks read back need no translation.
``sessions``
    one row per process (host, pid, process start time): its hello, the end
    times of its first and latest reports, and a snapshot of everything
    else the monitor knows of it (``Session.snapshot``: sample and report
    counts, threads, costs, agents, call rates).
``stacks``
    per session, each distinct stack once: frame ids, root first (msgpack).
``totals``
    per session, thread and stack: the whole run's wall and cpu samples,
    kept even after retention drops the reports they came from. The writer
    folds reports into it every ``TOTALS_INTERVAL_S`` (one upsert per stack
    then, not per report); ``sessions.totals_n`` is the last report folded
    in, and opening the file folds in any reports after it.
``reports``
    one row per report: its number in the session, when it ended, its
    length, sampling passes, seconds spent, budget, and its counts (msgpack
    ``[[thread, [stack, wall, cpu, stack, wall, cpu, ...]], ...]``).

Writes never block the receive loop: :meth:`History.add_report` puts a
reference to the report's (immutable) counts and a small snapshot on a
queue. One writer thread (``dyper-history``) owns the writing connection and
commits everything queued in one transaction every ``flush_interval_s``
(0.5 s). The file is in WAL mode, so queries (:meth:`History.counts`,
:meth:`History.timeline`, each on its own connection, from any thread) read
while the writer writes. While the receive loop has frames waiting, the
writer holds back (``HOLD_BACK_S``): it shares the monitor's core, and
answers to agents and users come first. Killed, the monitor loses at most
the last half-second of reports (a few seconds under load); reopened,
SQLite rolls the WAL forward.

Retention (:class:`Retention`, checked by the writer every minute or so):
reports older than ``max_age_s`` are dropped, and sessions whose latest
report is older than that go entirely. Past ``max_bytes`` of live pages,
the oldest reports go first, then the oldest sessions that have been quiet
for a minute. Freed pages are returned to the file system (incremental
vacuum), so the file itself stays near the bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import queue
import sqlite3
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgpack

from dyper.monitor.model.frames import Frame, StackKey
from dyper.monitor.session import FrameTable, Session, SessionKey, Slice, Window

DEFAULT_MAX_AGE_S = 7 * 86400.0
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB
FLUSH_INTERVAL_S = 0.5
#: Items taken off the queue per transaction at most.
MAX_BATCH = 5000
#: Items waiting for the writer at most; past it reports are not kept (and counted).
MAX_PENDING = 100_000
#: While the monitor has frames waiting, the writer leaves it the core (agents and users are
#: waiting for answers; history is not): for up to this long, and while fewer items wait here.
HOLD_BACK_S = 2.0
HOLD_BACK_ITEMS = 5_000
#: A session whose latest report is this recent is never dropped for size.
ACTIVE_S = 60.0
#: How often the writer folds new reports into the whole-run totals: an upsert per stack each
#: time (a few thousand per process), and what a restarted monitor reads back at most.
TOTALS_INTERVAL_S = 120.0
SCHEMA_VERSION = 1
FORMAT = "dyper-history"

#: (t, window_s, samples, spent_s, budget) of one report
ReportMeta = tuple[float, float, int, float, float]


def default_path() -> Path:
    """``$DYPER_HISTORY``, else ``$XDG_STATE_HOME/dyper/history.sqlite3`` (``~/.local/state`` by default)."""
    explicit = os.environ.get("DYPER_HISTORY")
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "dyper" / "history.sqlite3"


class HistoryError(Exception):
    """The history file cannot be used (in use, not ours, newer format); the text is for the user."""


@dataclass(frozen=True)
class Retention:
    """How much history is kept: by age and by size; None for no bound."""

    max_age_s: float | None = DEFAULT_MAX_AGE_S
    max_bytes: int | None = DEFAULT_MAX_BYTES

    def check_interval_s(self) -> float:
        """How often the writer enforces it: every minute, more often for short ages."""
        if self.max_age_s is None:
            return 60.0
        return min(60.0, max(0.5, self.max_age_s / 10.0))

    def describe(self) -> str:
        age = "forever" if self.max_age_s is None else _duration(self.max_age_s)
        size = "no size bound" if self.max_bytes is None else f"at most {_size(self.max_bytes)}"
        return f"kept {age}, {size}"


@dataclass
class StoredSession:
    """A session as history keeps it (see ``Session.restore``)."""

    key: SessionKey
    hello: dict[str, Any]
    state: dict[str, Any]
    counts: dict[StackKey, list[int]] = field(default_factory=dict)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS frames (
    id INTEGER PRIMARY KEY, file TEXT NOT NULL, name TEXT NOT NULL, firstline INTEGER NOT NULL, line INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, start_time REAL NOT NULL,
    hello BLOB NOT NULL, state BLOB, first_t REAL, last_t REAL NOT NULL, totals_n INTEGER NOT NULL DEFAULT 0,
    UNIQUE (host, pid, start_time)
);
CREATE TABLE IF NOT EXISTS stacks (id INTEGER PRIMARY KEY, session INTEGER NOT NULL, frames BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS stacks_by_session ON stacks (session);
CREATE TABLE IF NOT EXISTS totals (
    session INTEGER NOT NULL, thread INTEGER NOT NULL, stack INTEGER NOT NULL,
    wall INTEGER NOT NULL, cpu INTEGER NOT NULL,
    PRIMARY KEY (session, thread, stack)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY, session INTEGER NOT NULL, n INTEGER NOT NULL, t REAL NOT NULL,
    window_s REAL NOT NULL, samples INTEGER NOT NULL, spent_s REAL NOT NULL, budget REAL NOT NULL,
    counts BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS reports_by_session_t ON reports (session, t);
CREATE INDEX IF NOT EXISTS reports_by_session_n ON reports (session, n);
"""


def _pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)


class _Stacks:
    """A monitor session's stacks as the writer stored them, by the session's stack index (``Window.table``).

    Arrays, not an object per stack: a session has thousands of stacks, and a
    monitor hundreds of sessions (objects would cost memory and the garbage
    collector's time).
    """

    #: marks: counted by the transaction being written; counts committed and not folded yet
    IN_BATCH, PENDING = 1, 2

    def __init__(self, sid: int, table: list[StackKey]) -> None:
        self.sid = sid
        self.table = table
        #: per index: the stored stack's id (0: not stored yet)
        self.ids = array("q")
        #: per index: counts of the transaction being written, and of committed reports since the last fold
        self.batch_wall, self.batch_cpu, self.wall, self.cpu = array("q"), array("q"), array("q"), array("q")
        self.marks = bytearray()
        #: indices the transaction counted, and those with counts not folded yet
        self.batch: list[int] = []
        self.pending: list[int] = []
        #: in the writer's list of sessions with counts to fold
        self.listed = False

    def grow(self) -> None:
        """Room for every index of the table (it only grows, on the receive loop's thread)."""
        more = len(self.table) - len(self.marks)
        if more > 0:
            zeros = bytes(8 * more)
            for a in (self.ids, self.batch_wall, self.batch_cpu, self.wall, self.cpu):
                a.frombytes(zeros)
            self.marks.extend(bytes(more))

    def commit(self) -> None:
        """The transaction is committed: its counts wait for the next fold."""
        marks = self.marks
        for i in self.batch:
            if not marks[i] & self.PENDING:
                self.pending.append(i)
            marks[i] = self.PENDING
            self.wall[i] += self.batch_wall[i]
            self.cpu[i] += self.batch_cpu[i]
            self.batch_wall[i] = self.batch_cpu[i] = 0
        self.batch.clear()

    def rollback(self) -> None:
        for i in self.batch:
            self.marks[i] &= ~self.IN_BATCH
            self.batch_wall[i] = self.batch_cpu[i] = 0
        self.batch.clear()

    def unfolded(self) -> list[tuple[int, int, int, int, int]]:
        """(session, thread, stack, wall, cpu) of the counts not folded yet."""
        table, ids, wall, cpu = self.table, self.ids, self.wall, self.cpu
        return [(self.sid, table[i][0], ids[i], wall[i], cpu[i]) for i in self.pending]

    def folded(self) -> None:
        for i in self.pending:
            self.marks[i] &= ~self.PENDING
            self.wall[i] = self.cpu[i] = 0
        self.pending.clear()
        self.listed = False


class History:
    """The history file of one monitor: a writer thread, and queries from any thread."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        retention: Retention | None = None,
        *,
        clock: Callable[[], float] = time.time,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.path = Path(path).expanduser()
        self.retention = retention or Retention()
        self.clock = clock
        self.flush_interval_s = flush_interval_s
        self.counters: dict[str, int] = {"written": 0, "dropped": 0, "errors": 0, "expired_reports": 0}
        self.last_error = ""
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(MAX_PENDING)
        #: whether the monitor has frames waiting (set by Monitor.serve; read on the writer's thread)
        self.busy: Callable[[], bool] | None = None
        self._thread: threading.Thread | None = None
        self._frames: FrameTable | None = None
        self._lock_file = self._lock()
        try:
            self._conn = self._open()
        except BaseException:
            self._unlock()
            raise
        self._frames_written = 0
        self._session_ids: dict[SessionKey, int] = {}
        self._stack_ids: dict[int, dict[tuple[int, ...], int]] = {}
        #: per session id: its monitor session's stacks as stored, so a window's stacks are looked
        #: up by index, not by their frames
        self._by_index: dict[int, _Stacks] = {}
        self._next_stack = 1
        #: committed reports not yet folded into ``totals``: (session, thread, stack) -> [wall, cpu]
        #: (read back when the file is opened), and the sessions written since, which hold their own
        self._totals: dict[tuple[int, int, int], list[int]] = {}
        self._pending: list[_Stacks] = []
        #: and the last report number of each session among them
        self._totals_n: dict[int, int] = {}
        self._totals_due = time.monotonic() + TOTALS_INTERVAL_S
        self._reset_caches()
        try:
            self._catch_up_totals()
        except sqlite3.Error as exc:
            self.close()
            raise HistoryError(f"cannot use the history {self.path}: {exc}") from None

    # --- opening ----------------------------------------------------------------------

    def _lock(self) -> IO[str]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115 (held until close)
        except OSError as exc:
            raise HistoryError(f"cannot create the history {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise HistoryError(
                f"the history {self.path} is in use by another dyper monitor: "
                "ask that one, or give this one --history OTHER_FILE or --no-history"
            ) from None
        return lock

    def _unlock(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
        self._lock_file.close()

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot open the history {self.path}: {exc}") from None
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "meta" not in tables:
                raise HistoryError(f"{self.path} is not a dyper history file (give another --history)")
            if not tables:
                # Must come before the first table: lets retention hand freed pages back.
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; a crash loses at most the WAL tail
            conn.executescript(_SCHEMA)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                conn.execute("INSERT INTO meta VALUES ('format', ?), ('version', ?)", (FORMAT, str(SCHEMA_VERSION)))
            elif meta.get("format") != FORMAT:
                raise HistoryError(f"{self.path} is not a dyper history file (give another --history)")
            elif int(meta.get("version", "0")) > SCHEMA_VERSION:
                raise HistoryError(
                    f"{self.path} was written by a newer dyper (history version {meta['version']}): "
                    "upgrade dyper, or give another --history"
                )
        except sqlite3.Error as exc:
            conn.close()
            raise HistoryError(f"cannot use the history {self.path}: {exc}") from None
        except HistoryError:
            conn.close()
            raise
        return conn

    def _reset_caches(self) -> None:
        """Re-read what the writer keeps in memory (at start, and after a failed transaction)."""
        conn = self._conn
        self._frames_written = int(conn.execute("SELECT COUNT(*) FROM frames").fetchone()[0])
        self._session_ids = {
            (host, int(pid), float(start)): int(sid)
            for sid, host, pid, start in conn.execute("SELECT id, host, pid, start_time FROM sessions")
        }
        self._stack_ids = {}
        self._by_index = {}
        self._next_stack = int(conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM stacks").fetchone()[0])

    def _catch_up_totals(self) -> None:
        """Fold into ``totals`` the reports committed after the last fold (the monitor was killed in between)."""
        conn = self._conn
        behind = []
        for sid, totals_n in conn.execute("SELECT id, totals_n FROM sessions").fetchall():
            newest = 0
            for n, blob in conn.execute(
                "SELECT n, counts FROM reports WHERE session = ? AND n > ?", (sid, totals_n)
            ).fetchall():
                newest = max(newest, n)
                for tid, flat in _unpack(blob):
                    for i in range(0, len(flat), 3):
                        slot = self._totals.get((sid, tid, flat[i]))
                        if slot is None:
                            self._totals[(sid, tid, flat[i])] = [flat[i + 1], flat[i + 2]]
                        else:
                            slot[0] += flat[i + 1]
                            slot[1] += flat[i + 2]
            if newest:
                behind.append((sid, newest))
        self._totals_n = {int(sid): int(n) for sid, n in behind}
        self._fold_totals()
        if self.last_error:
            raise sqlite3.OperationalError(self.last_error)

    # --- restoring ----------------------------------------------------------------------

    def load(self) -> tuple[list[Frame], list[StoredSession]]:
        """Everything a restarted monitor needs: the frame table (by id) and each session's totals.

        Call before :meth:`start`.
        """
        assert self._thread is None, "load() before start()"
        conn = self._conn
        frames: list[Frame] = []
        for fid, file, name, firstline, line in conn.execute(
            "SELECT id, file, name, firstline, line FROM frames ORDER BY id"
        ):
            if fid != len(frames):
                raise HistoryError(f"{self.path}: the frame table has a hole at {len(frames)} (damaged file?)")
            frames.append(Frame(file, name, firstline, line))
        out: list[StoredSession] = []
        for sid, host, pid, start, hello, state in conn.execute(
            "SELECT id, host, pid, start_time, hello, state FROM sessions ORDER BY id"
        ).fetchall():
            stacks = {
                int(stack_id): tuple(_unpack(blob))
                for stack_id, blob in conn.execute("SELECT id, frames FROM stacks WHERE session = ?", (sid,))
            }
            self._stack_ids[sid] = {v: k for k, v in stacks.items()}
            counts: dict[StackKey, list[int]] = {}
            for tid, stack_id, wall, cpu in conn.execute(
                "SELECT thread, stack, wall, cpu FROM totals WHERE session = ?", (sid,)
            ):
                frames_of = stacks.get(stack_id)
                if frames_of is not None:
                    counts[(int(tid), frames_of)] = [int(wall), int(cpu)]
            out.append(
                StoredSession((host, int(pid), float(start)), _unpack(hello), _unpack(state) if state else {}, counts)
            )
        return frames, out

    # --- writing (the receive loop's side: queue only) ----------------------------------

    def start(self, frames: FrameTable) -> None:
        """Start the writer thread; ``frames`` is the monitor's table (appended to, never changed)."""
        self._frames = frames
        self._thread = threading.Thread(target=self._run, name="dyper-history", daemon=True)
        self._thread.start()

    def add_session(self, session: Session) -> None:
        """A new session or a new agent in it: keep its hello."""
        self._put(("session", (session.key, session.hello, session.snapshot())))

    def add_report(self, session: Session, window: Window) -> None:
        """A report was ingested: keep its counts (``window`` is never changed once made)."""
        self._put(("report", (session.key, session.hello, window, session.snapshot())))

    def _put(self, item: tuple[str, Any]) -> None:
        if self._thread is None:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.counters["dropped"] += 1

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is committed. False on timeout or with no writer."""
        if self._thread is None or not self._thread.is_alive():
            return False
        done = threading.Event()
        try:
            self._queue.put(("flush", done), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is queued, stop the writer, close the file and release the lock."""
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(("stop", None), timeout=timeout)
            self._thread.join(timeout)
            self._thread = None
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        self._unlock()

    # --- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        next_check = 0.0
        stopping = False
        while not stopping:
            batch: list[tuple[str, Any]] = []
            waiters: list[threading.Event] = []
            deadline = time.monotonic() + self.flush_interval_s
            while len(batch) < MAX_BATCH:
                try:
                    kind, payload = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if kind == "flush":
                    waiters.append(payload)
                    break
                if kind == "stop":
                    stopping = True
                    break
                batch.append((kind, payload))
            if batch:
                if not (stopping or waiters):
                    self._hold_back()
                self._write(batch)
            if stopping or waiters or time.monotonic() >= self._totals_due:
                self._fold_totals()
            for w in waiters:
                w.set()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.retention.check_interval_s()
                try:
                    self.enforce_retention()
                except sqlite3.Error as exc:
                    self._failed(exc, 0)

    def _hold_back(self) -> None:
        busy = self.busy
        if busy is None:
            return
        until = time.monotonic() + HOLD_BACK_S
        while busy() and time.monotonic() < until and self._queue.qsize() < HOLD_BACK_ITEMS:
            time.sleep(0.005)

    def _failed(self, exc: Exception, lost: int) -> None:
        self.counters["errors"] += 1
        self.counters["dropped"] += lost
        self.last_error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(sqlite3.Error):
            self._reset_caches()

    def _write(self, batch: list[tuple[str, Any]]) -> None:
        conn = self._conn
        #: the sessions this transaction counted stacks of (kept in their batch_* until the commit)
        counted: list[_Stacks] = []
        try:
            conn.execute("BEGIN")
            self._write_frames(conn)
            reports: list[tuple[Any, ...]] = []
            states: dict[int, tuple[dict[str, Any], float | None]] = {}
            for kind, payload in batch:
                if kind == "session":
                    key, hello, snapshot = payload
                    sid = self._session_id(conn, key, hello, update=True)
                    states[sid] = (snapshot, states.get(sid, ({}, None))[1])
                    continue
                key, hello, window, snapshot = payload
                sid = self._session_id(conn, key, hello, update=False)
                reports.append(
                    (sid, window.n, window.t, window.window_s, window.samples, window.spent_s, window.budget,
                     _pack(self._encode_counts(conn, sid, window, counted)))
                )  # fmt: skip
                last = states.get(sid, ({}, None))[1]
                states[sid] = (snapshot, window.t if last is None else max(last, window.t))
            conn.executemany(
                "INSERT INTO reports (session, n, t, window_s, samples, spent_s, budget, counts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                reports,
            )
            for sid, (snapshot, last_t) in states.items():
                conn.execute(
                    "UPDATE sessions SET state = ?, first_t = COALESCE(first_t, ?), "
                    "last_t = MAX(last_t, COALESCE(?, last_t)) WHERE id = ?",
                    (_pack(snapshot), snapshot.get("first_report_t"), last_t, sid),
                )
            conn.execute("COMMIT")
        except (sqlite3.Error, ValueError, TypeError, OverflowError) as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            for stacks in counted:
                stacks.rollback()
            self._failed(exc, sum(1 for kind, _ in batch if kind == "report"))
            return
        self.counters["written"] += len(reports)
        # Committed: these reports' counts join the totals at the next fold.
        for stacks in counted:
            if not stacks.listed:
                stacks.listed = True
                self._pending.append(stacks)
            stacks.commit()
        for row in reports:
            self._totals_n[row[0]] = max(self._totals_n.get(row[0], 0), row[1])

    def _fold_totals(self, conn: sqlite3.Connection | None = None) -> None:
        """Add the committed reports' counts to ``totals``, in their own transaction unless given one.

        Inside a caller's transaction the pending counts are cleared by the caller after its commit.
        """
        self._totals_due = time.monotonic() + TOTALS_INTERVAL_S
        if not self._totals_n:
            return
        own = conn is None
        conn = conn or self._conn
        try:
            if own:
                conn.execute("BEGIN")
            # A stack in both adds up: the upsert sums.
            conn.executemany(
                "INSERT INTO totals (session, thread, stack, wall, cpu) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (session, thread, stack) DO UPDATE SET "
                "wall = wall + excluded.wall, cpu = cpu + excluded.cpu",
                [(sid, tid, stack, wc[0], wc[1]) for (sid, tid, stack), wc in self._totals.items()]
                + [row for stacks in self._pending for row in stacks.unfolded()],
            )
            conn.executemany(
                "UPDATE sessions SET totals_n = MAX(totals_n, ?) WHERE id = ?",
                [(n, sid) for sid, n in self._totals_n.items()],
            )
            if own:
                conn.execute("COMMIT")
                self._folded()
        except sqlite3.Error as exc:
            if not own:
                raise
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._failed(exc, 0)  # nothing lost: the counts stay pending, and the reports are on disk

    def _folded(self) -> None:
        """The pending counts are in ``totals`` now."""
        self._totals.clear()
        self._totals_n.clear()
        for stacks in self._pending:
            stacks.folded()
        self._pending.clear()

    def _write_frames(self, conn: sqlite3.Connection) -> None:
        assert self._frames is not None
        known = self._frames.frames
        upto = len(known)  # the table only grows, and only on the receive loop's thread
        if upto > self._frames_written:
            conn.executemany(
                "INSERT INTO frames (id, file, name, firstline, line) VALUES (?, ?, ?, ?, ?)",
                [
                    (i, f.file, f.name, f.firstline, f.line)
                    for i, f in enumerate(known[self._frames_written : upto], self._frames_written)
                ],
            )
            self._frames_written = upto

    def _session_id(self, conn: sqlite3.Connection, key: SessionKey, hello: dict[str, Any], *, update: bool) -> int:
        sid = self._session_ids.get(key)
        if sid is None:
            cur = conn.execute(
                "INSERT INTO sessions (host, pid, start_time, hello, last_t) VALUES (?, ?, ?, ?, ?)",
                (key[0], key[1], key[2], _pack(hello), self.clock()),
            )
            sid = int(cur.lastrowid or 0)
            self._session_ids[key] = sid
            self._stack_ids[sid] = {}
        elif update:
            conn.execute("UPDATE sessions SET hello = ? WHERE id = ?", (_pack(hello), sid))
        return sid

    def _stacks_of(self, conn: sqlite3.Connection, sid: int) -> dict[tuple[int, ...], int]:
        stacks = self._stack_ids.get(sid)
        if stacks is None:
            stacks = self._stack_ids[sid] = {
                tuple(_unpack(blob)): int(stack_id)
                for stack_id, blob in conn.execute("SELECT id, frames FROM stacks WHERE session = ?", (sid,))
            }
        return stacks

    def _encode_counts(self, conn: sqlite3.Connection, sid: int, window: Window, counted: list[_Stacks]) -> list[Any]:
        """The window's counts as stored (by thread: stack id, wall, cpu, ...), counted in its session's batch."""
        stacks = self._by_index.get(sid)
        if stacks is None or stacks.table is not window.table:
            stacks = self._by_index[sid] = _Stacks(sid, window.table)
        stacks.grow()
        if not stacks.batch and stacks not in counted:
            counted.append(stacks)
        table, ids, marks, batch = stacks.table, stacks.ids, stacks.marks, stacks.batch
        batch_wall, batch_cpu = stacks.batch_wall, stacks.batch_cpu
        new: list[tuple[int, int, bytes]] = []
        by_thread: dict[int, list[int]] = {}
        for i, wall, cpu in window.items():
            stack_id = ids[i]
            if not stack_id:
                stack_id = ids[i] = self._stack_id(conn, sid, table[i][1], new)
            tid = table[i][0]
            flat = by_thread.get(tid)
            if flat is None:
                by_thread[tid] = [stack_id, wall, cpu]
            else:
                flat += (stack_id, wall, cpu)
            if not marks[i] & _Stacks.IN_BATCH:
                marks[i] |= _Stacks.IN_BATCH
                batch.append(i)
            batch_wall[i] += wall
            batch_cpu[i] += cpu
        if new:
            conn.executemany("INSERT INTO stacks (id, session, frames) VALUES (?, ?, ?)", new)
        return [[tid, flat] for tid, flat in by_thread.items()]

    def _stack_id(
        self, conn: sqlite3.Connection, sid: int, frames: tuple[int, ...], new: list[tuple[int, int, bytes]]
    ) -> int:
        """The id of the session's stored stack ``frames``; a new one is added to ``new`` (to insert)."""
        stacks = self._stacks_of(conn, sid)
        stack_id = stacks.get(frames)
        if stack_id is None:
            stack_id = stacks[frames] = self._next_stack
            self._next_stack += 1
            new.append((stack_id, sid, _pack(frames)))
        return stack_id

    # --- retention (the writer's thread; call directly only when no writer runs) -----------

    def enforce_retention(self) -> dict[str, int]:
        """Drop what the retention no longer keeps; return how many reports and sessions went."""
        conn = self._conn
        now = self.clock()
        dropped = {"reports": 0, "sessions": 0}
        folded = False

        def fold() -> None:
            # Reports about to go must be in the totals first (folding is not cheap: only then).
            nonlocal folded
            if not folded:
                self._fold_totals(conn)
                folded = True

        conn.execute("BEGIN")
        try:
            if self.retention.max_age_s is not None:
                cutoff = now - self.retention.max_age_s
                old = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE last_t < ?", (cutoff,))]
                # Session by session, so the (session, t) index finds them: no scan of every report.
                aged = [
                    sid
                    for (sid,) in conn.execute("SELECT id FROM sessions").fetchall()
                    if sid not in old
                    and conn.execute(
                        "SELECT EXISTS (SELECT 1 FROM reports WHERE session = ? AND t < ?)", (sid, cutoff)
                    ).fetchone()[0]
                ]
                if old or aged:
                    fold()
                self._drop_sessions(conn, old, dropped)
                for sid in aged:
                    dropped["reports"] += conn.execute(
                        "DELETE FROM reports WHERE session = ? AND t < ?", (sid, cutoff)
                    ).rowcount
            if self.retention.max_bytes is not None:
                # Once over, down to 90%, so that this does not run again at the next check.
                target = int(self.retention.max_bytes * 0.9)
                limit = self.retention.max_bytes
                while (used := self._used_bytes(conn)) > limit:
                    fold()
                    limit = target
                    n = int(conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0])
                    if n:
                        share = min(0.5, max(0.0, (used - target) / used))
                        k = min(n, max(16, math.ceil(n * share)))
                        dropped["reports"] += conn.execute(
                            "DELETE FROM reports WHERE id IN (SELECT id FROM reports ORDER BY id LIMIT ?)", (k,)
                        ).rowcount
                        continue
                    quiet = conn.execute(
                        "SELECT id FROM sessions WHERE last_t < ? ORDER BY last_t LIMIT 1", (now - ACTIVE_S,)
                    ).fetchall()
                    if not quiet:
                        break
                    self._drop_sessions(conn, [quiet[0][0]], dropped)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if folded:
            self._folded()
        if dropped["reports"] or dropped["sessions"]:
            # executescript steps it to the end; execute() frees one page and stops
            conn.executescript("PRAGMA incremental_vacuum;")
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.counters["expired_reports"] += dropped["reports"]
        return dropped

    def _drop_sessions(self, conn: sqlite3.Connection, ids: Iterable[int], dropped: dict[str, int]) -> None:
        ids = list(ids)
        for sid in ids:
            dropped["reports"] += conn.execute("DELETE FROM reports WHERE session = ?", (sid,)).rowcount
            conn.execute("DELETE FROM totals WHERE session = ?", (sid,))
            conn.execute("DELETE FROM stacks WHERE session = ?", (sid,))
            conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))
            self._stack_ids.pop(sid, None)
            self._by_index.pop(sid, None)
        if ids:
            gone = set(ids)
            self._session_ids = {k: v for k, v in self._session_ids.items() if v not in gone}
        dropped["sessions"] += len(ids)

    @staticmethod
    def _used_bytes(conn: sqlite3.Connection) -> int:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        return (pages - free) * size

    # --- queries (any thread; each on its own connection) ------------------------------

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False)
        try:
            conn.execute("PRAGMA query_only = 1")
            yield conn
        finally:
            conn.close()

    def slice(self, key: SessionKey, start: float | None, end: float | None, before_n: int | None = None) -> Slice:
        """The session's stored reports ending in ``(start, end]``, merged.

        ``before_n``: only reports numbered below it (the monitor has the newer ones in memory).
        """
        out = Slice()
        with self._reader() as conn:
            sid = _find_session(conn, key)
            if sid is None:
                return out
            where, args = _report_filter(sid, start, end, before_n)
            acc: dict[tuple[int, int], list[int]] = {}
            sql = f"SELECT t, window_s, samples, counts FROM reports WHERE {where}"
            for t, window_s, samples, blob in conn.execute(sql, args):
                out.add_report(float(t), float(window_s), int(samples))
                for tid, flat in _unpack(blob):
                    for i in range(0, len(flat), 3):
                        slot = acc.get((tid, flat[i]))
                        if slot is None:
                            acc[(tid, flat[i])] = [flat[i + 1], flat[i + 2]]
                        else:
                            slot[0] += flat[i + 1]
                            slot[1] += flat[i + 2]
            if not acc:
                return out
            stacks = {
                int(stack_id): tuple(_unpack(blob))
                for stack_id, blob in conn.execute("SELECT id, frames FROM stacks WHERE session = ?", (sid,))
            }
        for (tid, stack_id), wc in acc.items():
            frames = stacks.get(stack_id)
            if frames is not None:
                out.counts[(tid, frames)] = wc
        return out

    def reports_meta(
        self, key: SessionKey, start: float | None, end: float | None, before_n: int | None = None
    ) -> list[ReportMeta]:
        """``(t, window_s, samples, spent_s, budget)`` of the session's stored reports in ``(start, end]``, by time."""
        with self._reader() as conn:
            sid = _find_session(conn, key)
            if sid is None:
                return []
            where, args = _report_filter(sid, start, end, before_n)
            rows = conn.execute(
                f"SELECT t, window_s, samples, spent_s, budget FROM reports WHERE {where} ORDER BY t",
                args,
            ).fetchall()
        return [(float(t), float(w), int(s), float(sp), float(b)) for t, w, s, sp, b in rows]

    def stats(self) -> dict[str, Any]:
        """Where the history is, how big, what it keeps; for ``ping`` and the dashboard."""
        with self._reader() as conn:
            reports = int(conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0])
            sessions = int(conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])
            oldest = conn.execute("SELECT MIN(t) FROM reports").fetchone()[0]
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        return {
            "path": str(self.path),
            "bytes": size,
            "sessions": sessions,
            "reports": reports,
            "oldest_report": oldest,
            "pending": self.pending,
            "retention": {"max_age_s": self.retention.max_age_s, "max_bytes": self.retention.max_bytes},
            "counters": dict(self.counters),
            "last_error": self.last_error,
        }


def _find_session(conn: sqlite3.Connection, key: SessionKey) -> int | None:
    row = conn.execute(
        "SELECT id FROM sessions WHERE host = ? AND pid = ? AND start_time = ?", (key[0], key[1], key[2])
    ).fetchone()
    return int(row[0]) if row else None


def _report_filter(sid: int, start: float | None, end: float | None, before_n: int | None) -> tuple[str, list[Any]]:
    where = ["session = ?"]
    args: list[Any] = [sid]
    if start is not None:
        where.append("t > ?")
        args.append(start)
    if end is not None:
        where.append("t <= ?")
        args.append(end)
    if before_n is not None:
        where.append("n < ?")
        args.append(before_n)
    return " AND ".join(where), args


def parse_size(text: str) -> int:
    """``500MB``, ``1GiB``, ``2G``, ``1048576`` -> bytes. Raises ValueError."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if m is None:
        raise ValueError(f"{text!r} is not a size: write it like 500MB or 2GB")
    power = " kmgt".index(m.group(2) or " ")
    base = 1024 if m.group(3).startswith("i") or (m.group(2) and not m.group(3)) else 1000
    if m.group(3) == "b" and m.group(2):
        base = 1000
    value = int(float(m.group(1)) * base**power)
    if value <= 0:
        raise ValueError("a size must be positive")
    return value


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"
