"""The memory collector across a fork, and beside another allocator hook (each in a process of its own)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dyper.proflets.memory import collector as memory

needs_sampler = pytest.mark.skipif(memory._sampler() is None, reason="the C extension did not build here")


def _run(script: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_forked_child_drops_the_hooks_of_a_traced_burst():
    words = _run(
        """
        import gc, os, sys, tracemalloc
        from dyper.agent.proflet import DetailContext
        from dyper.proflets.memory.collector import MemoryCollector

        c = MemoryCollector()
        c._sampler = None  # tracemalloc, as where the C extension does not load
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
    # the child had neither tracing nor the callback; the parent's burst went on, then was cleaned up
    assert words == ["0", "True", "False", "0"]


@needs_sampler
def test_a_forked_child_drops_the_hook_of_a_sampled_burst():
    words = _run(
        """
        import gc, os
        from dyper.agent import _fastsample as fast
        from dyper.agent.proflet import DetailContext
        from dyper.proflets.memory.collector import MemoryCollector

        c = MemoryCollector()
        c.start_detail(DetailContext([], 0.5))
        pid = os.fork()
        if pid == 0:
            ok = fast.alloc_state()[:3] == (0, 0, 0) and c._watch is None
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        still = fast.alloc_state()[2]
        result = c.stop_detail()
        c.close()
        state = fast.alloc_state()[:3]
        print(os.waitstatus_to_exitcode(status), still, state, len(gc.callbacks), "sampled" in result)
        """
    )
    assert words == ["0", "1", "(0,", "0,", "0)", "0", "True"]


@needs_sampler
def test_a_hook_installed_over_the_sampler_is_kept_and_the_sampler_waits_until_it_is_gone():
    # tracemalloc started during a burst wraps the sampler's hook: taking ours out
    # then would take theirs too. Ours stays, passing through, and no burst samples
    # until theirs is gone.
    words = _run(
        """
        import tracemalloc
        from dyper.agent import _fastsample as fast
        from dyper.agent.proflet import DetailContext
        from dyper.proflets.memory.collector import MemoryCollector

        c = MemoryCollector()
        c.start_detail(DetailContext([], 0.5))
        tracemalloc.start()
        first = c.stop_detail()
        kept = [str(i) * 3 for i in range(10_000)]
        traced = tracemalloc.get_traced_memory()[0] > 10_000 * 40  # theirs still works, through ours
        stranded = fast.alloc_state()[:3]
        try:
            fast.alloc_start(1024.0, 10)
        except RuntimeError as exc:
            refused = "another allocator hook" in str(exc)
        tracemalloc.stop()  # theirs out: ours on top again
        c.start_detail(DetailContext([], 0.5))
        second = c.stop_detail()
        c.close()
        out = (fast.alloc_state()[:3] == (0, 0, 0), "sampled" in first, "sampled" in second)
        print(traced, stranded == (1, 1, 0), refused, *out)
        """
    )
    assert words == ["True"] * 6, words
