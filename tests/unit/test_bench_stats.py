"""The statistics bench/overhead_windows.py states its figures with."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is a folder of scripts, not installed

from bench.overhead_windows import loss_per_ledger, median_interval


@pytest.mark.parametrize(
    ("n", "k", "coverage"),
    [
        (5, 1, 1 - 2 / 32),  # too few for 90%: the whole range
        (8, 2, 1 - 2 * 9 / 256),  # P(Bin(8, 1/2) <= 1) = 9/256
        (12, 3, 1 - 2 * 79 / 4096),  # P(Bin(12, 1/2) <= 2) = 79/4096; k = 4 would leave 299/4096 > 5% a side
        (16, 5, 1 - 2 * 2517 / 65536),
    ],
)
def test_median_interval_takes_the_binomial_order_statistics(n: int, k: int, coverage: float) -> None:
    xs = [float(i) for i in range(1, n + 1)]
    random.Random(n).shuffle(xs)  # the order of the windows does not matter
    low, high, cov = median_interval(xs)
    assert (low, high) == (k, n + 1 - k)
    assert cov == pytest.approx(coverage)
    assert cov >= 0.9 or n < 6


def test_median_interval_covers_the_median_as_often_as_it_says() -> None:
    rng = random.Random(1)
    hits = 0
    trials = 2000
    for _ in range(trials):
        low, high, _ = median_interval([rng.gauss(3.0, 5.0) for _ in range(12)])
        hits += low <= 3.0 <= high
    # stated coverage 0.961; a binomial spread of 2000 trials is about +-0.004
    assert 0.94 <= hits / trials <= 0.98


def test_loss_per_ledger_recovers_the_factor_a_ledger_misses() -> None:
    rng = random.Random(2)
    cells = []
    for budget in (0.01, 0.05, 0.1, 0.25):
        ledger = [budget * rng.uniform(0.8, 1.0) for _ in range(10)]
        # the application lost 1.5 times what the agent charged, plus the machine's noise
        cells.append({"reported_measureds": ledger, "overheads": [1.5 * x + rng.gauss(0, 0.01) for x in ledger]})
    slope, low, high = loss_per_ledger(cells)
    assert slope == pytest.approx(1.5, abs=0.05)
    assert low <= slope <= high and high - low < 0.2
    assert low > 1.3  # a ledger that saw every cost (slope 1) is told apart
