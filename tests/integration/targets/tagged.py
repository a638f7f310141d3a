"""Two request types under their own tags (agent.tag), taking turns: checkout a third of the time, search the rest."""

import sys
import time

from dyper import agent


def pay(n: int) -> int:
    return sum(i * i for i in range(n))


def find(n: int) -> int:
    return sum(i % 7 for i in range(n))


@agent.tag("checkout")
def checkout() -> int:
    return pay(20_000)


@agent.tag("search")
def search() -> int:
    return find(20_000) + find(20_000)


end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    checkout()
    search()
