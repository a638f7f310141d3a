"""Run a Python script as __main__ and report what the process spent on it.

    python bench/workloads/_timed.py SCRIPT [ARGS...]

The script's stdout is captured; at the end one line goes to stdout:

    @@dyper-bench {"wall_s": ..., "cpu_s": ..., "user_s": ..., "sys_s": ..., ...}

with the wall time of the script, the CPU time the process spent while the
script ran (all its threads, the agent's included), the CPU time of the whole
process and of its start-up before the script (where an agent started by
sitecustomize spends its own start-up), the peak RSS, the gc's collections and
the last lines the script printed. The
overhead benchmark (bench/overhead.py) starts every script workload through
this wrapper, with and without the agent, so both sides carry the same frames.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import resource
import runpy
import sys
import time

MARKER = "@@dyper-bench "


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)
    out = io.StringIO()
    code = 0
    u0 = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where os.times() counts clock ticks
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime - u0.ru_utime - u0.ru_stime,
        "user_s": usage.ru_utime - u0.ru_utime,
        "sys_s": usage.ru_stime - u0.ru_stime,
        "cpu_total_s": usage.ru_utime + usage.ru_stime,
        "startup_cpu_s": u0.ru_utime + u0.ru_stime,
        "maxrss_kb": usage.ru_maxrss,
        "gc_collections": [s["collections"] for s in gc.get_stats()],
        "exit_code": code,
        "stdout": out.getvalue()[-4000:],
    }
    sys.stdout.write(MARKER + json.dumps(report) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
