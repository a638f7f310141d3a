"""Automated diagnosis in the line of the Performance Consultant (seed 002): hypotheses, thresholds, refinement.

A pure function of a profile: :func:`diagnose` takes a dyper
:class:`~monitor.profile.Profile` (wall and cpu counts per stack),
:func:`diagnose_tree` a call tree with one count (a collapsed file), and both
return a :class:`Diagnosis`: the ranked bottlenecks and the search history.

The hypotheses, each a share of the *busy* samples (every thread's wall
samples, less those of threads that wait by design: asleep in ``sleep``, an
event loop idle in its selector, a thread joining others; counting them would
hide every other bottleneck):

- ``cpu``: cpu samples (the thread was running Python);
- ``loop``: blocked samples inside an event loop's callback (``Handle._run``
  on the stack): a coroutine that makes a blocking call, whatever it waits on
  (a ``time.sleep`` too), blocks every task of its loop. The tasks proflet's
  loop blocks, when the profile carries them, are its evidence (how often and
  how long the loop was blocked there); a loop whose callbacks start late with
  no block to blame is tested as ``starved``;
- ``io``, ``sync``: blocked samples (wall but not cpu), told apart by what the
  thread was blocked in: the call on the leaf's source line when the source can
  be read (``sock.recv(...)``, ``lock.acquire()``), else the names of the
  innermost frames (``Condition.wait``, ``Queue.get``, ``SocketIO.readinto``,
  ``threading.py``, ``ssl.py``...), else the state the threads proflet saw the
  thread in most (lock or condition: sync; I/O: io).
  lock/acquire/wait/join/Condition/Queue/Event are synchronisation;
  recv/read/send/select/poll/accept/connect/socket/ssl/urlopen/http are I/O;
  sleep is sleeping, not a bottleneck. A selector waited on by an event loop
  between callbacks (``BaseEventLoop._run_once``, no callback running) is the
  loop waiting for work: idle, not I/O;
- ``wait``: blocked samples whose call could not be named (no source, no hint
  in the frames or the thread's state): waiting on something, it is not known what;
- ``gc``: samples in garbage collection when the profile carries GC frames
  (``<GC>``, as CPython's own sampling profiler writes them, or Austin's
  ``:GC:``), else the memory proflet's GC pauses (a share of the time) when it
  ran, charged to the code whose allocations triggered them; else untestable;
- ``samples``: for a collapsed file, whose counts do not tell running from
  waiting: where the samples are.

Comprehensions and generator expressions are charged to the function that
holds them: that is the code a person changes.

The search, as the callgraph-based Performance Consultant does it: a
hypothesis is first tested on the whole program; if its share reaches the
threshold it is refined from the entry points (the functions at the roots of
the call tree) down the call graph, ``extend_bottom`` at a time, while a callee
still reaches the threshold, through the profile interface of seed 000 (a
focus is a call sequence from an entry point; its share is that of its last
function, with callees, at the places the sequence occurs). What a focus that
passed keeps for itself, beside the callees that passed and are refined on
their own, is reported:

- ``self``: the function's own code (not its callees) reaches the threshold;
- ``diffuse``: the callees that did not pass reach it together, none alone
  (true, but it names no one place to fix: ranked after the others). A focus
  where refinement stops whose own code and failed callees each stay under the
  threshold is reported whole as ``diffuse``.

Then bottom-up, as BOTTLENECKS' path summaries do it (seed 000): every
function whose own code reaches the threshold is refined up its callers
(:func:`~dyper.monitor.search.callers.refine`) to what a person would change:

- ``path``: a hot function refined to the one caller of several that holds
  most of it (``ingest > crc``, not ``crc`` alone);
- ``spread``: a routine whose callers each hold a small part (the paper's
  blind spot of a top-down search, "a single resource-intensive function
  called by numerous parent functions, yet none of its parents meet the
  threshold"), found as one bottleneck with its callers listed, together with
  the hot code below it that only it calls.

A place is reported once: when two bottlenecks of a hypothesis share most of
their samples, the one that says more is kept (a refinement that chose a
caller or found a spread routine, then a top-down focus, then the rest) and
the other is recorded in the history as ``covered``. Each bottleneck's
evidence is one sentence with the number that matters, its ``callers`` are
listed, and ``tree_path`` is the heaviest path from a root of the call tree to
it (what a call-tree view opens).

What the search does not do yet: ask the live agent for detailing (call
counts, exact CPU time) where a hypothesis needs it. The scheduler can
(``AgentSchedule.ask``), but no ctl operation of the monitor exposes it, so a
live diagnosis works from the sampled profile alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dyper.agent.protocol import STATE_FILE
from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile
from dyper.monitor.search.callers import Refined, StackSet, merge, refine
from dyper.monitor.search.calltree import CallTreeProfile, CallTreeSummary, function_label
from dyper.monitor.search.interface import base_overlap, cum_overlap

#: The Performance Consultant's CPU threshold (seed 002: "a 5% threshold was used for CPU bottlenecks").
DEFAULT_THRESHOLD = 0.05

#: Hypotheses in the order they are tested and listed.
HYPOTHESES = ("cpu", "loop", "io", "sync", "wait", "gc", "samples")
#: The hypotheses whose samples are busy ones (what every share is a fraction of).
BUSY = ("cpu", "loop", "io", "sync", "wait")

DESCRIPTIONS = {
    "cpu": "CPU-bound",
    "loop": "blocking the event loop",
    "idle": "idle",
    "io": "blocked on I/O",
    "sync": "waiting on synchronisation",
    "wait": "blocked in an unnamed call",
    "gc": "garbage collection",
    "samples": "samples",
    "sleep": "sleeping",
}

#: (file, line) -> the source line, or "" when it cannot be read
LineText = Callable[[str, int], str]

#: How many frames from the leaf up the classification of a blocked stack looks at.
CLASSIFY_DEPTH = 4
#: A search that tests more summaries than this stops, and says so.
MAX_STEPS = 20_000
#: A bottleneck that shares at least this part of its samples with one ranked before it is the same place.
SAME_PLACE = 0.5
#: Callers named in a spread bottleneck's evidence.
SHOWN_CALLERS = 3

#: The event loop's own frames: waiting in the selector under ``_run_once`` outside any callback is
#: the loop waiting for work; anything blocked inside ``Handle._run`` blocks every task of the loop.
_LOOP_ITERATION = frozenset({"BaseEventLoop._run_once"})
_LOOP_CALLBACK = frozenset({"Handle._run"})
#: A thread waiting for other threads to end waits by design: what the others do is the question.
_JOIN = frozenset({"Thread.join", "Thread._wait_for_tstate_lock"})
#: Comprehensions and generator expressions are charged to the function that holds them.
_INLINE = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")
_INLINE_SUFFIX = re.compile(r"\.<locals>\.<(?:genexpr|listcomp|dictcomp|setcomp)>$")

_SLEEP_EXACT = frozenset({"nanosleep", "usleep", "pause"})
_SLEEP_PREFIX = ("sleep",)
_SYNC_EXACT = frozenset(
    {"lock", "rlock", "event", "threading", "simplequeue", "lifoqueue", "priorityqueue", "joinablequeue",
     "boundedsemaphore", "futex", "mutex", "sigwait", "sigtimedwait", "notify"}
)  # fmt: skip
_SYNC_PREFIX = ("acquire", "wait", "join", "condition", "queue", "semaphore", "barrier")
_IO_EXACT = frozenset({"input", "communicate", "flush", "write", "writelines", "makefile", "urllib", "urllib3"})
_IO_PREFIX = (
    "recv", "read", "send", "sock", "ssl", "http", "select", "poll", "epoll", "kqueue", "accept", "connect",
    "urlopen", "getaddrinfo", "gethostby", "getresponse", "handshake", "do_handshake",
)  # fmt: skip
_GC_NAMES = frozenset({"<gc>", ":gc:"})

_WORD = re.compile(r"[A-Za-z0-9]+")
_CALLEE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def _kind_of_word(word: str) -> str | None:
    if word in _SLEEP_EXACT or word.startswith(_SLEEP_PREFIX):
        return "sleep"
    if word in _SYNC_EXACT or word.startswith(_SYNC_PREFIX):
        return "sync"
    if word in _IO_EXACT or word.startswith(_IO_PREFIX):
        return "io"
    return None


def _kind_of_words(text: str) -> str | None:
    for word in _WORD.findall(text.replace("_", " ")):
        kind = _kind_of_word(word.lower())
        if kind is not None:
            return kind
    return None


def _module_text(file: str) -> str:
    """``.../http/client.py`` -> ``http client``: the module's last two parts."""
    stem = os.path.splitext(os.path.basename(file))[0]
    parent = os.path.basename(os.path.dirname(file))
    return f"{parent} {stem}" if parent and parent not in ("site-packages", "lib") else stem


