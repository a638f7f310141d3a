"""agent.tag: the tag is a frame under the tagged function, and profiles split by it."""

from __future__ import annotations

import asyncio
import sys

import pytest

from dyper import agent
from dyper.agent.protocol import TAG_FILE
from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile, StackCount
from dyper.monitor.report import report_of


def test_a_tagged_function_runs_under_a_frame_named_for_the_tag():
    @agent.tag("checkout")
    def handler(x: int) -> object:
        """Handles."""
        if x < 0:
            raise KeyError(x)
        return sys._getframe(1).f_code

    code = handler(1)
    assert (code.co_name, code.co_filename) == ("tag:checkout", TAG_FILE)
    assert handler.__name__ == "handler" and handler.__doc__ == "Handles."
    with pytest.raises(KeyError):
        handler(-1)


def test_a_tagged_coroutine_keeps_its_tag_across_awaits():
    @agent.tag("search")
    async def handler() -> list[str]:
        names = [sys._getframe(1).f_code.co_name]
        await asyncio.sleep(0)
        names.append(sys._getframe(1).f_code.co_name)
        return names

    assert asyncio.run(handler()) == ["tag:search", "tag:search"]


def _profile() -> Profile:
    frames = [
        Frame("/app/app.py", "serve", 1, 2),
        Frame(TAG_FILE, "tag:checkout", 10, 11),
        Frame("/app/app.py", "pay", 20, 21),
        Frame(TAG_FILE, "tag:search", 10, 11),
        Frame("/app/app.py", "find", 30, 31),
    ]
    stacks = [
        StackCount(1, (0, 1, 2), 30, 30),
        StackCount(1, (0, 3, 4), 60, 50),
        StackCount(1, (0,), 10, 10),
    ]
    return Profile(frames, stacks, {1: "MainThread"}, {"pid": 1, "samples": 100})


def test_a_profile_counts_its_tags_and_keeps_one_of_them():
    p = _profile()
    assert p.tags("wall") == {"checkout": 30, "search": 60}
    assert p.tags("cpu") == {"checkout": 30, "search": 50}
    only = p.with_tag("search")
    assert only.total("wall") == 60 and only.process["tag"] == "search"
    names = {r["name"] for r in only.functions("cpu") if r["self"]}
    assert names == {"find"}
    report = report_of(only)
    assert report["process"]["tag"] == "search" and report["process"]["tag_samples"] == 60
    assert [r["name"] for r in report["proflets"]["cpu"]["functions"] if r["self_pct"] > 0] == ["find"]
    with pytest.raises(ValueError, match="the tags seen: checkout, search"):
        p.with_tag("nothing")
