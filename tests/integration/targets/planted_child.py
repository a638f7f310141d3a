"""Threads waiting for child processes, for the threads and io proflets to agree on.

- ``plain``: ``subprocess.run`` of a sleeping child, no pipes (Popen.communicate, then waitpid);
- ``nopipe``: ``Popen.communicate()`` without pipes: a wait for the child;
- ``captured``: ``subprocess.run(..., capture_output=True)``: reading the child's pipes.

Each child sleeps ``SECONDS`` (default 3).
"""

from __future__ import annotations

import subprocess
import sys
import threading


def main() -> None:
    seconds = sys.argv[1] if len(sys.argv) > 1 else "3"

    def plain() -> None:
        subprocess.run(["sleep", seconds], check=True)

    def nopipe() -> None:
        subprocess.Popen(["sleep", seconds]).communicate()

    def captured() -> None:
        subprocess.run(["sleep", seconds], capture_output=True, check=True)

    threads = [threading.Thread(target=f, name=f.__name__) for f in (plain, nopipe, captured)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
