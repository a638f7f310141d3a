"""The tasks proflet: where the wall time of asyncio tasks goes, and how healthy each event loop is.

A thread's stack in an asyncio service shows the event loop and the one task
that happens to run; the waiting tasks, what they wait on and for how long,
are not on any stack. This proflet samples them.

The collector (in the target) makes its own sampling passes (``poll``),
paced so they cost about ``PASS_SHARE`` of the budget and charged as
sampling. In each pass, for every running event loop:

* the **running task**: its stack is the loop thread's stack from the leaf
  up to the task's coroutine frame (its await chain is on the thread's stack
  while it runs), charged as wall and cpu;
* up to ``SUSPENDED_PER_PASS`` **suspended tasks**, drawn at random from all
  the process's tasks: each one's await chain, followed through ``cr_await``
  (``gi_yieldfrom`` for generator-based coroutines) from the task's coroutine
  down to where it waits, with a last frame naming the task it awaits when
  it awaits one. Each is charged the pass's seconds times the number of
  tasks over the number drawn: an unbiased estimate of the wall time all
  suspended tasks spend at each chain, at a cost that does not grow with the
  number of tasks (the draw is from a C-level copy of asyncio's task set);
* **loop blocking**: the callback the loop runs (the ``Handle`` in
  ``Handle._run``'s frame). The same callback seen by passes spanning
  ``BLOCK_S`` or more is a blocked loop, reported with the callback's most
  frequent stack (the culprit) and the task it belongs to.

Once a second a census counts each loop's tasks and posts a probe callback
(``call_soon_threadsafe``) whose delay until it runs is the loop's lag.

Stacks are sent as frames (file, function, first line, line) rather than the
agent's location ids, so the task view is independent of the stack tables.
In the monitor, :meth:`TasksAnalyzer.profile` turns a window of them into a
:class:`monitor.profile.Profile` whose "threads" are task names (numbered
names such as ``Task-12`` lose their number), with milliseconds as counts:
the task view, which every export and the bottleneck search read as they
read the thread view.

Version notes (tested on 3.11, 3.12, 3.13): 3.11 keeps every task in
``asyncio.tasks._all_tasks``; 3.12 and 3.13 keep scheduled tasks in
``_scheduled_tasks`` and eager ones in ``_eager_tasks``. ``_current_tasks``
(loop -> running task) and ``Task._fut_waiter`` are the C module's own in
all three.
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "tasks"
