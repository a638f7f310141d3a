"""The model: frames, profiles and the tables read from them, as plain data and pure functions.

Everything above it (the sessions that build profiles, the proflets'
analyzers, the report, the exports, the bottleneck search, the views) reads
these types; this package imports nothing else of dyper but the wire
protocol's constants, so any of them may import it (``tests/unit/test_layering.py``
keeps it so). Its modules are imported by name (``dyper.monitor.model.profile``):
the target loads ``libraries`` and ``lights`` with the proflets' collectors, and
should load no more than that.

- :mod:`.frames`: :class:`~.frames.Frame` (a line in a function), stack keys, frame labels.
- :mod:`.libraries`: which files are the standard library's or an installed package's.
- :mod:`.lights`: DYPER's lights (:class:`~.lights.Status`) and the cpu light's one definition.
- :mod:`.profile`: :class:`~.profile.Profile`, a snapshot of stack counts, its JSON form, tags, call
  tree, and the per-function and per-line tables (the cpu rows' columns are named there, once).
"""
