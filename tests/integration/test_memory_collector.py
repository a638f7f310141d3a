"""The memory collector across a fork (moved from tests/unit/test_memory_collector.py: it forks a child)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_forked_child_drops_the_hooks(tmp_path):
    script = textwrap.dedent(
        """
        import gc, os, sys, tracemalloc
        from dyper.agent.proflet import DetailContext
        from dyper.proflets.memory.collector import MemoryCollector

        c = MemoryCollector()
        c.start_detail(DetailContext([], 0.5))
        pid = os.fork()
        if pid == 0:
            ok = not tracemalloc.is_tracing() and c._watch is None
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        still = tracemalloc.is_tracing()
        c.stop_detail()
        c.close()
        print(os.waitstatus_to_exitcode(status), still, tracemalloc.is_tracing(), len(gc.callbacks))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    # the child had neither tracing nor the callback; the parent's burst went on, then was cleaned up
    assert out.stdout.split() == ["0", "True", "False", "0"], out.stderr
