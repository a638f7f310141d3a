"""The search tool of BOTTLENECKS (seed 000, section 2.3): suggest, select, label, zoom.

:class:`SearchSession` holds the bookkeeping of a search (the current summary,
the numbered summaries last printed, labels, settings, where the analyst has
been) and runs one command at a time, returning a JSON-able dict; it prints
nothing. :func:`render` turns such a dict into rich tables, and
:func:`prompt_loop` is the interactive shell around both. The session is
written against the profile interface only, so it searches one call tree or
the difference of two alike.

Commands (``help`` lists them too)::

    suggester NAME        pick a suggester: highcum, highbase, spread (also "set suggester NAME")
    suggest [N]           the suggester's first N starting summaries (default 10), numbered
    select N              make summary N of the last listing current, and describe it
    label NAME            give the current summary the label NAME (a label may mark several summaries)
    labels                every label with its summaries (numbered) and their total base and cum
    zoom on|off           list nearby summaries zoomed (default on) or all of them
    cutoff X              the zooming cutoff ratio (default 0.95)
    top | bottom | both   which extensions to list next to the current summary (default both)
    extend N              like select, for a listed extension of the current summary
    extend top|bottom F   extend the current summary by the function F at the top (caller) or bottom (callee)
    trim top|bottom       drop the outermost (top) or innermost (bottom) function of the current path
    back                  return to the summary that was current before
    show                  describe the current summary again
    save FILE / load FILE the session (source, current path, labels with their paths, settings) as JSON
    help                  this list
    quit                  leave

Every summary printed is numbered, from 0 in each listing; ``select N`` refers
to the last listing. Numbers are sample counts (cpu or wall samples, or the
counts of a collapsed file); percentages are of the profile's total. When
comparing they may be negative: normalised (the default), B's counts are scaled
to A's total before the subtraction and percentages are of A's total, so that
each is the difference of two shares; raw, they are of A minus B.

Each command's result, as ``--json`` prints it (a list of these, one per command):

- every result: ``command`` (the text run), ``ok`` (bool), ``kind``; when ``ok``
  is false, ``error`` (a message) and nothing else;
- a SUMMARY is ``{"n", "path", "base", "cum", "base_pct", "cum_pct", "labels"}``:
  ``n`` its number in this listing (absent when not numbered), ``path`` the
  frames outermost first, ``*_pct`` of ``total`` (``null`` when the total is 0),
  ``labels`` the labels it carries; results with ``total`` have ``percent_of``
  too when percentages are of another number (a normalised comparison: the
  profile's total, the base scaled to it);
- ``kind: "suggestions"`` (suggest): ``suggester``, ``total``, ``summaries``: [SUMMARY];
- ``kind: "summary"`` (select, extend, trim, back, show, top/bottom/both with a
  current summary): ``total``; ``current``: SUMMARY without ``n``; ``overlaps``:
  one ``{"label", "cum_overlap", "cum_overlap_pct", "base_overlap", "base_overlap_pct"}``
  per label, the ``*_pct`` of the current summary's cum and base; ``nearby``:
  [SUMMARY plus ``relation`` ("top", "bottom": an extension at that end;
  "trim_top", "trim_bottom"), and ``added``, how many functions it adds (more
  than 1 when zooming went through) or removes];
- ``kind: "label"``: ``label``, ``path``, ``count`` (summaries with this label now);
- ``kind: "labels"``: ``total``, ``labels``: [{``label``, ``total_base``, ``total_cum``,
  ``total_base_pct``, ``total_cum_pct``, ``summaries``: [SUMMARY]}];
- ``kind: "settings"`` (suggester, zoom, cutoff, top/bottom/both without a
  current summary): ``settings``: {``suggester``, ``zoom``, ``cutoff``, ``direction``};
- ``kind: "saved"``: ``file``; ``kind: "loaded"``: ``file``, ``settings``,
  ``current`` (path or null), ``labels`` ({label: [paths]}), ``warnings`` [text];
- ``kind: "help"``: ``commands``: [{``usage``, ``help``}]; ``kind: "quit"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from dyper.monitor.search.interface import ProfileInterface, base_overlap, cum_overlap
from dyper.monitor.search.suggest import HighBase, HighBaseSpread, HighCum, Suggester
from dyper.monitor.search.zoom import DEFAULT_CUTOFF, Direction, zoom

S = TypeVar("S")

SESSION_FORMAT = "dyper-search-session"
SESSION_VERSION = 1

#: suggester names as the ``suggester`` command takes them
SUGGESTER_NAMES: dict[str, Callable[[], Suggester]] = {
    "highcum": HighCum,
    "highbase": HighBase,
    "spread": HighBaseSpread,
}
_SUGGESTER_ALIASES = {"highbasespread": "spread"}

DEFAULT_SUGGESTIONS = 10
DIRECTIONS = ("top", "bottom", "both")

Result = dict[str, Any]


class CommandError(Exception):
    """A command the session cannot run: its message is for the analyst."""


@dataclass(frozen=True)
class _Entry:
    """One numbered summary of the last listing."""

    summary: Any
    relation: str | None = None  # for nearby summaries: "top", "bottom", "trim_top", "trim_bottom"


_HELP: list[tuple[str, str]] = [
    ("suggester NAME", "pick a suggester: highcum (top-down), highbase (bottom-up), spread (split among callers)"),
    ("suggest [N]", "the suggester's first N starting summaries (default 10), numbered"),
    ("select N", "make summary N of the last listing current and describe it"),
    ("label NAME", "give the current summary the label NAME"),
    ("labels", "every label, its summaries (numbered) and their total base and cum"),
    ("zoom on|off", "list nearby summaries zoomed through the cutoff, or all of them"),
    ("cutoff X", "the zooming cutoff ratio, a positive number (default 0.95)"),
    ("top | bottom | both", "which extensions to list next to the current summary"),
    ("extend N", "like select, for a listed extension of the current summary"),
    ("extend top|bottom F", "extend the current summary by function F: a caller (top) or a callee (bottom)"),
    ("trim top|bottom", "drop the outermost (top) or innermost (bottom) function of the current path"),
    ("back", "return to the summary that was current before"),
    ("show", "describe the current summary again"),
    ("save FILE", "save the session (source, current path, labels, settings) as JSON"),
    ("load FILE", "restore a saved session on this profile"),
    ("help", "this list"),
    ("quit", "leave"),
]


class SearchSession(Generic[S]):
    """The state of one search and the commands that change it; results are dicts, never printed here.

    ``source`` describes where the profile came from; it is saved with the
    session, and a session loaded on another source gets a warning.
    """

    def __init__(self, profile: ProfileInterface[S], source: dict[str, Any] | None = None) -> None:
        self.profile = profile
        self.source: dict[str, Any] = dict(source or {})
        self.suggester = "highcum"
        self.zoom = True
        self.cutoff = DEFAULT_CUTOFF
        self.direction = "both"
        self.current: S | None = None
        #: summaries that were current before, most recent last (for ``back``)
        self.trail: list[S] = []
        #: label -> the summaries carrying it, in the order they were labelled
        self.labels: dict[str, list[S]] = {}
        #: the numbered summaries of the last listing
        self.listing: list[_Entry] = []
        self.finished = False
        self._total = profile.total()
        # A normalised comparative profile's total is about 0 (A less B scaled to A's total):
        # its percentages are of A's total, which makes them differences of shares.
        self._percent_total: int = getattr(profile, "percent_total", self._total)
        self._commands: dict[str, Callable[[list[str]], Result]] = {
            "suggester": self._cmd_suggester,
            "set": self._cmd_set,
            "suggest": self._cmd_suggest,
            "select": self._cmd_select,
            "label": self._cmd_label,
            "labels": self._cmd_labels,
            "zoom": self._cmd_zoom,
            "cutoff": self._cmd_cutoff,
            "top": lambda a: self._cmd_direction("top", a),
            "bottom": lambda a: self._cmd_direction("bottom", a),
            "both": lambda a: self._cmd_direction("both", a),
            "extend": self._cmd_extend,
            "trim": self._cmd_trim,
            "back": self._cmd_back,
            "show": self._cmd_show,
            "save": self._cmd_save,
            "load": self._cmd_load,
            "help": self._cmd_help,
            "quit": self._cmd_quit,
            "exit": self._cmd_quit,
        }

    # --- running commands -------------------------------------------------------------

    def execute(self, line: str) -> Result:
        """Run one command line; a failing command leaves the session as it was and says why."""
        text = line.strip()
        try:
            words = shlex.split(text)
        except ValueError as exc:
            return {"command": text, "ok": False, "error": f"cannot parse the command: {exc}"}
        if not words:
            return {"command": text, "ok": False, "error": "empty command"}
        handler = self._commands.get(words[0].lower())
        if handler is None:
            return {"command": text, "ok": False, "error": f"unknown command {words[0]!r}: try help"}
        try:
            result = handler(words[1:])
        except CommandError as exc:
            return {"command": text, "ok": False, "error": str(exc)}
        return {"command": text, "ok": True, **result}

    def run_script(self, script: str) -> list[Result]:
        """Run the commands of ``script`` (separated by ``;`` or new lines) in order, up to ``quit``."""
        results = []
        for line in split_script(script):
            results.append(self.execute(line))
            if self.finished:
                break
        return results

    # --- describing summaries ---------------------------------------------------------

    def _pct(self, value: int) -> float | None:
        return None if self._percent_total == 0 else round(100.0 * value / abs(self._percent_total), 3)

    def _percent_of(self) -> Result:
        """``{"percent_of": N}`` when percentages are not of ``total`` (a normalised comparison: of A's total)."""
        return {} if self._percent_total == self._total else {"percent_of": self._percent_total}

    def labels_of(self, summary: S) -> list[str]:
        path = self.profile.path_of(summary)
        return [name for name, marked in self.labels.items() if any(self.profile.path_of(m) == path for m in marked)]

    def describe(self, summary: S, n: int | None = None) -> Result:
        """A SUMMARY object (see the module docstring)."""
        base = self.profile.base_of(summary)
        cum = self.profile.cum_of(summary)
        out: Result = {} if n is None else {"n": n}
        out.update(
            path=list(self.profile.path_of(summary)),
            base=base,
            cum=cum,
            base_pct=self._pct(base),
            cum_pct=self._pct(cum),
            labels=self.labels_of(summary),
        )
        return out

    def _numbered(self, entries: Iterable[_Entry]) -> list[Result]:
        self.listing = list(entries)
        out = []
        for n, entry in enumerate(self.listing):
            d = self.describe(entry.summary, n)
            if entry.relation is not None:
                d["relation"] = entry.relation
                d["added"] = abs(len(d["path"]) - len(self.profile.path_of(self._require_current())))
            out.append(d)
        return out

    def nearby(self, summary: S) -> list[_Entry]:
        """Extensions at the ends the direction asks for (zoomed or all), then both trimmings."""
        entries: list[_Entry] = []
        ends: tuple[Direction, ...] = ("top", "bottom") if self.direction == "both" else (self._end(self.direction),)
        for end in ends:
            if self.zoom:
                extensions = zoom(self.profile, summary, end, self.cutoff)
            else:
                found = (
                    self.profile.top_extension_summaries(summary)
                    if end == "top"
                    else self.profile.bottom_extension_summaries(summary)
                )
                extensions = sorted(found, key=lambda s: (-abs(self.profile.cum_of(s)), self.profile.path_of(s)))
            entries.extend(_Entry(s, end) for s in extensions)
        trims: tuple[tuple[str, Direction], ...] = (("trim_top", "top"), ("trim_bottom", "bottom"))
        for relation, end in trims:
            if self.zoom:
                shorter = zoom(self.profile, summary, end, self.cutoff, trim=True)
            else:
                one = self.profile.trim_top(summary) if end == "top" else self.profile.trim_bottom(summary)
                shorter = [] if one is None else [one]
            entries.extend(_Entry(s, relation) for s in shorter)
        return entries

    @staticmethod
    def _end(direction: str) -> Direction:
        return "top" if direction == "top" else "bottom"

    def summary_result(self) -> Result:
        """The ``summary`` result for the current summary: metrics, overlap with each label, nearby summaries."""
        s = self._require_current()
        cum = self.profile.cum_of(s)
        base = self.profile.base_of(s)
        overlaps = []
        for name, marked in self.labels.items():
            c = cum_overlap(self.profile, s, marked)
            b = base_overlap(self.profile, s, marked)
            overlaps.append(
                {
                    "label": name,
                    "cum_overlap": c,
                    "cum_overlap_pct": None if cum == 0 else round(100.0 * c / abs(cum), 3),
                    "base_overlap": b,
                    "base_overlap_pct": None if base == 0 else round(100.0 * b / abs(base), 3),
                }
            )
        return {
            "kind": "summary",
            "total": self._total,
            **self._percent_of(),
            "current": self.describe(s),
            "overlaps": overlaps,
            "nearby": self._numbered(self.nearby(s)),
        }

    def _require_current(self) -> S:
        if self.current is None:
            raise CommandError("no current summary: suggest, then select N")
        return self.current

    def _go(self, summary: S) -> Result:
        if self.current is not None:
            self.trail.append(self.current)
        self.current = summary
        return self.summary_result()

    def _entry(self, word: str) -> _Entry:
        try:
            n = int(word)
        except ValueError:
            raise CommandError(f"{word!r} is not a summary number") from None
        if not self.listing:
            raise CommandError("no numbered summaries yet: suggest first")
        if not 0 <= n < len(self.listing):
            raise CommandError(f"no summary numbered {n}: the last listing has 0..{len(self.listing) - 1}")
        return self.listing[n]

    def settings(self) -> dict[str, Any]:
        return {"suggester": self.suggester, "zoom": self.zoom, "cutoff": self.cutoff, "direction": self.direction}

    # --- the commands -----------------------------------------------------------------

    def _cmd_set(self, args: list[str]) -> Result:
        if len(args) == 2 and args[0].lower() == "suggester":
            return self._cmd_suggester(args[1:])
        raise CommandError("usage: set suggester NAME")

    def _cmd_suggester(self, args: list[str]) -> Result:
        if len(args) > 1:
            raise CommandError("usage: suggester NAME")
        if args:
            name = args[0].lower()
            name = _SUGGESTER_ALIASES.get(name, name)
            if name not in SUGGESTER_NAMES:
                raise CommandError(f"no suggester {args[0]!r}: choose {', '.join(SUGGESTER_NAMES)}")
            self.suggester = name
        return {"kind": "settings", "settings": self.settings()}

    def _cmd_suggest(self, args: list[str]) -> Result:
        limit = DEFAULT_SUGGESTIONS
        if len(args) > 1:
            raise CommandError("usage: suggest [N]")
        if args:
            try:
                limit = int(args[0])
            except ValueError:
                raise CommandError(f"{args[0]!r} is not a number of suggestions") from None
            if limit < 1:
                raise CommandError("ask for at least 1 suggestion")
        found = SUGGESTER_NAMES[self.suggester]().suggest(self.profile, limit)
        self.listing = [_Entry(s) for s in found]
        return {
            "kind": "suggestions",
            "suggester": self.suggester,
            "total": self._total,
            **self._percent_of(),
            "summaries": [self.describe(s, n) for n, s in enumerate(found)],
        }

    def _cmd_select(self, args: list[str]) -> Result:
        if len(args) != 1:
            raise CommandError("usage: select N")
        return self._go(self._entry(args[0]).summary)

    def _cmd_extend(self, args: list[str]) -> Result:
        current = self._require_current()
        if len(args) == 1:
            entry = self._entry(args[0])
            if entry.relation not in ("top", "bottom"):
                raise CommandError(f"summary {args[0]} is not an extension of the current summary: select it instead")
            return self._go(entry.summary)
        if len(args) != 2 or args[0] not in ("top", "bottom"):
            raise CommandError("usage: extend N, or extend top|bottom FUNCTION")
        end, name = args
        names = self.profile.top_extensions(current) if end == "top" else self.profile.bottom_extensions(current)
        if name not in names:
            where = "calls" if end == "top" else "is called by"
            raise CommandError(f"no {name!r} that {where} the current path ({len(names)} {end} extensions)")
        longer = self.profile.extend_top(current, name) if end == "top" else self.profile.extend_bottom(current, name)
        return self._go(longer)

    def _cmd_trim(self, args: list[str]) -> Result:
        current = self._require_current()
        if len(args) != 1 or args[0] not in ("top", "bottom"):
            raise CommandError("usage: trim top|bottom")
        shorter = self.profile.trim_top(current) if args[0] == "top" else self.profile.trim_bottom(current)
        if shorter is None:
            raise CommandError("a path of one function cannot be trimmed")
        return self._go(shorter)

    def _cmd_back(self, args: list[str]) -> Result:
        if args:
            raise CommandError("usage: back")
        if not self.trail:
            raise CommandError("nothing to go back to")
        self.current = self.trail.pop()
        return self.summary_result()

    def _cmd_show(self, args: list[str]) -> Result:
        if args:
            raise CommandError("usage: show")
        return self.summary_result()

    def _cmd_label(self, args: list[str]) -> Result:
        if len(args) != 1:
            raise CommandError("usage: label NAME")
        s = self._require_current()
        name = args[0]
        marked = self.labels.setdefault(name, [])
        path = self.profile.path_of(s)
        if all(self.profile.path_of(m) != path for m in marked):
            marked.append(s)
        return {"kind": "label", "label": name, "path": list(path), "count": len(marked)}

    def _cmd_labels(self, args: list[str]) -> Result:
        if args:
            raise CommandError("usage: labels")
        entries: list[_Entry] = []
        out = []
        for name, marked in self.labels.items():
            summaries = []
            for s in marked:
                summaries.append(self.describe(s, len(entries)))
                entries.append(_Entry(s))
            tb = self.profile.total_base_of(marked)
            tc = self.profile.total_cum_of(marked)
            out.append(
                {
                    "label": name,
                    "total_base": tb,
                    "total_cum": tc,
                    "total_base_pct": self._pct(tb),
                    "total_cum_pct": self._pct(tc),
                    "summaries": summaries,
                }
            )
        self.listing = entries
        return {"kind": "labels", "total": self._total, **self._percent_of(), "labels": out}

    def _cmd_zoom(self, args: list[str]) -> Result:
        if len(args) > 1 or (args and args[0].lower() not in ("on", "off")):
            raise CommandError("usage: zoom on|off")
        if args:
            self.zoom = args[0].lower() == "on"
        return {"kind": "settings", "settings": self.settings()}

    def _cmd_cutoff(self, args: list[str]) -> Result:
        if len(args) > 1:
            raise CommandError("usage: cutoff X")
        if args:
            try:
                value = float(args[0])
            except ValueError:
                raise CommandError(f"{args[0]!r} is not a number") from None
            if not value > 0 or value != value or value == float("inf"):
                raise CommandError("the cutoff ratio must be a positive number (the paper's default is 0.95)")
            self.cutoff = value
        return {"kind": "settings", "settings": self.settings()}

    def _cmd_direction(self, direction: str, args: list[str]) -> Result:
        if args:
            raise CommandError(f"usage: {direction}")
        self.direction = direction
        if self.current is None:
            return {"kind": "settings", "settings": self.settings()}
        return self.summary_result()

    def _cmd_save(self, args: list[str]) -> Result:
        if len(args) != 1:
            raise CommandError("usage: save FILE")
        path = Path(args[0])
        data = self.to_json()
        try:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            raise CommandError(f"cannot save to {path}: {exc.strerror or exc}") from None
        return {"kind": "saved", "file": str(path)}

    def _cmd_load(self, args: list[str]) -> Result:
        if len(args) != 1:
            raise CommandError("usage: load FILE")
        try:
            data = json.loads(Path(args[0]).read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {args[0]}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            warnings = self.restore(data)
        except ValueError as exc:
            raise CommandError(f"{args[0]}: {exc}") from None
        current = None if self.current is None else list(self.profile.path_of(self.current))
        return {
            "kind": "loaded",
            "file": args[0],
            "settings": self.settings(),
            "current": current,
            "labels": {k: [list(self.profile.path_of(s)) for s in v] for k, v in self.labels.items()},
            "warnings": warnings,
        }

    def _cmd_help(self, args: list[str]) -> Result:
        return {"kind": "help", "commands": [{"usage": u, "help": h} for u, h in _HELP]}

    def _cmd_quit(self, args: list[str]) -> Result:
        self.finished = True
        return {"kind": "quit"}

    # --- saving -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The session as saved: source, current path, trail, labels with their paths, settings."""
        return {
            "format": SESSION_FORMAT,
            "version": SESSION_VERSION,
            "source": self.source,
            "settings": self.settings(),
            "current": None if self.current is None else list(self.profile.path_of(self.current)),
            "trail": [list(self.profile.path_of(s)) for s in self.trail],
            "labels": {k: [list(self.profile.path_of(s)) for s in v] for k, v in self.labels.items()},
        }

    def restore(self, data: Any) -> list[str]:
        """Take over a saved session; paths this profile does not have are dropped with a warning.

        Raises :class:`ValueError` when ``data`` is not a saved session. The
        numbered listing is cleared: numbers refer to what was printed in this run.
        """
        if not isinstance(data, dict) or data.get("format") != SESSION_FORMAT:
            raise ValueError(f'not a saved search session (no "format": "{SESSION_FORMAT}")')
        if data.get("version") != SESSION_VERSION:
            raise ValueError(f"session version {data.get('version')} is not supported")
        warnings: list[str] = []
        source = data.get("source") or {}
        if self.source and source and source != self.source:
            warnings.append(f"the session was saved on another source ({_source_text(source)})")
        settings = data.get("settings") or {}
        try:
            suggester = str(settings.get("suggester", self.suggester))
            zoom_on = bool(settings.get("zoom", self.zoom))
            cutoff = float(settings.get("cutoff", self.cutoff))
            direction = str(settings.get("direction", self.direction))
            labels_in = dict(data.get("labels") or {})
            trail_in = list(data.get("trail") or [])
            current_in = data.get("current")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed session ({exc})") from None
        if suggester not in SUGGESTER_NAMES or direction not in DIRECTIONS or not cutoff > 0:
            raise ValueError("malformed session settings")

        def find(path: Any, what: str) -> S | None:
            if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
                raise ValueError(f"malformed path in {what}")
            s = self.profile.summary(path)
            if s is None:
                warnings.append(f"{what}: the path {' > '.join(path)} does not occur in this profile")
            return s

        labels: dict[str, list[S]] = {}
        for name, paths in labels_in.items():
            if not isinstance(paths, list):
                raise ValueError(f"malformed label {name!r}")
            found = [s for s in (find(p, f"label {name}") for p in paths) if s is not None]
            if found:
                labels[str(name)] = found
        trail = [s for s in (find(p, "trail") for p in trail_in) if s is not None]
        current = None if current_in is None else find(current_in, "current summary")
        self.suggester, self.zoom, self.cutoff, self.direction = suggester, zoom_on, cutoff, direction
        self.labels, self.trail, self.current = labels, trail, current
        self.listing = []
        return warnings


def split_script(script: str) -> list[str]:
    """``"suggest; select 0"`` -> ``["suggest", "select 0"]``; new lines separate too, ``#`` starts a comment."""
    out: list[str] = []
    for line in script.splitlines():
        if line.lstrip().startswith("#"):
            continue
        out.extend(part.strip() for part in line.split(";") if part.strip())
    return out


def _source_text(source: dict[str, Any]) -> str:
    text = str(source.get("source", "?"))
    if source.get("compare"):
        text += f" minus {source['compare']}"
    return text


# --- rendering --------------------------------------------------------------------------


def short_name(name: str) -> str:
    """``f (/long/path/app.py:12)`` -> ``f (app.py:12)``: frame names short enough for a table."""
    if name.endswith(")") and " (" in name:
        head, _, where = name[:-1].rpartition(" (")
        return f"{head} ({os.path.basename(where)})"
    return name


def _path_text(path: Sequence[str]) -> str:
    return " > ".join(short_name(p) for p in path) if path else "(whole program)"


def _total_text(result: Result, bare: bool = False) -> str:
    """``total N``; for a normalised comparison, what its percentages are of."""
    if "percent_of" in result:
        text = f"{_num(result['percent_of'])}, the base scaled to that total"
        return text if bare else f"% of {text}"
    return _num(result["total"]) if bare else f"total {_num(result['total'])}"


def _num(value: int) -> str:
    return f"{value:,}"


def _pct_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _summary_table(rows: list[Result], title: str | None, with_relation: bool = False) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("#", justify="right")
    if with_relation:
        table.add_column("nearby", style="dim")
    for col in ("base", "base %", "cum", "cum %"):
        table.add_column(col, justify="right")
    table.add_column("path (outermost first)", overflow="fold")
    table.add_column("labels", style="magenta")
    for r in rows:
        table.add_row(
            str(r["n"]),
            *([_RELATION_TEXT.get(r["relation"], str(r["relation"])) + _added_text(r)] if with_relation else []),
            _num(r["base"]),
            _pct_text(r["base_pct"]),
            _num(r["cum"]),
            _pct_text(r["cum_pct"]),
            _path_text(r["path"]),
            ", ".join(r["labels"]),
        )
    return table


_RELATION_TEXT = {"top": "caller", "bottom": "callee", "trim_top": "trim top", "trim_bottom": "trim bottom"}


def _added_text(r: Result) -> str:
    return f" x{r['added']}" if r.get("added", 1) > 1 else ""


def render(result: Result) -> RenderableType:
    """A command's result for the terminal."""
    if not result["ok"]:
        return Text(f"error: {result['error']}", style="bold red")
    kind = result["kind"]
    if kind == "suggestions":
        if not result["summaries"]:
            return Text(f"{result['suggester']}: no suggestions")
        return _summary_table(result["summaries"], f"{result['suggester']}: starting summaries ({_total_text(result)})")
    if kind == "summary":
        return _render_summary(result)
    if kind == "label":
        return Text(f"labelled {_path_text(result['path'])} as {result['label']!r} ({result['count']} with it)")
    if kind == "labels":
        if not result["labels"]:
            return Text("no labels yet: select a summary, then label NAME")
        parts: list[RenderableType] = []
        for lab in result["labels"]:
            title = (
                f"label {lab['label']!r}: total base {_num(lab['total_base'])} ({_pct_text(lab['total_base_pct'])}), "
                f"total cum {_num(lab['total_cum'])} ({_pct_text(lab['total_cum_pct'])})"
            )
            parts.append(_summary_table(lab["summaries"], title))
        return Group(*parts)
    if kind == "settings":
        s = result["settings"]
        return Text(
            f"suggester {s['suggester']}, zoom {'on' if s['zoom'] else 'off'}, cutoff {s['cutoff']:g}, "
            f"extensions {s['direction']}"
        )
    if kind == "saved":
        return Text(f"saved the session to {result['file']}")
    if kind == "loaded":
        lines = [f"loaded {result['file']}: {len(result['labels'])} label(s)"]
        if result["current"] is not None:
            lines.append(f"current: {_path_text(result['current'])} (show to describe it)")
        lines.extend(f"warning: {w}" for w in result["warnings"])
        return Text("\n".join(lines))
    if kind == "help":
        table = Table(box=box.SIMPLE, show_header=False, show_edge=False, pad_edge=False)
        table.add_column(style="bold")
        table.add_column()
        for c in result["commands"]:
            table.add_row(c["usage"], c["help"])
        return table
    return Text("")


def _render_summary(result: Result) -> RenderableType:
    cur = result["current"]
    head = Text()
    head.append("current: ", style="bold")
    head.append(_path_text(cur["path"]), style="bold cyan")
    if cur["labels"]:
        head.append(f"  [{', '.join(cur['labels'])}]", style="magenta")
    head.append(
        f"\nbase {_num(cur['base'])} ({_pct_text(cur['base_pct'])})   cum {_num(cur['cum'])} "
        f"({_pct_text(cur['cum_pct'])})   of {_total_text(result, bare=True)}"
    )
    parts: list[RenderableType] = [head]
    if result["overlaps"]:
        table = Table(title="overlap with labels", box=box.SIMPLE_HEAD, show_edge=False, header_style="bold")
        for col in ("label", "cum overlap", "% of cum", "base overlap", "% of base"):
            table.add_column(col, justify="left" if col == "label" else "right")
        for o in result["overlaps"]:
            table.add_row(
                o["label"],
                _num(o["cum_overlap"]),
                _pct_text(o["cum_overlap_pct"]),
                _num(o["base_overlap"]),
                _pct_text(o["base_overlap_pct"]),
            )
        parts.append(table)
    if result["nearby"]:
        parts.append(_summary_table(result["nearby"], "nearby summaries", with_relation=True))
    else:
        parts.append(Text("no nearby summaries", style="dim"))
    return Group(*parts)


def prompt_loop(
    session: SearchSession[Any],
    console: Console,
    *,
    read: Callable[[str], str] = input,
    emit: Callable[[Result], None] | None = None,
    prompt: str = "bottlenecks> ",
) -> list[Result]:
    """The interactive shell: read a line, run it, print it, until ``quit`` or end of input.

    ``emit`` replaces printing (``--json`` collects results instead). Ctrl-C
    drops the line being typed; Ctrl-D leaves.
    """
    with contextlib.suppress(ImportError):  # line editing and history for input(), where the platform has it
        import readline  # noqa: F401
    results: list[Result] = []
    while not session.finished:
        try:
            line = read(prompt)
        except EOFError:
            console.print()
            break
        except KeyboardInterrupt:
            console.print()
            continue
        for command in split_script(line):
            result = session.execute(command)
            results.append(result)
            if emit is not None:
                emit(result)
            elif not (result["ok"] and result["kind"] == "quit"):
                console.print(render(result))
            if session.finished:
                break
    return results
