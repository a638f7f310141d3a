"""A WSGI app for pre-fork server tests: every request spends ~5 ms in ``planted_handler``."""

import time


def planted_handler() -> int:
    end = time.process_time() + 0.005
    n = 0
    while time.process_time() < end:
        n += 1
    return n


def app(environ, start_response):  # type: ignore[no-untyped-def]
    n = planted_handler()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{n}\n".encode()]
