"""cpu detailing across a fork (moved from tests/unit/test_cpu_detailing.py: it forks a child)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.mark.skipif(sys.version_info >= (3, 12) or not hasattr(os, "fork"), reason="the frame hook is the 3.11 path")
def test_a_child_forked_during_a_frame_hook_burst_runs_without_the_hook() -> None:
    script = textwrap.dedent(
        """
        import os
        from dyper import agent
        from dyper.agent import _fastsample as f
        from dyper.agent.proflet import DetailContext
        from dyper.proflets.cpu.collector import CpuCollector

        def hot(x):
            return x

        agent.start("tcp://127.0.0.1:9", budget=0.0001, proflets=())
        c = CpuCollector()
        c.prepare()
        c.start_detail(DetailContext([hot.__code__], 1.0))
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not f.frame_hook_installed() else 1)
        _, status = os.waitpid(pid, 0)
        still = f.frame_hook_installed()
        c.stop_detail()
        c.close()
        agent.stop()
        print(os.waitstatus_to_exitcode(status), still, f.frame_hook_installed())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    # the child came back to the default evaluator; the parent's burst went on, then ended
    assert out.stdout.split() == ["0", "True", "False"], out.stderr