def classify_wait(frames: Sequence[Frame], line_text: LineText | None = None) -> str:
    """What a blocked stack (root first) waits on: ``"io"``, ``"sync"``, ``"sleep"`` or ``"wait"`` (unknown).

    First the calls on the leaf's source line, last call first (the blocking
    routine is C code, so it is not a frame; its name is on that line); then
    the leaf's function and module names (``Condition.wait``, ``socket.py``);
    then the names of its callers, up to :data:`CLASSIFY_DEPTH` frames in all.
    """
    if not frames:
        return "wait"
    leaf = frames[-1]
    if line_text is not None:
        try:
            text = line_text(leaf.file, leaf.line) or ""
        except (OSError, ValueError):
            text = ""
        for callee in reversed(_CALLEE.findall(text)):
            kind = _kind_of_words(callee)
            if kind is not None:
                return kind
    kind = _kind_of_words(leaf.name) or _kind_of_words(_module_text(leaf.file))
    if kind is not None:
        return kind
    # Callers by name only: every thread has threading.py near its root.
    for frame in reversed(frames[-CLASSIFY_DEPTH:-1]):
        kind = _kind_of_words(frame.name)
        if kind is not None:
            return kind
    return "wait"


# --- the result ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bottleneck:
    """A focus where refinement stopped (or a function found bottom-up), with its share of the busy samples."""

    hypothesis: str
    path: tuple[str, ...]  # frames, outermost first
    share: float  # a fraction of Diagnosis.total
    kind: str  # "self", "path", "spread", "loop", "gc" or "diffuse"
    evidence: str
    #: (caller, share of Diagnosis.total) of the path's first function, largest first (refined bottlenecks)
    callers: tuple[tuple[str, float], ...] = ()
    #: the heaviest path from a root of the call tree to where this bottleneck is: what a call-tree view opens
    tree_path: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "path": list(self.path),
            "hypothesis": self.hypothesis,
            "share_pct": round(100.0 * self.share, 3),
            "kind": self.kind,
            "evidence": self.evidence,
            "callers": [{"name": c, "share_pct": round(100.0 * v, 3)} for c, v in self.callers],
            "tree_path": list(self.tree_path or self.path),
        }


