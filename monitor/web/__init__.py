"""The DYPER web dashboard (issue 7; DYPER section 6, Figures 3-6).

:class:`~monitor.web.server.Dashboard` serves one page and a small JSON API
from the monitor's own asyncio loop (aiohttp), so it reads sessions directly,
and pushes live updates to the page over server-sent events.
:mod:`monitor.web.data` turns sessions and profiles into what the page shows.
"""
