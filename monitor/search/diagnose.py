"""Automated diagnosis in the line of the Performance Consultant (seed 002): hypotheses, thresholds, refinement.

A pure function of a profile: :func:`diagnose` takes a dyper
:class:`~monitor.profile.Profile` (wall and cpu counts per stack),
:func:`diagnose_tree` a call tree with one count (a collapsed file), and both
return a :class:`Diagnosis`: the ranked bottlenecks and the search history.

The hypotheses, each a share of the *busy* samples (every thread's wall
samples, less those of threads asleep in ``sleep``: a thread that chose to
wait is no bottleneck, and counting it would hide every other one):

- ``cpu``: cpu samples (the thread was running Python);
- ``io``, ``sync``: blocked samples (wall but not cpu), told apart by what the
  thread was blocked in: the call on the leaf's source line when the source can
  be read (``sock.recv(...)``, ``lock.acquire()``), else the names of the
  innermost frames (``Condition.wait``, ``Queue.get``, ``SocketIO.readinto``,
  ``threading.py``, ``ssl.py``...). lock/acquire/wait/join/Condition/Queue/Event
  are synchronisation; recv/read/send/select/poll/accept/connect/socket/ssl/
  urlopen/http are I/O; sleep is sleeping, not a bottleneck;
- ``wait``: blocked samples whose call could not be named (no source, no hint
  in the frames): waiting on something, it is not known what;
- ``gc``: samples in garbage collection, only when the profile carries GC
  frames (``<GC>``, as CPython's own sampling profiler writes them, or Austin's
  ``:GC:``). dyper's agent records none yet, so on dyper profiles the
  hypothesis is reported as untestable;
- ``samples``: for a collapsed file, whose counts do not tell running from
  waiting: where the samples are.

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

The paper's blind spot, "a single resource-intensive function called by
numerous parent functions, yet none of its parents meet the threshold", is
covered bottom-up: every function whose base (own cost, all callers together)
reaches the threshold is split among its callers (:func:`caller_split`, as
:class:`~monitor.search.suggest.HighBaseSpread` does); what lies under callers
that the top-down search cannot reach is its *hidden* share, and a function
whose hidden share reaches the threshold is a ``spread`` bottleneck.

What the search does not do yet: ask the live agent for detailing (call
counts, exact CPU time) where a hypothesis needs it. The scheduler can
(``AgentSchedule.ask``), but no ctl operation of the monitor exposes it, so a
live diagnosis works from the sampled profile alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile
from dyper.monitor.search.calltree import CallTreeProfile, CallTreeSummary, function_label
from dyper.monitor.search.interface import base_overlap, cum_overlap
from dyper.monitor.search.suggest import caller_split

#: The Performance Consultant's CPU threshold (seed 002: "a 5% threshold was used for CPU bottlenecks").
DEFAULT_THRESHOLD = 0.05

#: Hypotheses in the order they are tested and listed.
HYPOTHESES = ("cpu", "io", "sync", "wait", "gc", "samples")

DESCRIPTIONS = {
    "cpu": "CPU-bound",
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
    kind: str  # "self", "diffuse" or "spread"
    evidence: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": list(self.path),
            "hypothesis": self.hypothesis,
            "share_pct": round(100.0 * self.share, 3),
            "kind": self.kind,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Step:
    """One test of a (hypothesis : focus) pair: a node of the Search History Graph.

    ``path`` is empty for the whole program; ``parent`` is the step this one
    refines (``None`` for the whole-program tests; the bottom-up tests hang
    from their hypothesis's whole-program test).
    ``verdict`` is ``passed`` or ``failed`` (against the threshold),
    ``untestable`` (the profile lacks the data) or ``ignored`` (sleeping).
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
    """
    _check_threshold(threshold)
    stacks: dict[str, list[tuple[list[str], int]]] = {h: [] for h in ("cpu", "io", "sync", "wait", "sleep", "gc")}
    labels = [function_label(f) for f in profile.frames]
    gc_frames = {i for i, f in enumerate(profile.frames) if f.name.strip().lower() in _GC_NAMES}
    empty = 0
    classified: dict[tuple[int, ...], str] = {}
    for s, frames in profile.charged_stacks(charge_libraries):
        if not frames:
            empty += s.wall
            continue
        names = [labels[i] for i in frames]
        if s.cpu > 0:
            stacks["cpu"].append((names, s.cpu))
        blocked = s.wall - s.cpu
        if blocked > 0:
            kind = classified.get(s.frames)
            if kind is None:
                kind = classified[s.frames] = classify_wait([profile.frames[i] for i in s.frames], line_text)
            stacks[kind].append((names, blocked))
        if gc_frames and any(i in gc_frames for i in s.frames):
            stacks["gc"].append((names, s.wall))
    trees = {h: CallTreeProfile.from_stacks(v) for h, v in stacks.items()}
    sleeping = trees["sleep"].total()
    total = sum(trees[h].total() for h in ("cpu", "io", "sync", "wait"))
    notes = []
    if empty:
        notes.append(f"{empty} samples of threads outside Python (no frames) are left out")
    untestable = {} if gc_frames else {"gc": "the profile carries no GC frames (dyper's agent does not record GC yet)"}
    search = _Search(threshold, total)
    everything = total + sleeping
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
    for h in ("cpu", "io", "sync", "wait", "gc"):
        if h in untestable:
            search.history.append(Step(search.next_step(), h, (), None, "untestable", note=untestable[h]))
            continue
        search.hypothesis(h, trees[h])
    return search.finish(notes)


def diagnose_tree(tree: CallTreeProfile, threshold: float = DEFAULT_THRESHOLD) -> Diagnosis:
    """Diagnose a call tree with one count per stack (a collapsed file): where the samples are, and GC if marked.

    The counts do not say whether a thread ran or waited, so ``cpu``, ``io``,
    ``sync`` and ``wait`` are untestable; ``samples`` takes their place.
    """
    _check_threshold(threshold)
    search = _Search(threshold, tree.total())
    search.hypothesis("samples", tree)
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

    def __init__(self, threshold: float, total: int) -> None:
        self.threshold = threshold
        self.total = total
        self.bound = threshold * total
        self.history: list[Step] = []
        self.found: list[Bottleneck] = []
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

    def hypothesis(self, h: str, tree: CallTreeProfile) -> None:
        """Test ``h`` on the whole program; refine it from the entry points if it holds; then look bottom-up."""
        self.shares[h] = self.share(tree.total())
        top = self.record(h, (), tree.total(), None)
        if top.verdict != "passed":
            return
        for entry in self._entry_points(tree):
            step = self.record(h, entry.path, tree.cum_of(entry), top.step, "entry point")
            if step.verdict == "passed":
                self.passed.setdefault(h, []).append(entry)
                self._refine(h, tree, entry, step)
        self._bottom_up(h, tree, top.step)

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
            self.found.append(Bottleneck(h, summary.path, self.share(own), "self", evidence))
        if rest >= self.bound:
            self.found.append(
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
            self.found.append(
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

    def _bottom_up(self, h: str, tree: CallTreeProfile, top: int) -> None:
        """The blind spot of a top-down search: a function costly in total, cheap under each caller.

        A function's *reached* cost is that of its occurrences on the foci the
        top-down search passed through; the rest is hidden from it.
        """
        passed = self.passed.get(h, [])
        for s in tree.initial_summaries():
            base = tree.base_of(s)
            if base < self.bound or base == 0:
                continue
            on_passed = [p for p in passed if s.path[0] in p.path]
            name = _function(s.path[0])
            hidden = base - (base_overlap(tree, s, on_passed) if on_passed else 0)
            parts = caller_split(tree, s, at_least=self.bound)
            callers = sum(1 for caller, _ in parts if caller is not None)
            largest = max((share for caller, share in parts if caller is not None), default=0)
            passes = hidden >= self.bound
            self.history.append(
                Step(
                    self.next_step(),
                    h,
                    s.path,
                    self.share(hidden),
                    "passed" if passes else "failed",
                    top,
                    f"bottom-up: {_pct(self.share(base))} in {name} itself, called from {callers} caller(s); "
                    f"{_pct(self.share(hidden))} of it off the paths the top-down search followed",
                )
            )
            if passes:
                self.found.append(
                    Bottleneck(
                        h,
                        s.path,
                        self.share(hidden),
                        "spread",
                        f"{_pct(self.share(base))} in {name} itself, called from {callers} caller(s), the largest "
                        f"part {_pct(self.share(largest))}; {_pct(self.share(hidden))} of it lies under callers "
                        "below the threshold, which a top-down search misses",
                    )
                )

    def finish(self, notes: list[str]) -> Diagnosis:
        if self.truncated:
            notes = [*notes, f"the search stopped after {MAX_STEPS} steps: raise the threshold"]
        if self.total == 0:
            notes = [*notes, "the profile has no busy samples"]
        order = {h: i for i, h in enumerate(HYPOTHESES)}
        # Places to fix first, by share; a focus that names no one place after them.
        ranked = sorted(self.found, key=lambda b: (b.kind == "diffuse", -b.share, order.get(b.hypothesis, 99), b.path))
        return Diagnosis(self.threshold, self.total, ranked, self.history, self.shares, notes)