@dataclass(frozen=True)
class Step:
    """One test of a (hypothesis : focus) pair: a node of the Search History Graph.

    ``path`` is empty for the whole program; ``parent`` is the step this one
    refines (``None`` for the whole-program tests; the bottom-up tests hang
    from their hypothesis's whole-program test).
    ``verdict`` is ``passed`` or ``failed`` (against the threshold),
    ``untestable`` (the profile lacks the data), ``ignored`` (sleeping, an
    idle event loop, a thread joining others) or ``covered`` (a place that
    passed but is mostly the same samples as a bottleneck ranked before it).
    """

    step: int
    hypothesis: str
    path: tuple[str, ...]
    share: float | None
    verdict: str
    parent: int | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "hypothesis": self.hypothesis,
            "path": list(self.path),
            "share_pct": None if self.share is None else round(100.0 * self.share, 3),
            "verdict": self.verdict,
            "parent": self.parent,
            "note": self.note,
        }


@dataclass
class Diagnosis:
    """The ranked bottlenecks and the search history that found them."""

    threshold: float
    #: the busy samples every share is a fraction of
    total: int
    bottlenecks: list[Bottleneck] = field(default_factory=list)
    history: list[Step] = field(default_factory=list)
    #: the whole-program share of each hypothesis tested (of total)
    shares: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``bottlenecks`` and ``history`` (see :class:`Bottleneck`, :class:`Step`), and the context."""
        return {
            "bottlenecks": [b.to_json() for b in self.bottlenecks],
            "history": [s.to_json() for s in self.history],
            "threshold_pct": round(100.0 * self.threshold, 3),
            "total_samples": self.total,
            "shares_pct": {k: round(100.0 * v, 3) for k, v in self.shares.items()},
            "notes": list(self.notes),
        }


# --- the search ---------------------------------------------------------------------------


def diagnose(
    profile: Profile,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    line_text: LineText | None = None,
    charge_libraries: bool = False,
) -> Diagnosis:
    """Test every hypothesis on a dyper profile and refine the ones that hold.

    ``line_text`` reads source lines to tell I/O from synchronisation (the
    command passes :func:`linecache.getline`); without it only frame names are
    used. ``charge_libraries`` charges library time to the calling application
    line in the call trees (the blocked stacks are classified on all frames).
    What the proflets measured, when the profile carries their results, joins
    the sampled stacks: the threads proflet's states name what a thread waited
    on when its frames do not, the tasks proflet's loop blocks are the evidence
    of the event loop's bottlenecks, the memory proflet's GC pauses test GC.
    """
    _check_threshold(threshold)
    kinds = ("cpu", "loop", "io", "sync", "wait", "sleep", "idle", "gc")
    stacks: dict[str, list[tuple[list[str], int]]] = {h: [] for h in kinds}
    labels = [function_label(f) for f in profile.frames]
    inline = [f.name.endswith(_INLINE) for f in profile.frames]
    gc_frames = {i for i, f in enumerate(profile.frames) if f.name.strip().lower() in _GC_NAMES}
    loop_frames = {i for i, f in enumerate(profile.frames) if f.name in _LOOP_ITERATION}
    callback_frames = {i for i, f in enumerate(profile.frames) if f.name in _LOOP_CALLBACK}
    join_frames = {i for i, f in enumerate(profile.frames) if f.name in _JOIN}
    # The native sampler's leaf for a thread ready to run: waiting for the GIL, or for a CPU.
    ready_frames = {i for i, f in enumerate(profile.frames) if f.file == STATE_FILE}
    states = _thread_states(profile)
    empty = 0
    idle = {"loop": 0, "join": 0, "ready": 0}
    classified: dict[tuple[int, ...], str] = {}
    for s, frames in profile.charged_stacks(charge_libraries):
        if not frames:
            empty += s.wall
            continue
        names = [labels[i] for i in frames if not inline[i]] or [labels[frames[0]]]
        if s.cpu > 0:
            stacks["cpu"].append((names, s.cpu))
        blocked = s.wall - s.cpu
        if blocked > 0:
            kind = classified.get(s.frames)
            if kind is None:
                in_callback = any(i in callback_frames for i in s.frames)
                if in_callback:
                    kind = "loop"  # whatever it waits on, no other task of the loop runs meanwhile
                elif any(i in loop_frames for i in s.frames):
                    kind = "idle:loop"
                elif any(i in join_frames for i in s.frames):
                    kind = "idle:join"
                elif ready_frames and any(i in ready_frames for i in s.frames):
                    kind = "idle:ready"
                else:
                    kind = classify_wait([profile.frames[i] for i in s.frames], line_text)
                classified[s.frames] = kind
            if kind == "wait":
                kind = states.get(s.thread, kind)
            if kind.startswith("idle:"):
                idle[kind[5:]] += blocked
                kind = "idle"
            stacks[kind].append((names, blocked))
        if gc_frames and any(i in gc_frames for i in s.frames):
            stacks["gc"].append((names, s.wall))
    trees = {h: CallTreeProfile.from_stacks(v) for h, v in stacks.items()}
    sleeping = trees["sleep"].total()
    idling = trees["idle"].total()
    total = sum(trees[h].total() for h in BUSY)
    notes = []
    if empty:
        notes.append(f"{empty} samples of threads outside Python (no frames) are left out")
    gc_results = _gc_results(profile)
    untestable = (
        {}
        if gc_frames or gc_results
        else {"gc": "the profile carries no GC frames and no GC pauses (name the memory proflet to measure them)"}
    )
    is_library = _label_predicate(profile)
    search = _Search(threshold, total, is_library)
    everything = total + sleeping + idling
    asleep = f" ({_pct(sleeping / everything)} of all samples)" if everything else ""
    search.history.append(
        Step(
            search.next_step(),
            "sleep",
            (),
            None,
            "ignored",
            note=f"{sleeping} samples{asleep} asleep in sleep(): not a bottleneck, left out of the busy samples",
        )
    )
    idle_notes = {
        "loop": "samples of an event loop waiting for work in its selector (outside any callback): an idle loop "
        "is not a bottleneck, what blocks it is",
        "join": "samples of threads waiting in join() for other threads: what those do is the question, left out "
        "of the busy samples",
        "ready": "samples of threads ready to run, waiting for the GIL or for a CPU: the threads that hold them "
        "are the question (the threads proflet counts the wait), left out of the busy samples",
    }
    for why, note in idle_notes.items():
        if idle[why]:
            search.history.append(Step(search.next_step(), "idle", (), None, "ignored", note=f"{idle[why]} {note}"))
    tasks = _tasks_results(profile)
    for h in ("cpu", "loop", "io", "sync", "wait", "gc"):
        if h in untestable:
            search.history.append(Step(search.next_step(), h, (), None, "untestable", note=untestable[h]))
            continue
        if h == "gc" and not gc_frames:
            search.gc_pauses(gc_results)
            continue
        search.hypothesis(h, trees[h], StackSet(stacks[h]))
    search.loop_evidence(tasks)
    return search.finish(notes)


def _thread_states(profile: Profile) -> dict[int, str]:
    """Per thread, what the threads proflet saw it wait on most (``sync`` or ``io``) when that is most of it."""
    results = (profile.proflets.get("results") or {}).get("threads") or {}
    by_name = {name: ident for ident, name in profile.threads.items()}
    out: dict[int, str] = {}
    for t in results.get("threads") or ():
        ident = t.get("ident")
        if ident not in profile.threads:
            ident = by_name.get(t.get("name"))
        if ident is None:
            continue
        sync = float(t.get("block_pct") or 0) + float(t.get("wait_pct") or 0)
        io = float(t.get("io_pct") or 0)
        if max(sync, io) > 0:
            out[int(ident)] = "sync" if sync >= io else "io"
    return out


def _tasks_results(profile: Profile) -> dict[str, Any]:
    tasks = (profile.proflets.get("results") or {}).get("tasks")
    return tasks if isinstance(tasks, dict) else {}


def _gc_results(profile: Profile) -> dict[str, Any]:
    """The memory proflet's GC figures, when its collector ran (it is not one of the defaults)."""
    memory = (profile.proflets.get("results") or {}).get("memory") or {}
    gc = memory.get("gc") if isinstance(memory, dict) else None
    if not isinstance(gc, dict) or not any(int(c or 0) for c in gc.get("collections") or ()):
        return {}
    return gc


