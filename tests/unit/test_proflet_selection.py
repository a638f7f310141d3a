"""One way to choose proflets: --proflets and $DYPER_PROFLETS, parsed by one function for every entry point."""

from __future__ import annotations

import argparse
import sys

import pytest

from dyper import proflets
from dyper.agent.core import DEFAULT_PROFLETS, _load_collectors
from dyper.monitor.cli import build_parser
from dyper.monitor.commands import CliError, chosen_proflets, glue_leading_dash, proflets_arg
from dyper.proflets import parse_selection, select

DEFAULT = ("cpu", "tasks")
EVERY = ("cpu", "threads", "timing", "heap", "io", "memory", "memory_stacks", "tasks")


def registered() -> tuple[str, ...]:
    return EVERY


@pytest.mark.parametrize(
    ("text", "chosen"),
    [
        ("", ()),  # sampling only
        ("cpu", ("cpu",)),
        ("cpu,threads", ("cpu", "threads")),
        (" cpu , timing ", ("cpu", "timing")),
        ("all", EVERY),
        ("all,-heap", tuple(p for p in EVERY if p != "heap")),
        ("-heap,all", tuple(p for p in EVERY if p != "heap")),  # order does not matter
        ("-heap", DEFAULT),  # the defaults less heap (not among them today)
        ("-tasks", ("cpu",)),
        ("+threads", (*DEFAULT, "threads")),
        ("-tasks,+io", ("cpu", "io")),
        ("cpu,-cpu", ()),  # leaving out wins
        ("cpu,+io", ("cpu", "io")),  # a plain name: the list is exact, +NAME adds to it
        ("all,slowsql", (*EVERY, "slowsql")),  # a plug-in's name, checked by the CLI, not here
    ],
)
def test_select(text: str, chosen: tuple[str, ...]) -> None:
    assert select(parse_selection(text), DEFAULT, registered) == chosen


def test_the_registry_is_read_only_for_all() -> None:
    def never() -> tuple[str, ...]:
        raise AssertionError("read the registry without all")

    assert select(parse_selection("-heap,+io"), DEFAULT, never) == ("cpu", "tasks", "io")


@pytest.mark.parametrize("text", ["--heap", "cpu;heap", "+all", "-all", "he ap", "cpu,,x y", "1cpu"])
def test_bad_syntax_is_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="is not a proflet name") as err:
        parse_selection(text)
    assert "\n" not in str(err.value)


def test_the_cli_checks_syntax_and_warns_of_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert proflets_arg("all,-heap") == ("all", "-heap")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a proflet name"):
        proflets_arg("cpu;heap")
    ns = argparse.Namespace(proflets=("cpu", "-hepa"))
    assert chosen_proflets(ns) == ("cpu", "-hepa")  # the target may have a plug-in we lack: its agent says
    assert chosen_proflets(ns) == ("cpu", "-hepa")
    err = capsys.readouterr().err
    assert err.count("no proflet called hepa is installed here (there are cpu, ") == 1, err


def test_the_environment_form(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = argparse.Namespace(proflets=None)
    monkeypatch.delenv(proflets.ENV, raising=False)
    assert chosen_proflets(ns) is None  # the agent's default set
    monkeypatch.setenv(proflets.ENV, "all, -io")
    assert chosen_proflets(ns) == ("all", "-io")
    assert chosen_proflets(argparse.Namespace(proflets=("cpu",))) == ("cpu",)  # the option wins
    monkeypatch.setenv(proflets.ENV, "cpu,--io")
    with pytest.raises(CliError, match=r"\$DYPER_PROFLETS: proflets 'cpu,--io': '--io' is not") as err:
        chosen_proflets(ns)
    assert err.value.code == 2


@pytest.mark.parametrize("command", ["run", "attach", "monitor"])
def test_every_entry_point_takes_and_documents_it(command: str) -> None:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    text = " ".join(sub.format_help().split())
    assert "--proflets LIST" in text
    assert " ".join(proflets.SELECTION_HELP.split()) in text
    assert "$DYPER_PROFLETS" in text
    # The default set the help names is the agent's (another step changes it: the help goes with it).
    assert "the default set: every built-in proflet, " + ", ".join(DEFAULT_PROFLETS) in text
    args = ["1"] if command == "attach" else []
    assert parser.parse_args(glue_leading_dash([command, *args, "--proflets", "-heap"])).proflets == ("-heap",)


def test_a_leading_dash_is_a_value_before_the_program_only() -> None:
    words = ["run", "--proflets", "-heap", "--budget", "1%", "--", "app", "--proflets", "-x"]
    assert glue_leading_dash(words) == ["run", "--proflets=-heap", "--budget", "1%", "--", "app", "--proflets", "-x"]
    assert glue_leading_dash(["run", "--proflets", "--", "x"]) == ["run", "--proflets", "--", "x"]


def test_all_names_every_proflet_so_memory_stacks_obeys_it() -> None:
    off: dict[str, str] = {}
    collectors = _load_collectors(("all", "-heap"), off)
    try:
        assert "heap" not in collectors and "heap" not in off
        assert set(collectors) | set(off) >= {"cpu", "threads", "timing", "io", "memory", "memory_stacks", "tasks"}
        assert all(c.explicit for c in collectors.values())
        stacks = collectors.get("memory_stacks")
        if stacks is not None:
            assert stacks.unavailable() is None or sys.version_info >= (3, 12), stacks.unavailable()
    finally:
        for c in collectors.values():
            c.close()


def test_the_default_set_is_every_builtin_proflet() -> None:
    off: dict[str, str] = {}
    collectors = _load_collectors(DEFAULT_PROFLETS, off)
    try:
        assert set(collectors) | set(off) == set(proflets.BUILTINS) == set(EVERY)
    finally:
        for c in collectors.values():
            c.close()
