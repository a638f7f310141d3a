"""Threads with planted I/O behaviour, for the io proflet.

- ``feeder``: every ``1/--rate`` seconds sends a chunk of CHUNK bytes down two
  socket pairs and writes one into a pipe (one for each reader), sleeping in between;
- ``reader``: ``slow_reader`` waits on its socket in ``recv_into``, one chunk a call,
  so its time is I/O in a C routine, charged to ``slow_reader``;
- ``buffered``: ``buffered_reader`` reads the other socket through a file object
  (``makefile``), so its time is I/O in the Python routine ``socket.SocketIO.readinto``,
  called by the buffer, charged to ``buffered_reader``;
- ``piper``: ``pipe_reader`` reads the pipe with ``os.read``: I/O the kernel's
  per-thread counters see (they count read(2) and write(2), not a socket's recv and
  send), CHUNK bytes a chunk;
- ``asker``: ``ask`` sends a question to ``answerer`` and waits ``--answer-delay``
  for the answer, ``poll_answers`` calling it: an application routine that only an
  application's own routine file (DYPER_IO_ROUTINES) makes I/O;
- ``spinner``: CPU-bound pure Python, no I/O.

Runs for ``--seconds`` (default: until killed). With ``--truth FILE`` it
writes, every half second, the chunks ``reader``, ``buffered`` and ``piper`` have
read and the seconds so far:
the ground truth of the call rates.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time

CHUNK = 1024
stop = threading.Event()
counts = {"reader": 0, "buffered": 0, "piper": 0}


def feeder(outs: list[socket.socket], pipe: int, rate: float) -> None:
    chunk = b"x" * CHUNK
    start = time.monotonic()
    sent = 0
    while not stop.is_set():
        for out in outs:
            out.sendall(chunk)
        os.write(pipe, chunk)
        sent += 1
        # Deadlines from the start, so the rate holds however late a wake-up is.
        delay = start + sent / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def slow_reader(conn: socket.socket) -> None:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while not stop.is_set():
        got = 0
        while got < CHUNK:
            got += conn.recv_into(view[got:])
        counts["reader"] += 1


def buffered_reader(conn: socket.socket) -> None:
    with conn.makefile("rb") as f:
        while not stop.is_set():
            f.read(CHUNK)
            counts["buffered"] += 1


def pipe_reader(pipe: int) -> None:
    while not stop.is_set():
        got = 0
        while got < CHUNK:
            got += len(os.read(pipe, CHUNK - got))
        counts["piper"] += 1


def answerer(conn: socket.socket, delay: float) -> None:
    while not stop.is_set():
        conn.recv(16)
        time.sleep(delay)
        conn.sendall(b"answer")


def ask(conn: socket.socket) -> bytes:
    conn.sendall(b"question")
    return conn.recv(16)


def poll_answers(conn: socket.socket) -> None:
    while not stop.is_set():
        ask(conn)


def spinner() -> None:
    n = 0
    while not stop.is_set():
        for i in range(1000):
            n += i * i


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--answer-delay", type=float, default=0.02)
    parser.add_argument("--truth")
    args = parser.parse_args()
    a_out, a_in = socket.socketpair()
    b_out, b_in = socket.socketpair()
    q_out, q_in = socket.socketpair()
    p_in, p_out = os.pipe()
    threads = [
        threading.Thread(target=feeder, args=([a_out, b_out], p_out, args.rate), name="feeder", daemon=True),
        threading.Thread(target=slow_reader, args=(a_in,), name="reader", daemon=True),
        threading.Thread(target=buffered_reader, args=(b_in,), name="buffered", daemon=True),
        threading.Thread(target=pipe_reader, args=(p_in,), name="piper", daemon=True),
        threading.Thread(target=answerer, args=(q_in, args.answer_delay), name="answerer", daemon=True),
        threading.Thread(target=poll_answers, args=(q_out,), name="asker", daemon=True),
        threading.Thread(target=spinner, name="spinner", daemon=True),
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    start = time.monotonic()
    end = None if args.seconds is None else start + args.seconds
    try:
        while not stop.wait(0.5):
            now = time.monotonic()
            if args.truth is not None:
                # Replaced whole, so a reader never sees it half written.
                with open(args.truth + ".tmp", "w") as f:
                    f.write(f"{counts['reader']} {counts['buffered']} {counts['piper']} {now - start}\n")
                os.replace(args.truth + ".tmp", args.truth)
            if end is not None and now >= end:
                break
    except KeyboardInterrupt:
        pass
    stop.set()


if __name__ == "__main__":
    main()