def _label_predicate(profile: Profile) -> Callable[[str], bool]:
    """Library code by frame name (``qualname (file)``), from the profile's own paths."""
    is_library = profile.library_predicate()
    known = {function_label(f): is_library(f.file) for f in profile.frames}
    return lambda name: known.get(name, False)


def _label_is_library(name: str) -> bool:
    """For a collapsed file, which has no paths: the usual places of the standard library and packages."""
    where = name.rpartition(" (")[2]
    return where.startswith("<") or "site-packages" in where or "/lib/python3" in where


def diagnose_tree(tree: CallTreeProfile, threshold: float = DEFAULT_THRESHOLD) -> Diagnosis:
    """Diagnose a call tree with one count per stack (a collapsed file): where the samples are, and GC if marked.

    The counts do not say whether a thread ran or waited, so ``cpu``, ``io``,
    ``sync`` and ``wait`` are untestable; ``samples`` takes their place.
    Comprehensions are charged to the function that holds them, as in :func:`diagnose`.
    """
    _check_threshold(threshold)
    stacks = tree.stacks()
    if any(_function(name).endswith(_INLINE) for path, _ in stacks for name in path):
        folded = [(tuple(n for n in path if not _function(n).endswith(_INLINE)) or path[:1], c) for path, c in stacks]
        tree = CallTreeProfile.from_stacks(folded)
        stacks = tree.stacks()
    search = _Search(threshold, tree.total(), _label_is_library)
    search.hypothesis("samples", tree, StackSet(stacks))
    for h in ("cpu", "io", "sync", "wait"):
        search.history.append(
            Step(
                search.next_step(),
                h,
                (),
                None,
                "untestable",
                note="a collapsed file does not tell running from waiting",
            )
        )
    gc = [s for s in tree.initial_summaries() if _head(s.path[0]) in _GC_NAMES]
    if not gc:
        search.history.append(
            Step(search.next_step(), "gc", (), None, "untestable", note="the profile carries no GC frames")
        )
    else:
        cum = tree.total_cum_of(gc)
        share = 0.0 if search.total == 0 else cum / search.total
        search.shares["gc"] = share
        passed = share >= threshold
        search.history.append(Step(search.next_step(), "gc", (), share, "passed" if passed else "failed"))
        if passed:
            for s in gc:
                s_share = tree.cum_of(s) / search.total
                search.found.append(
                    Bottleneck("gc", s.path, s_share, "self", f"{_pct(s_share)} of the samples in garbage collection")
                )
    return search.finish([])


