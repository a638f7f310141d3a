"""Exporters: a profile written in formats other tools open.

Each exporter is a small class with its format name, the file suffixes it
owns and one ``render(profile)`` (``encode`` for the binary pprof);
:func:`exporter_for` picks one from an output path, so ``-o prof.collapsed``,
``-o prof.speedscope.json``, ``-o prof.pb.gz`` or ``-o prof.html`` just work,
and :func:`exporter_named` from ``dyper export --format``.
"""

from __future__ import annotations

import gzip
import html
import json
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from dyper.monitor.profile import Metric, Profile
from dyper.monitor.session import Frame


def frame_label(frame: Frame) -> str:
    """``qualname (file:line)``; ';' is the collapsed format's separator, so it is replaced."""
    return f"{frame.name} ({frame.file}:{frame.line})".replace(";", ":")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dyper")
    except PackageNotFoundError:
        return "0"


class Exporter:
    format: ClassVar[str]  # the name `dyper export --format` takes
    suffix: ClassVar[str]  # the usual file suffix
    suffixes: ClassVar[tuple[str, ...]] = ()  # others recognised in -o
    description: ClassVar[str]

    def __init__(self, metric: Metric = "cpu", charge_libraries: bool = False) -> None:
        self.metric = metric
        self.charge_libraries = charge_libraries

    def render(self, profile: Profile) -> str:
        raise NotImplementedError

    def encode(self, profile: Profile) -> bytes:
        """The file's bytes."""
        return self.render(profile).encode("utf-8")

    def write(self, profile: Profile, path: str | Path) -> None:
        Path(path).write_bytes(self.encode(profile))

    def _value(self, wall: int, cpu: int) -> int:
        return cpu if self.metric == "cpu" else wall


class Collapsed(Exporter):
    """Folded stacks (Brendan Gregg's format; flamegraph.pl, speedscope, inferno)."""

    format = "collapsed"
    suffix = ".collapsed"
    suffixes = (".folded",)
    description = "folded stacks: root first, ';'-separated, then a space and the sample count"

    def render(self, profile: Profile) -> str:
        labels = [frame_label(f) for f in profile.frames]
        merged: dict[str, int] = {}
        for s, frames in profile.charged_stacks(self.charge_libraries):
            n = s.cpu if self.metric == "cpu" else s.wall
            if n and frames:
                line = ";".join(labels[i] for i in frames)
                merged[line] = merged.get(line, 0) + n
        return "".join(f"{line} {n}\n" for line, n in sorted(merged.items()))


class Speedscope(Exporter):
    """speedscope's JSON file format, one sampled profile per thread.

    The format is speedscope's ``FileFormat.File`` (src/lib/file-format-spec.ts):
    ``shared.frames`` holds ``{name, file, line}``, and each sampled profile
    lists its stacks root first, as indexes into them, with one weight each.
    """

    format = "speedscope"
    suffix = ".speedscope.json"
    description = "https://www.speedscope.app file format, one profile per thread"

    def render(self, profile: Profile) -> str:
        frames = [{"name": f.name, "file": f.file, "line": f.line} for f in profile.frames]
        per_thread: dict[int, tuple[list[list[int]], list[int]]] = {}
        for s, stack in profile.charged_stacks(self.charge_libraries):
            n = s.cpu if self.metric == "cpu" else s.wall
            if n and stack:
                samples, weights = per_thread.setdefault(s.thread, ([], []))
                samples.append(list(stack))
                weights.append(n)
        profiles = []
        for tid, (samples, weights) in sorted(per_thread.items(), key=lambda kv: -sum(kv[1][1])):
            profiles.append(
                {
                    "type": "sampled",
                    "name": f"{profile.threads.get(tid, 'thread')} ({tid}) {self.metric} samples",
                    "unit": "none",
                    "startValue": 0,
                    "endValue": sum(weights),
                    "samples": samples,
                    "weights": weights,
                }
            )
        argv = " ".join(profile.process.get("argv", [])) or "python"
        doc = {
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": frames},
            "profiles": profiles,
            "name": f"dyper: {argv} (pid {profile.process.get('pid')})",
            "activeProfileIndex": 0,
            "exporter": f"dyper@{_version()}",
        }
        return json.dumps(doc)


class OwnJson(Exporter):
    """dyper's own profile, which every dyper command that takes a profile reads."""

    format = "json"
    suffix = ".json"
    description = "dyper's own profile format (see monitor.profile.Profile.to_json)"

    def render(self, profile: Profile) -> str:
        return json.dumps(profile.to_json())


