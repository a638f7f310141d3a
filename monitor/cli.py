"""``dyper``: the command line."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from dyper.monitor.commands import CliError, glue_leading_dash

COMMANDS = (
    "run",
    "attach",
    "detach",
    "monitor",
    "keys",
    "top",
    "ps",
    "budget",
    "pause",
    "resume",
    "reset",
    "triggers",
    "demo",
    "consolidate",
    "bottlenecks",
    "diagnose",
    "export",
    "report",
)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other dyper error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (``only``) one command's: the others are named but not loaded.

    Loading every command's module costs a third of a second (the search's
    numpy, the monitor's server, the injector): ``dyper budget`` needs none of it.
    """
    parser = _Parser(
        prog="dyper",
        description="Low-overhead profiling of running Python services, inside an overhead budget.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = importlib.import_module(f"dyper.monitor.commands.{name}")
        doc = (module.__doc__ or "").strip()
        p = sub.add_parser(
            name, help=doc.splitlines()[0], description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(glue_leading_dash(words))
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args))
    except CliError as exc:
        # The module's NAME: a command may have an argument called "command" (run's program).
        print(f"dyper {getattr(args._module, 'NAME', args.command)}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `dyper top --json | head`: the reader left; say nothing more. Point
        # stdout at /dev/null so the interpreter's final flush cannot fail too.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