def _callers_cost(tree: CallTreeProfile, summary: CallTreeSummary) -> int:
    """The cost of the nodes before the last one on the summary's paths (interior(s), the callers' own part).

    What the path has in common with the path one shorter: ``base_of`` and
    ``cum_of`` of a path count every node along it, and the search wants the
    last function's values in its context.
    """
    shorter = tree.trim_bottom(summary)
    return 0 if shorter is None else base_overlap(tree, summary, [shorter])


def _inclusive(tree: CallTreeProfile, summary: CallTreeSummary) -> int:
    """The cost of the path's last function and its callees, at the summary's occurrences."""
    return tree.cum_of(summary) - _callers_cost(tree, summary)


def _own(tree: CallTreeProfile, summary: CallTreeSummary) -> int:
    """The cost of the path's last function itself (not its callees), at the summary's occurrences."""
    return tree.base_of(summary) - _callers_cost(tree, summary)


def _function(name: str) -> str:
    """``work (/srv/app.py)`` -> ``work``: a frame name as evidence text quotes it."""
    return name.split(" (", 1)[0]


def _head(name: str) -> str:
    """``<GC> (file)`` -> ``<gc>``: the function part of a frame name, lower case."""
    return name.split(" (", 1)[0].strip().lower()


def _check_threshold(threshold: float) -> None:
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be a fraction in (0, 1], not {threshold}")


def _pct(share: float) -> str:
    return f"{100.0 * share:.1f}%"


