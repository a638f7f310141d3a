"""Make a CURVE key pair for a monitor off loopback or for the agents that stream to it.

    dyper keys --name monitor              # on the monitor's host
    dyper keys --name agent-web1           # one per agent host or service
    dyper keys --name agent-web1 --dir /etc/dyper/keys --force

Writes NAME.key (the public certificate: hand it out) and NAME.key_secret
(the secret one, mode 0600: it never leaves its host) into --dir (default
$XDG_CONFIG_HOME/dyper/keys, that is ~/.config/dyper/keys). The monitor
takes its own secret certificate and a directory of the agents' public ones:

    dyper monitor --listen tcp://0.0.0.0:7341 --curve-secret monitor.key_secret --authorized DIR

An agent takes the monitor's public certificate and its own secret one:
--monitor-key monitor.key --key agent-web1.key_secret (dyper run, dyper
attach), or $DYPER_MONITOR_KEY and $DYPER_KEY, or agent.start(monitor_key=...,
key=...).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from dyper.monitor.commands import CliError

NAME = "keys"

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def default_dir() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(config) / "dyper" / "keys"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", metavar="DIR", type=Path, help=f"where to write the pair (default {default_dir()}, made 0700)"
    )
    parser.add_argument(
        "--name", default="monitor", help="the pair's name, e.g. monitor or agent-web1 (default monitor)"
    )
    parser.add_argument("--force", action="store_true", help="replace a pair of that name")


def make_pair(directory: Path, name: str, force: bool = False) -> tuple[Path, Path]:
    """Write ``NAME.key`` (0644) and ``NAME.key_secret`` (0600) into ``directory``; return their paths."""
    import zmq.auth

    if not _NAME_RE.fullmatch(name):
        raise CliError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (e.g. agent-web1)", code=2)
    public = directory / f"{name}.key"
    secret = directory / f"{name}.key_secret"
    existing = [p for p in (public, secret) if p.exists() or p.is_symlink()]
    if existing and not force:
        raise CliError(
            f"{existing[0]} already exists: give another --name, or --force to replace the pair "
            "(whoever uses the old one is refused from then on)"
        )
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in existing:
            # Replaced, not rewritten: an old file would keep its mode while the new secret goes in.
            path.unlink()
        # No moment at which the secret is readable by others: created under this umask.
        old_umask = os.umask(0o077)
        try:
            made_public, made_secret = zmq.auth.create_certificates(directory, name)
        finally:
            os.umask(old_umask)
        os.chmod(made_secret, 0o600)
        os.chmod(made_public, 0o644)
    except OSError as exc:
        raise CliError(f"cannot write the keys in {directory}: {exc.strerror or exc}") from None
    return Path(made_public), Path(made_secret)


def run(args: argparse.Namespace) -> int:
    directory = (args.dir or default_dir()).expanduser().absolute()
    public, secret = make_pair(directory, args.name, args.force)
    print(f"CURVE key pair {args.name!r} in {directory}:")
    print(f"  public  {public}  (give it out)")
    print(f"  secret  {secret}  (mode 0600; it stays on this host)")
    print(
        f"as a monitor's: dyper monitor --listen tcp://HOST:7341 --curve-secret {secret} --authorized DIR; "
        f"its agents take --monitor-key {public.name}"
    )
    print(
        f"as an agent's: copy {public.name} into the monitor's --authorized DIR; the agent takes "
        f"--key {secret} --monitor-key MONITOR.key (or $DYPER_KEY and $DYPER_MONITOR_KEY)"
    )
    return 0
