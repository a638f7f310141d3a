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
import re
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from dyper.monitor.flame import flame_tree
from dyper.monitor.model.frames import Frame, frame_label
from dyper.monitor.model.profile import Metric, Profile


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

    The script is the dashboard's renderer (``web/static/flame.js``), inlined.
    Threads are the first level under the root. Click a frame to zoom into
    it (again, or on an ancestor, to go back out), search by name or file
    (``/regex/`` too) to see the share of matching frames, flip the root to
    the bottom. The profile is embedded as JSON (``#dyper-data``: frames
    ``[name, file, line, kind]`` and the tree ``[frame, self, total,
    [children]]``, as :func:`monitor.flame.flame_tree` builds them). Trees
    above :attr:`max_nodes` nodes lose their smallest frames, which leaves
    gaps of the size they had.
    """

    format = "html"
    suffix = ".html"
    suffixes = (".htm",)
    description = "a self-contained HTML flame graph: click to zoom, search; no network needed"
    max_nodes = 40_000

    def render(self, profile: Profile) -> str:
        data = self.data(profile)
        package = resources.files("dyper.monitor")
        template = package.joinpath("templates/flamegraph.html").read_text(encoding="utf-8")
        # The dashboard's renderer, inlined so that the file stays self-contained.
        script = package.joinpath("web/static/flame.js").read_text(encoding="utf-8")
        if "</script" in script.lower() or "<!--" in script:
            raise ValueError("flame.js would end its <script> element early")
        # In a <script> element only "</" can end it early; escaping < > & keeps the JSON inert.
        payload = (
            json.dumps(data, separators=(",", ":"), ensure_ascii=False)
            .replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
        )
        parts = {"__DYPER_TITLE__": html.escape(data["title"]), "__DYPER_FLAME_JS__": script, "__DYPER_DATA__": payload}
        # One pass, so that nothing substituted (a title, a frame's name) is read as a placeholder.
        return re.sub("|".join(parts), lambda m: parts[m[0]], template)

    def data(self, profile: Profile) -> dict[str, Any]:
        """The embedded JSON: title, subtitle, unit, frames and the nested tree (see :mod:`monitor.flame`)."""
        flame = flame_tree(
            profile,
            self.metric,
            charge_libraries=self.charge_libraries,
            max_nodes=self.max_nodes,
            thread_label=lambda tid, name: f"{name} ({tid})",
        )
        proc = profile.process
        argv = " ".join(proc.get("argv") or []) or "python"
        window = (proc.get("window") or {}).get("description") or (
            f"last {proc['window_s']:g}s" if proc.get("window_s") else "whole run"
        )
        subtitle = f"pid {proc.get('pid', '?')} · {argv} · {self.metric} samples · {window}"
        if self.charge_libraries:
            subtitle += " · library time charged to the calling application line"
        if flame.floor:
            subtitle += f" · frames under {flame.floor} samples left out"
        return {
            "title": f"dyper: {argv[:80]} (pid {proc.get('pid', '?')})",
            "subtitle": subtitle,
            "unit": f"{self.metric} samples",
            "frames": flame.frames,
            "tree": flame.tree,
        }


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
