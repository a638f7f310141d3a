"""DYPER's lights: a proflet's status in the summary, and the cpu light's one definition.

A light is ``problem`` (0-1, the hue: is something wrong here?) and
``confidence`` (0-1, the brightness: how sure, mostly from how much has
been seen). Imported in the target too (through ``proflets.base``), so it
imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    problem: float = 0.0
    confidence: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {"problem": round(self.problem, 3), "confidence": round(self.confidence, 3)}


def confidence_of(samples: float, half: float = 200.0) -> float:
    """How sure a figure from ``samples`` observations is: 0 with none, 0.5 at ``half``, towards 1."""
    return samples / (samples + half) if samples > 0 else 0.0


def cpu_light(cpu_samples: int, passes: int) -> Status:
    """The cpu light: how CPU-bound the process is.

    The problem is the share of sampling passes that found a thread on the
    CPU (or ready for it), at most 1; the confidence grows with the passes.
    The cpu analyzer's status and a report made from a bare profile both say this.
    """
    busy = min(1.0, cpu_samples / passes) if passes > 0 else 0.0
    return Status(busy, confidence_of(passes))
