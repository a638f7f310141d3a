"""Runs until killed: a little CPU, mostly sleep. Writes its pid to the file given, if any, once started."""

import sys
import time


def spin():
    total = 0
    for i in range(20000):
        total += i * i
    return total


if __name__ == "__main__":
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(f"{__import__('os').getpid()}\n")
    while True:
        spin()
        time.sleep(0.01)