class _Search:
    """The bookkeeping of one diagnosis: steps, shares, what was found."""

    def __init__(self, threshold: float, total: int, is_library: Callable[[str], bool]) -> None:
        self.threshold = threshold
        self.total = total
        self.bound = threshold * total
        self.is_library = is_library
        self.history: list[Step] = []
        self.found: list[Bottleneck] = []
        #: the samples (indices into the hypothesis's StackSet) of each bottleneck found, by its index in found
        self.covers: dict[int, frozenset[int]] = {}
        #: bottom-up refinements are places to change first: when one and a top-down focus are the same samples
        self.refined: set[int] = set()
        self.stacksets: dict[str, StackSet] = {}
        self.shares: dict[str, float] = {}
        #: per hypothesis, the foci that passed during refinement
        self.passed: dict[str, list[CallTreeSummary]] = {}
        self.truncated = False

    def next_step(self) -> int:
        return len(self.history)

    def share(self, value: int) -> float:
        return 0.0 if self.total == 0 else value / self.total

    def record(self, hypothesis: str, path: Sequence[str], value: int, parent: int | None, note: str = "") -> Step:
        share = self.share(value)
        passed = self.total > 0 and value >= self.bound
        step = Step(self.next_step(), hypothesis, tuple(path), share, "passed" if passed else "failed", parent, note)
        self.history.append(step)
        return step

    def add(self, b: Bottleneck, covers: frozenset[int] | None = None, refined: bool = False) -> None:
        if covers is not None:
            self.covers[len(self.found)] = covers
        if refined:
            self.refined.add(len(self.found))
        self.found.append(b)

    def hypothesis(self, h: str, tree: CallTreeProfile, stackset: StackSet) -> None:
        """Test ``h`` on the whole program; refine it from the entry points if it holds; then look bottom-up."""
        self.stacksets[h] = stackset
        self.shares[h] = self.share(tree.total())
        top = self.record(h, (), tree.total(), None)
        if top.verdict != "passed":
            return
        for entry in self._entry_points(tree):
            step = self.record(h, entry.path, tree.cum_of(entry), top.step, "entry point")
            if step.verdict == "passed":
                self.passed.setdefault(h, []).append(entry)
                self._refine(h, tree, entry, step)
        self._bottom_up(h, stackset, top.step)

    def _entry_points(self, tree: CallTreeProfile) -> list[CallTreeSummary]:
        """Functions that occur at a root of the tree, by descending cum.

        A function no one calls is one; a function that reaches the threshold
        is one when the cum of its occurrences without a caller (its cum less
        what it shares with its callers' paths) is not zero. Cheaper ones that
        are also called from elsewhere are left out: they could not pass anyway.
        """
        entries = []
        for s in tree.initial_summaries():
            if not tree.top_extensions(s):
                entries.append(s)
                continue
            cum = tree.cum_of(s)
            if cum >= self.bound and cum - cum_overlap(tree, s, tree.top_extension_summaries(s)) > 0:
                entries.append(s)
        entries.sort(key=lambda s: (-tree.cum_of(s), s.path))
        return entries

    def _refine(self, h: str, tree: CallTreeProfile, summary: CallTreeSummary, step: Step) -> None:
        """Test each callee of a focus that passed and go on down those that pass; report what the focus keeps.

        What a focus keeps is its own cost (``self`` when it reaches the
        threshold) and the cost of the callees that did not pass (``diffuse``
        when together they reach it). A focus where refinement stops always
        reports one of them: it passed, so its cost reaches the threshold.
        """
        if self.next_step() > MAX_STEPS:
            self.truncated = True
            return
        inclusive = {c: _inclusive(tree, c) for c in tree.bottom_extension_summaries(summary)}
        callees = sorted(inclusive, key=lambda c: (-inclusive[c], c.path))
        passing: list[tuple[CallTreeSummary, Step]] = []
        for c in callees:
            c_step = self.record(h, c.path, inclusive[c], step.step)
            if c_step.verdict == "passed":
                passing.append((c, c_step))
                self.passed.setdefault(h, []).append(c)
        own = _own(tree, summary)
        cum = _inclusive(tree, summary)
        rest = max(0, cum - own - sum(inclusive[c] for c, _ in passing))
        failed = [c for c in callees if all(c is not p for p, _ in passing)]
        name = _function(summary.path[-1])
        largest = (
            f"; the largest, {_function(failed[0].path[-1])}, {_pct(self.share(inclusive[failed[0]]))}"
            if failed
            else ""
        )
        if own >= self.bound:
            evidence = f"{_pct(self.share(own))} in {name} itself"
            if cum != own:
                evidence += f" ({_pct(self.share(cum))} with its callees)"
            covers = self.stacksets[h].ending_with(summary.path)
            self.add(Bottleneck(h, summary.path, self.share(own), "self", evidence), covers)
        if rest >= self.bound:
            self.add(
                Bottleneck(
                    h,
                    summary.path,
                    self.share(rest),
                    "diffuse",
                    f"{_pct(self.share(rest))} in callees of {name} spread over {len(failed)} of them, "
                    f"none of which reaches the threshold{largest}",
                )
            )
        elif not passing and own < self.bound:
            self.add(
                Bottleneck(
                    h,
                    summary.path,
                    self.share(cum),
                    "diffuse",
                    f"{_pct(self.share(cum))} under {name}: {_pct(self.share(own))} in itself and "
                    f"{_pct(self.share(rest))} over {len(failed)} callees, neither reaching the threshold{largest}",
                )
            )
        for c, c_step in passing:
            self._refine(h, tree, c, c_step)

    def _bottom_up(self, h: str, stacks: StackSet, top: int) -> None:
        """From each function whose own code reaches the threshold, up its callers to what a person would change.

        A hot function is refined by its dominant callers (:func:`refine`), and
        refinements that stop at one function are merged: the routine a dozen
        handlers share is found once, with its callers listed, however thin it
        is spread under each (the blind spot of a top-down search).
        """
        found = []
        for name in stacks.functions():
            own = stacks.self_cost(name)
            if own < self.bound or own <= 0:
                continue
            r = refine(stacks, name, self.is_library)
            found.append(r)
            where = " > ".join(_function(p) for p in r.path)
            self.history.append(
                Step(
                    self.next_step(),
                    h,
                    (name,),
                    self.share(own),
                    "passed",
                    top,
                    f"bottom-up: {_pct(self.share(own))} in {_function(name)} itself; up its callers to {where} "
                    f"({_pct(self.share(r.cost))}{', spread over its callers' if r.spread else ''})",
                )
            )
        for r in merge(stacks, found):
            self.add(self._refined_bottleneck(h, stacks, r), r.stacks, refined=True)

    def _refined_bottleneck(self, h: str, stacks: StackSet, r: Refined) -> Bottleneck:
        share = self.share(r.cost)
        head = _function(r.path[0])
        named = [(c, v) for c, v in r.callers if c is not None]
        callers = tuple((c, self.share(v)) for c, v in named)
        tree_path = _heaviest_prefix(stacks, r)
        if r.spread:
            shown = ", ".join(f"{_function(c)} {_pct(self.share(v))}" for c, v in named[:SHOWN_CALLERS])
            more = f" and {len(named) - SHOWN_CALLERS} more" if len(named) > SHOWN_CALLERS else ""
            alone = "none reaching the threshold alone" if named[0][1] < self.bound else "none holding most of it"
            evidence = (
                f"{_pct(share)} of the busy samples under {head} (with what it calls), spread over "
                f"{len(named)} callers, {alone}: {shown}{more}"
            )
            return Bottleneck(h, r.path, share, "spread", evidence, callers, tree_path)
        leaf = _function(r.path[-1])
        seed_cost = stacks.cost(stacks.containing((r.seed,)))
        if len(r.path) > 1:
            chain = " > ".join(_function(p) for p in r.path[-4:])
            chain = f"... > {chain}" if len(r.path) > 4 else chain
            evidence = f"{_pct(share)} of the busy samples in {chain}"
            if r.seed == r.path[-1] and seed_cost > r.cost:
                evidence += f": {_pct(r.cost / seed_cost)} of {leaf}'s {_pct(self.share(seed_cost))} comes from {head}"
        else:
            evidence = f"{_pct(share)} of the busy samples in {leaf} (with what it calls)"
        if named:
            evidence += f"; called from {_function(named[0][0])}" + (
                f" and {len(named) - 1} other(s)" if len(named) > 1 else ""
            )
        return Bottleneck(h, r.path, share, "path", evidence, callers, tree_path)

    def gc_pauses(self, gc: dict[str, Any]) -> None:
        """GC tested on the memory proflet's pauses: a share of the time, charged to the code that triggered them."""
        share = float(gc.get("pause_pct") or 0.0) / 100.0
        self.shares["gc"] = share
        passed = share >= self.threshold
        collections = sum(int(c or 0) for c in gc.get("collections") or ())
        step = Step(
            self.next_step(),
            "gc",
            (),
            share,
            "passed" if passed else "failed",
            note=f"the memory proflet measured the pauses of {collections:,} collections (a share of the time)",
        )
        self.history.append(step)
        if not passed:
            return
        # Sites by function (a comprehension's by the function that holds it), as the call trees name them.
        by_function: dict[str, list[dict[str, Any]]] = {}
        for site in gc.get("pauses_by_site") or ():
            function = _INLINE_SUFFIX.sub("", str(site.get("function")))
            by_function.setdefault(f"{function} ({site.get('file')})", []).append(site)
        ranked = sorted(by_function.items(), key=lambda kv: -sum(float(x.get("pause_pct") or 0) for x in kv[1]))
        for name, sites in ranked[:5]:
            pct = sum(float(x.get("pause_pct") or 0.0) for x in sites)
            site_share = share * pct / 100.0
            passed_here = site_share >= self.threshold
            self.history.append(
                Step(
                    self.next_step(),
                    "gc",
                    (name,),
                    site_share,
                    "passed" if passed_here else "failed",
                    step.step,
                    "allocations that triggered collections",
                )
            )
            if passed_here:
                worst = max(sites, key=lambda x: float(x.get("pause_pct") or 0))
                where = f"{os.path.basename(str(worst.get('file')))}:{worst.get('line')}"
                self.add(
                    Bottleneck(
                        "gc",
                        (name,),
                        site_share,
                        "gc",
                        f"garbage collection paused the program {_pct(share)} of the time ({collections:,} "
                        f"collections), {pct:.0f}% of it triggered by allocations in {_function(name)} ({where})",
                    )
                )

    def loop_evidence(self, tasks: dict[str, Any]) -> None:
        """The tasks proflet's loop blocks as evidence of what blocks the loop; a lag that starves its tasks.

        A sampled bottleneck blocking the loop gets the number the tasks
        proflet measured (how often and how long the loop was blocked in it);
        a loop whose callbacks start late with no block to blame is tested as
        ``starved`` (a task starved of the loop by many short callbacks).
        """
        blocks = tasks.get("blocks") or []
        loops = tasks.get("loops") or []
        for i, b in enumerate(self.found):
            if b.hypothesis not in ("loop", "cpu") or not b.path:
                continue
            names = {_function(p) for p in b.path}
            mine = [x for x in blocks if any(f.get("function") in names for f in x.get("stack") or ())]
            if not mine:
                continue
            seconds = sum(float(x.get("duration_ms") or 0) for x in mine) / 1000.0
            worst = max(mine, key=lambda x: float(x.get("duration_ms") or 0))
            task = f" (task {worst['task']})" if worst.get("task") else ""
            loop = next((lp for lp in loops if lp.get("thread") == worst.get("thread")), None)
            of_time = f", {float(loop['blocked_pct']):.0f}% of the loop's time blocked" if loop else ""
            self.found[i] = replace(
                b,
                kind="loop" if b.hypothesis == "loop" else b.kind,
                evidence=f"{b.evidence}; the event loop was blocked {len(mine)} time(s) for {seconds:.2f} s in "
                f"{_function(b.path[-1])}{task}, the longest {float(worst['duration_ms']):.0f} ms{of_time}",
            )
        threshold_ms = float(tasks.get("block_threshold_ms") or 100.0)
        for loop in loops:
            lag = float(loop.get("lag_ms_p99") or 0.0)
            if loop.get("blocks") or not loop.get("lag_probes"):
                continue
            if lag >= threshold_ms:
                # Many short callbacks, none long enough to be a block: the CPU-bound code they run is what
                # the starved tasks wait behind.
                for i, b in enumerate(self.found):
                    where = b.tree_path or b.path
                    if b.hypothesis == "cpu" and any(_function(p) in _LOOP_CALLBACK for p in where):
                        self.found[i] = replace(
                            b,
                            evidence=f"{b.evidence}; it runs in the event loop's callbacks, and tasks wait their "
                            f"turn up to {lag:.0f} ms (p99 lag of the loop in thread {loop.get('thread')})",
                        )
            self.history.append(
                Step(
                    self.next_step(),
                    "starved",
                    (),
                    None,
                    "passed" if lag >= threshold_ms else "failed",
                    note=f"the event loop in thread {loop.get('thread')}: 99% of its callbacks started within "
                    f"{lag:.0f} ms (a task waits its turn that long; {threshold_ms:.0f} ms is the limit)",
                )
            )

    def _precedence(self, i: int) -> int:
        """Which of two bottlenecks on the same samples is kept: the one that says more about what to change.

        A refinement that chose among callers or found a spread routine, then a
        top-down focus (its whole path from the entry point), then a refinement
        that is one function with its one caller, then what names no one place.
        """
        b = self.found[i]
        if b.kind == "diffuse":
            return 3
        if i in self.refined:
            return 0 if b.kind == "spread" or len(b.path) > 1 else 2
        return 1

    def _explained_by_gc(self) -> set[int]:
        """CPU bottlenecks whose function is a GC site that paused the program at least half as long.

        The collector runs on the thread whose allocation triggered it, so its
        pauses are sampled as that function's CPU time: the fix is to allocate
        (or keep) fewer objects there, which the gc bottleneck says.
        """
        sites = {_function(b.path[0]): b.share for b in self.found if b.kind == "gc" and b.path}
        return {
            i
            for i, b in enumerate(self.found)
            if b.hypothesis == "cpu" and b.path and sites.get(_function(b.path[-1]), 0.0) >= 0.5 * b.share
        }

    def finish(self, notes: list[str]) -> Diagnosis:
        if self.truncated:
            notes = [*notes, f"the search stopped after {MAX_STEPS} steps: raise the threshold"]
        if self.total == 0:
            notes = [*notes, "the profile has no busy samples"]
        order = {h: i for i, h in enumerate(HYPOTHESES)}
        # One place, once: each dropped when most of its samples are those of one kept before it
        # (of the same hypothesis).
        candidates = sorted(range(len(self.found)), key=lambda i: (self._precedence(i), -self.found[i].share, i))
        kept: list[int] = []
        explained = self._explained_by_gc()
        for i in candidates:
            if i in explained:
                b = self.found[i]
                self.history.append(
                    Step(
                        self.next_step(),
                        b.hypothesis,
                        b.path,
                        b.share,
                        "covered",
                        None,
                        f"{b.kind} at {_function(b.path[-1])}: most of it is the garbage collection its "
                        "allocations trigger, ranked as gc",
                    )
                )
                continue
            b = self.found[i]
            mine = self.covers.get(i)
            same = None
            if mine:
                stacks = self.stacksets[b.hypothesis]
                cost = stacks.cost(mine)
                for k in kept:
                    theirs = self.covers.get(k)
                    same_kind = theirs and self.found[k].hypothesis == b.hypothesis
                    if same_kind and theirs and stacks.cost(mine & theirs) >= SAME_PLACE * cost:
                        same = k
                        break
            if same is None:
                kept.append(i)
                continue
            other = self.found[same]
            self.history.append(
                Step(
                    self.next_step(),
                    b.hypothesis,
                    b.path,
                    b.share,
                    "covered",
                    None,
                    f"{b.kind} at {' > '.join(_function(p) for p in b.path[-3:])}: mostly the same samples as "
                    f"{' > '.join(_function(p) for p in other.path)}, ranked instead",
                )
            )
        # Places to fix first, by share; a focus that names no one place after them.
        ranked = sorted(
            (self.found[i] for i in kept),
            key=lambda b: (b.kind == "diffuse", -b.share, order.get(b.hypothesis, 99), b.path),
        )
        return Diagnosis(self.threshold, self.total, ranked, self.history, self.shares, notes)


def _heaviest_prefix(stacks: StackSet, r: Refined) -> tuple[str, ...]:
    """The root path down to the end of ``r.path`` that holds most of its samples: where a call tree opens."""
    weights: dict[tuple[str, ...], int] = {}
    n = len(r.path)
    for i in r.stacks:
        stack = stacks.stacks[i]
        for k in range(len(stack) - n + 1):
            if stack[k : k + n] == r.path:
                prefix = stack[: k + n]
                weights[prefix] = weights.get(prefix, 0) + stacks.counts[i]
                break
    if not weights:
        return r.path
    return max(weights.items(), key=lambda kv: (kv[1], kv[0]))[0]
