"""Exporters: a profile written in formats other tools open.

Each exporter is a small class with the file suffix it owns and one
``render(profile) -> str``; :func:`exporter_for` picks one from an output
path, so ``-o prof.collapsed`` and ``-o prof.speedscope.json`` just work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from monitor.profile import Metric, Profile
from monitor.session import Frame


def frame_label(frame: Frame) -> str:
    """``qualname (file:line)``; ';' is the collapsed format's separator, so it is replaced."""
    return f"{frame.name} ({frame.file}:{frame.line})".replace(";", ":")


class Exporter:
    suffix: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, metric: Metric = "cpu", charge_libraries: bool = False) -> None:
        self.metric = metric
        self.charge_libraries = charge_libraries

    def render(self, profile: Profile) -> str:
        raise NotImplementedError

    def write(self, profile: Profile, path: str | Path) -> None:
        Path(path).write_text(self.render(profile))


class Collapsed(Exporter):
    """Folded stacks (Brendan Gregg's format; flamegraph.pl, speedscope, inferno)."""

    suffix = ".collapsed"
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
    """speedscope's JSON file format, one sampled profile per thread."""

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
            "exporter": "dyper 0.1.0",
        }
        return json.dumps(doc)


class OwnJson(Exporter):
    """dyper's own profile, loadable by ``dyper report`` and friends."""

    suffix = ".json"
    description = "dyper's own profile format (see monitor.profile.Profile.to_json)"

    def render(self, profile: Profile) -> str:
        return json.dumps(profile.to_json())


EXPORTERS: tuple[type[Exporter], ...] = (Speedscope, Collapsed, OwnJson)


def exporter_for(path: str | Path, metric: Metric = "cpu", charge_libraries: bool = False) -> Exporter:
    """The exporter whose suffix the path ends with (longest suffix wins)."""
    name = str(path)
    for cls in EXPORTERS:  # ordered so .speedscope.json wins over .json
        if name.endswith(cls.suffix):
            return cls(metric, charge_libraries)
    known = ", ".join(c.suffix for c in EXPORTERS)
    raise ValueError(f"cannot tell the format of {name!r} from its name: end it with one of {known}")
