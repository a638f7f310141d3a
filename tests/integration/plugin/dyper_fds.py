"""An application-specific proflet in one small module: open file descriptors.

The README's example, tested as a plug-in: registered under the
``dyper.proflets`` entry-point group by its own distribution's metadata.
"""

from dyper.agent.proflet import Collector
from dyper.proflets.base import Analyzer, Status, confidence_of


class FdsCollector(Collector):
    name = "fds"

    def report(self, ctx):
        import os

        return {"open": len(os.listdir("/proc/self/fd"))}


class FdsAnalyzer(Analyzer):
    name = "fds"

    def __init__(self, session=None):
        super().__init__(session)
        self.seen = []

    def merge(self, report):
        if report.data:
            self.seen.append(report.data["open"])

    def results(self, start=None, end=None):
        if not self.seen:
            return {}
        return {"now": self.seen[-1], "max": max(self.seen), "first": self.seen[0]}

    def status(self):
        # A problem when descriptors keep piling up: how much the count grew.
        grew = (self.seen[-1] - self.seen[0]) / max(1, self.seen[0]) if self.seen else 0.0
        return Status(min(1.0, max(0.0, grew)), confidence_of(len(self.seen), half=10))

    def findings(self):
        if len(self.seen) >= 5 and self.seen[-1] > 2 * self.seen[0]:
            return [f"open file descriptors grew from {self.seen[0]} to {self.seen[-1]}: a leak?"]
        return []


COLLECTOR = FdsCollector
ANALYZER = FdsAnalyzer