class Pprof(Exporter):
    """pprof's format: a gzipped ``perftools.profiles.Profile`` protobuf (monitor/pprof/profile.proto).

    One location per code line and one function per Python function. Each
    sample is a (thread, stack) with four values: cpu and wall samples, and
    the same as estimated nanoseconds (samples x the mean time between
    sampling passes) when the profile knows its duration; the ``metric``
    picks the one pprof shows first. As everywhere in dyper, cpu counts the
    samples of threads not blocked in a known blocking call, which includes
    threads waiting for the GIL: its time can add up to more than one core.
    Threads are labels (``thread``, ``thread_id``), so ``pprof -tagfocus``
    can pick one.
    """

    format = "pprof"
    suffix = ".pb.gz"
    suffixes = (".pprof",)
    description = "gzipped pprof protobuf (go tool pprof, pprof.me, Pyroscope, Polar Signals)"

    def render(self, profile: Profile) -> str:
        raise TypeError("pprof is binary: use encode()")

    def encode(self, profile: Profile) -> bytes:
        return gzip.compress(self.build(profile).SerializeToString(), mtime=0)

    def build(self, profile: Profile) -> Any:
        """The ``Profile`` message, before serialisation."""
        from dyper.monitor.pprof import profile_pb2 as pb

        strings: dict[str, int] = {"": 0}

        def s(text: str) -> int:
            i = strings.get(text)
            if i is None:
                i = strings[text] = len(strings)
            return i

        out = pb.Profile()
        proc = profile.process
        passes = int(proc.get("samples") or 0)
        duration = float(proc.get("duration_s") or 0.0)
        interval_ns = int(duration * 1e9 / passes) if passes > 0 and duration > 0 else 0
        types = [("cpu_samples", "count"), ("wall_samples", "count")]
        if interval_ns:
            types += [("cpu", "nanoseconds"), ("wall", "nanoseconds")]
        for kind, unit in types:
            out.sample_type.add(type=s(kind), unit=s(unit))
        shown = self.metric if interval_ns else f"{self.metric}_samples"
        out.default_sample_type = s(shown)
        if interval_ns:
            out.period_type.type = s("wall")
            out.period_type.unit = s("nanoseconds")
            out.period = interval_ns
        window = proc.get("window") or {}
        start = window.get("first_report_t") or proc.get("start_time") or 0.0
        out.time_nanos = int(float(start) * 1e9)
        out.duration_nanos = int(duration * 1e9)
        argv = " ".join(proc.get("argv") or []) or "python"
        out.comment.append(s(f"dyper@{_version()}: pid {proc.get('pid')} {argv}"))
        if window.get("description"):
            out.comment.append(s(f"window: {window['description']}"))

        # One mapping, the interpreter, already symbolised: pprof then neither warns nor tries to symbolise.
        exe = str(proc.get("executable") or (proc.get("argv") or ["python"])[0])
        out.mapping.add(id=1, filename=s(exe), has_functions=True, has_filenames=True, has_line_numbers=True)
        functions: dict[tuple[str, str, int], int] = {}
        for i, f in enumerate(profile.frames):
            fid = functions.get(f.function)
            if fid is None:
                fid = functions[f.function] = len(functions) + 1
                out.function.add(
                    id=fid, name=s(_pprof_name(f)), system_name=s(f.name), filename=s(f.file), start_line=f.firstline
                )
            loc = out.location.add(id=i + 1, mapping_id=1)
            loc.line.add(function_id=fid, line=f.line)

        merged: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for st, frames in profile.charged_stacks(self.charge_libraries):
            if (st.wall or st.cpu) and frames:
                slot = merged.setdefault((st.thread, frames), [0, 0])
                slot[0] += st.cpu
                slot[1] += st.wall
        key_thread, key_tid = s("thread"), s("thread_id")
        for (tid, frames), (cpu, wall) in merged.items():
            values = [cpu, wall] + ([cpu * interval_ns, wall * interval_ns] if interval_ns else [])
            sample = out.sample.add(location_id=[i + 1 for i in reversed(frames)], value=values)
            sample.label.add(key=key_thread, str=s(profile.threads.get(tid, "thread")))
            sample.label.add(key=key_tid, num=tid)
        out.string_table.extend(strings)  # dicts keep insertion order: index order
        return out


def _pprof_name(frame: Frame) -> str:
    """pprof shows a name that starts with "<" as the mapping's ("[python]"): prefix the module's."""
    if frame.name.startswith("<"):
        stem = frame.file.rsplit("/", 1)[-1].removesuffix(".py") or "?"
        return f"{stem}.{frame.name}"
    return frame.name


