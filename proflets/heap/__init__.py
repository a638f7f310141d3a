"""The heap proflet: a census of live objects by type, and the types that leak (DYPER section 5.4).

No basic analysis: the samples say nothing about the heap. Detailing is a
census: every object the garbage collector tracks (``gc.get_objects()``:
every instance of a Python class and every container; not ints, floats,
strings or bytes, which it does not track), counted by type, with the
bytes they take (``sys.getsizeof``, the object itself, not what it refers
to). The monitor keeps the censuses and flags the types whose count keeps
growing as leak suspects, with their growth per minute.

A census stops the world: ``gc.get_objects()`` lists the objects with the
GIL held throughout, and the counting that follows holds it too, in chunks
(threads get it back between chunks, but the application is stalled for
the whole census's CPU time, which is what is charged). Its cost grows
with the heap, so, as DYPER's heap proflet does, the collector tracks the
worst census seen: OVHD is declared as the census expected at start plus
a margin, each burst reports the worst census and that plus the margin
(the agent then calibrates OVHD from what it measures, as for every
proflet), and a maximum pause (``DYPER_HEAP_MAX_PAUSE_MS``, default
200 ms) keeps a huge heap from being scanned at all: a census expected to
take longer, from the worst rates of the recent censuses, is skipped, and
the report says why.

How a census is kept cheap (1,000,000 objects in 120 to 170 ms on a 2-core
VM, ``bench/heap_census.py``): counting is C loops only
(``Counter(map(type, chunk))``, about 100 ns an object; a Python loop over
every object with ``sys.getsizeof`` took four to five times as long);
bytes come from a systematic sample of at most ``SIZE_SAMPLE`` objects
(every k-th of the list), a type's bytes being its exact count times its
mean sampled size. Below ``SIZE_SAMPLE`` objects, or for a type whose
instances all have one size (most classes), the bytes are exact; a rare
large object in the sample (one huge list) weighs k times its size.
Objects ``gc.freeze()`` moved out of the collector's lists are not seen.

No application code runs in a census: types are read through ``type``'s
own descriptors (a metaclass cannot intercept them), and a type whose
``__sizeof__`` is written in Python is sized with ``object.__sizeof__``
(its basic size) instead of calling it. The one exception is a metaclass
with its own ``__hash__`` (types are counted in a dict), which no standard
library metaclass has; a census that fails is skipped, with the reason.

The list of every object keeps them all alive while the census runs, so
an object the application drops meanwhile is freed when the list is, on
dyper's thread: its ``__del__`` would run there, as it may on any thread
whose allocation starts a garbage collection. The list goes first.
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "heap"