class FlameGraphHtml(Exporter):
    """A flame graph in one HTML file: inline script and style, no network, opens offline.

    Threads are the first level under the root. Click a frame to zoom into
    it (again, or on an ancestor, to go back out), search by name or file
    (``/regex/`` too) to see the share of matching frames, flip the root to
    the bottom. The profile is embedded as JSON (``#dyper-data``: frames
    ``[name, file, line, kind]`` and the tree ``[frame, self, total,
    [children]]``). Trees above :attr:`max_nodes` nodes lose their smallest
    frames, which leaves gaps of the size they had.
    """

    format = "html"
    suffix = ".html"
    suffixes = (".htm",)
    description = "a self-contained HTML flame graph: click to zoom, search; no network needed"
    max_nodes = 40_000

    def render(self, profile: Profile) -> str:
        data = self.data(profile)
        template = resources.files("dyper.monitor").joinpath("templates/flamegraph.html").read_text(encoding="utf-8")
        # In a <script> element only "</" can end it early; escaping < > & keeps the JSON inert.
        payload = (
            json.dumps(data, separators=(",", ":"), ensure_ascii=False)
            .replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
        )
        return template.replace("__DYPER_TITLE__", html.escape(data["title"])).replace("__DYPER_DATA__", payload)

    def data(self, profile: Profile) -> dict[str, Any]:
        """The embedded JSON: title, subtitle, unit, frames and the nested tree."""
        is_library = profile.library_predicate()
        frames: list[list[Any]] = [["all", "", 0, 3]]
        frame_ids: dict[int, int] = {}
        thread_ids: dict[int, int] = {}
        # node: [frame, self, total, children by key]
        root: list[Any] = [0, 0, 0, {}]
        for st, stack in profile.charged_stacks(self.charge_libraries):
            n = self._value(st.wall, st.cpu)
            if n == 0:
                continue
            tf = thread_ids.get(st.thread)
            if tf is None:
                tf = thread_ids[st.thread] = len(frames)
                frames.append([f"{profile.threads.get(st.thread, 'thread')} ({st.thread})", "", 0, 2])
            node = root
            node[2] += n
            for key in (tf, *(self._frame_id(profile, i, frames, frame_ids, is_library) for i in stack)):
                child = node[3].get(key)
                if child is None:
                    child = node[3][key] = [key, 0, 0, {}]
                child[2] += n
                node = child
            node[1] += n
        floor = prune_floor(root, self.max_nodes)
        proc = profile.process
        argv = " ".join(proc.get("argv") or []) or "python"
        window = (proc.get("window") or {}).get("description") or (
            f"last {proc['window_s']:g}s" if proc.get("window_s") else "whole run"
        )
        subtitle = f"pid {proc.get('pid', '?')} · {argv} · {self.metric} samples · {window}"
        if self.charge_libraries:
            subtitle += " · library time charged to the calling application line"
        if floor:
            subtitle += f" · frames under {floor} samples left out"
        return {
            "title": f"dyper: {argv[:80]} (pid {proc.get('pid', '?')})",
            "subtitle": subtitle,
            "unit": f"{self.metric} samples",
            "frames": frames,
            "tree": _nested(root, floor),
        }

    @staticmethod
    def _frame_id(profile: Profile, i: int, frames: list[list[Any]], ids: dict[int, int], is_library: Any) -> int:
        fid = ids.get(i)
        if fid is None:
            f = profile.frames[i]
            fid = ids[i] = len(frames)
            frames.append([f.name, f.file, f.line, 1 if is_library(f.file) else 0])
        return fid


def prune_floor(root: list[Any], max_nodes: int) -> int:
    """The smallest total a node needs to be kept so that at most ``max_nodes`` are (0: keep all)."""
    totals: list[int] = []
    stack = [root]
    while stack:
        node = stack.pop()
        totals.append(node[2])
        stack.extend(node[3].values())
    if len(totals) <= max_nodes:
        return 0
    totals.sort(reverse=True)
    return int(totals[max_nodes - 1]) + 1


def _nested(node: list[Any], floor: int) -> list[Any]:
    """``[frame, self, total, [children, largest first]]``, dropping children under ``floor``."""
    out: list[Any] = [node[0], node[1], node[2], []]
    stack = [(node, out)]
    while stack:
        src, dst = stack.pop()
        for child in sorted(src[3].values(), key=lambda c: -c[2]):
            if child[2] < floor:
                continue
            copy: list[Any] = [child[0], child[1], child[2], []]
            dst[3].append(copy)
            stack.append((child, copy))
    return out


EXPORTERS: tuple[type[Exporter], ...] = (Speedscope, Pprof, FlameGraphHtml, Collapsed, OwnJson)


def exporter_for(path: str | Path, metric: Metric = "cpu", charge_libraries: bool = False) -> Exporter:
    """The exporter whose suffix the path ends with (longest suffix wins)."""
    name = str(path)
    for cls in EXPORTERS:  # ordered so .speedscope.json wins over .json
        if any(name.endswith(suffix) for suffix in (cls.suffix, *cls.suffixes)):
            return cls(metric, charge_libraries)
    known = ", ".join(c.suffix for c in EXPORTERS)
    raise ValueError(f"cannot tell the format of {name!r} from its name: end it with one of {known}")


def exporter_named(name: str, metric: Metric = "cpu", charge_libraries: bool = False) -> Exporter:
    for cls in EXPORTERS:
        if cls.format == name:
            return cls(metric, charge_libraries)
    raise ValueError(f"unknown format {name!r}: give one of {', '.join(FORMATS)}")


FORMATS = tuple(cls.format for cls in EXPORTERS)
