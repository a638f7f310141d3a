import selectors
import sys
import threading
import time

import pytest

from dyper.agent.protocol import LOC_BLOCKING, LOC_IO, LOC_LOCK, LOC_SLEEP, LOC_WAIT
from dyper.agent.tables import MAX_LOCATIONS, RUNS, UNDECIDED, WAITS, Tables, callee_name


def _leaf_of(thread: threading.Thread):
    for _ in range(200):
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code.co_name == thread.name:
            return frame
        time.sleep(0.01)
    raise AssertionError("thread never reached its leaf")


def test_callee_name_finds_blocking_calls_and_not_cpu_work():
    stop = threading.Event()
    lock = threading.Lock()
    lock.acquire()
    sel = selectors.DefaultSelector()
    rd, wr = __import__("os").pipe()
    sel.register(rd, selectors.EVENT_READ)

    def sleeper():
        time.sleep(30)

    def locker():
        lock.acquire(timeout=30)

    def selector():
        sel.select(30)

    def spinner():
        while not stop.is_set():
            sum(range(1000))

    threads = [threading.Thread(target=f, name=f.__name__, daemon=True) for f in (sleeper, locker, selector, spinner)]
    for t in threads:
        t.start()
    try:
        names = {t.name: callee_name(_leaf_of(t).f_code, _leaf_of(t).f_lasti) for t in threads[:2]}
        assert names == {"sleeper": "sleep", "locker": "acquire"}
        # the selector's leaf is selectors' own select(), which calls poll/select
        frame = sys._current_frames()[threads[2].ident]
        assert callee_name(frame.f_code, frame.f_lasti) in ("poll", "select")
        frame = sys._current_frames()[threads[3].ident]
        assert callee_name(frame.f_code, frame.f_lasti) not in ("sleep", "acquire", "poll", "select")
    finally:
        stop.set()
        lock.release()
        __import__("os").write(wr, b"x")
        for t in threads:
            t.join(5)
        sel.close()


def test_new_loc_flags_and_resend():
    t = Tables()

    def f():
        time.sleep(0)

    code = f.__code__
    sleep_call = next(i.offset for i in __import__("dis").get_instructions(code) if i.opname.startswith("CALL"))
    a = t.new_loc((sleep_call << 48) | id(code), code, sleep_call, 10)
    b = t.new_loc((0 << 48) | id(code), code, 0, None)
    c = t.new_loc((sleep_call << 48) | 12345, code, sleep_call, 10)
    t.flag_leaves({a, b})  # c was only ever an inner frame: undecided
    rows = {row[0]: row for row in t.loc_rows}
    assert rows[c][5] == 0
    assert rows[a][5] == LOC_BLOCKING | LOC_SLEEP and rows[b][5] == 0
    assert t.waiting[a] == WAITS and t.waiting[b] == RUNS and t.waiting[c] == UNDECIDED
    assert t.waits(a) and not t.waits(b) and not t.waits(c)
    assert t.undecided([a, c]) and not t.undecided([a, b]) and t.undecided([c + 1])
    assert rows[b][4] == code.co_firstlineno  # unknown line falls back to the def line
    strings, locs = t.unsent()
    assert len(locs) == 3 and [s[1] for s in strings] == [code.co_filename, code.co_qualname]
    t.mark_sent()
    assert t.unsent() == ([], [])
    # c turns up as a leaf after its row went out: decided now, and sent again with its flags.
    t.flag_leaves({c})
    assert t.waits(c)
    strings, locs = t.unsent()
    assert strings == [] and locs == [[c, *rows[c][1:5], LOC_BLOCKING | LOC_SLEEP]]
    t.flag_leaves({a, c})  # decided once: nothing more to send
    t.mark_sent()
    assert t.unsent() == ([], [])
    t.resend_all()
    assert len(t.unsent()[1]) == 3


def test_tables_restart_under_a_new_epoch():
    t = Tables()
    t.new_loc(1, test_tables_restart_under_a_new_epoch.__code__, 0, 1)
    t.restart()
    assert t.epoch == 1 and t.locs == {} and t.unsent() == ([], [])
    assert MAX_LOCATIONS >= 100_000


@pytest.mark.parametrize("lasti", [-2, 10**6])
def test_callee_name_is_safe_on_odd_offsets(lasti):
    assert callee_name(test_callee_name_is_safe_on_odd_offsets.__code__, lasti) is None


def test_wait_kinds_of_parked_threads():
    """What each blocked thread's leaf waits for, as the threads proflet splits it."""
    import queue
    import socket
    import sys as _sys

    from dyper.agent.tables import wait_kind

    lock, rlock = threading.Lock(), threading.RLock()
    cond = threading.Condition(threading.RLock())
    q: queue.Queue[int] = queue.Queue()
    event = threading.Event()
    a, b = socket.socketpair()
    stop = threading.Event()

    def with_lock():
        with lock:
            pass

    def acquire():
        lock.acquire()
        lock.release()

    def with_rlock():
        with rlock:
            pass

    def with_condition():
        with cond:
            pass

    def spin():
        while not stop.is_set():
            pass

    def join():
        t = threading.Thread(target=event.wait)
        t.start()
        t.join()

    expected = {
        "with_lock": LOC_LOCK, "acquire": LOC_LOCK, "with_rlock": LOC_LOCK, "with_condition": LOC_LOCK,
        "queue_get": LOC_WAIT, "event_wait": LOC_WAIT, "join": LOC_WAIT,
        "sleep": LOC_SLEEP, "recv": LOC_IO, "spin": 0,
    }  # fmt: skip
    targets = {
        "with_lock": with_lock, "acquire": acquire, "with_rlock": with_rlock, "with_condition": with_condition,
        "queue_get": q.get, "event_wait": event.wait, "join": join,
        "sleep": lambda: time.sleep(3), "recv": lambda: a.recv(1), "spin": spin,
    }  # fmt: skip
    lock.acquire()
    rlock.acquire()
    cond.acquire()
    threads = {name: threading.Thread(target=fn, name=name) for name, fn in targets.items()}
    try:
        for t in threads.values():
            t.start()
        time.sleep(0.3)
        frames = _sys._current_frames()
        got = {}
        for name, t in threads.items():
            frame = frames[t.ident]
            got[name] = wait_kind(frame.f_code, frame.f_lasti)
        assert got == expected
    finally:
        stop.set()
        lock.release()
        rlock.release()
        cond.release()
        q.put(1)
        event.set()
        b.send(b"x")
        for t in threads.values():
            t.join(5)
        a.close()
        b.close()


def test_the_decoded_instructions_stay_out_of_the_heap_census():
    # Issue 30: the decoded-instruction cache kept dis.Instruction and
    # dis.Positions objects, which the heap census (gc.get_objects) counted as
    # the application's growing types. Planted: decode many code objects as
    # the agent does when it interns locations, then take a census as the
    # heap proflet does.
    import dis
    import gc

    from dyper.agent import tables
    from dyper.proflets.heap.collector import census

    def make(i: int):
        namespace: dict[str, object] = {}
        exec(f"def f{i}(x):\n    time.sleep(x)\n    return x.attr{i}.method()\n", {"time": time}, namespace)
        return namespace[f"f{i}"]

    functions = [make(i) for i in range(100)]
    try:
        for f in functions:
            code = f.__code__
            for offset in [ins.offset for ins in dis.get_instructions(code)]:
                callee_name(code, offset)
        assert len(tables._decoded) >= 100
        gc.collect()
        by_type, _ = census(gc.get_objects())
        assert "dis.Instruction" not in by_type and "dis.Positions" not in by_type, {
            k: v for k, v in by_type.items() if k.startswith("dis.")
        }
        # and what is kept is untracked: nothing of it in any census
        assert not any(gc.is_tracked(step) for _, _, steps in tables._decoded.values() for step in steps)
    finally:
        tables.forget_decoded()


#: Calls whose arguments call something, keyword arguments, attribute chains:
#: the callee is the outer call's, never one made while building its arguments.
_NESTED_CALLS = {
    "time.sleep(float(x))": "sleep",
    "sleep(float(x))": "sleep",
    "sleep(conv(x))": "sleep",  # a local callable: PUSH_NULL around it
    "sock.recv(int(n) * 1024)": "recv",
    "lock.acquire(timeout=float(n))": "acquire",
    "lock.acquire(True, timeout=float(n))": "acquire",
    "self.sock.recv(int(n))": "recv",
    "self.sock.recv(self.size(int(n)), socket.MSG_PEEK)": "recv",
    "q.get(block=True, timeout=max(0.1, float(n)))": "get",
    "sel.select(timeout=conv(x))": "select",
    "time.sleep(*args, **kw)": "sleep",
    "conv(x).wait(float(n))": "wait",
    "(self.sock.recv)(int(n))": "recv",
    "int(n)": "int",
}


@pytest.mark.parametrize("source", list(_NESTED_CALLS))
def test_callee_name_is_the_outer_call_with_calls_in_its_arguments(source):
    import dis

    namespace: dict[str, object] = {}
    exec(f"def f(time, sleep, sock, lock, self, q, sel, conv, socket, x, n, args, kw):\n    {source}\n", namespace)
    code = namespace["f"].__code__  # type: ignore[attr-defined]
    steps = list(dis.get_instructions(code))
    # the statement's outer call is its last call, just before POP_TOP
    call = max(i for i, ins in enumerate(steps) if ins.opname in ("CALL", "CALL_FUNCTION_EX", "CALL_KW"))
    assert callee_name(code, steps[call].offset) == _NESTED_CALLS[source]
    if steps[call - 1].opname == "PRECALL":  # 3.11: a specialised PRECALL can be where the thread waits
        assert callee_name(code, steps[call - 1].offset) == _NESTED_CALLS[source]


def test_wait_kinds_of_threads_blocked_in_calls_with_calls_in_their_arguments():
    """The leaf's own offset, as sys._current_frames() reports it: sleeping,
    reading and lock-waiting threads whose argument called float() or int()."""
    import socket

    from dyper.agent.tables import wait_kind

    lock = threading.Lock()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    x, n = "1", "3"

    class Reader:
        def __init__(self) -> None:
            self.sock = c

        def read(self) -> None:
            self.sock.recv(int(n) * 1024)

    def sleep_float():
        time.sleep(float(x))

    def recv_int():
        a.recv(int(n) * 1024)

    def acquire_kw():
        lock.acquire(timeout=float(x))

    expected = {"sleep_float": LOC_SLEEP, "recv_int": LOC_IO, "acquire_kw": LOC_LOCK, "read": LOC_IO}
    targets = {"sleep_float": sleep_float, "recv_int": recv_int, "acquire_kw": acquire_kw, "read": Reader().read}
    lock.acquire()
    threads = {name: threading.Thread(target=fn, name=name, daemon=True) for name, fn in targets.items()}
    try:
        for t in threads.values():
            t.start()
        for t in threads.values():
            _leaf_of(t)
        time.sleep(0.2)  # the leaf now sits in the blocking call, not in float()/int()
        frames = sys._current_frames()
        got = {name: wait_kind(frames[t.ident].f_code, frames[t.ident].f_lasti) for name, t in threads.items()}
        assert got == expected
    finally:
        lock.release()
        b.send(b"x")
        d.send(b"x")
        for t in threads.values():
            t.join(5)
        for s in (a, b, c, d):
            s.close()


def test_popen_s_read_of_its_child_s_exec_pipe_is_a_wait_for_the_child_not_io():
    # Found in CI: a loaded machine's slow fork and exec put samples of a
    # `subprocess.run` thread in Popen._execute_child's os.read of the pipe the
    # child closes at exec, and the io proflet listed that thread under "read".
    import dis
    import subprocess

    from dyper.agent.tables import wait_kind

    def reads(code):
        return [
            i.offset
            for i in dis.get_instructions(code)
            if i.opname.startswith("CALL") and callee_name(code, i.offset) == "read"
        ]

    start = subprocess.Popen._execute_child.__code__  # type: ignore[attr-defined]
    assert reads(start), "Popen._execute_child reads its exec pipe"
    assert {wait_kind(start, at) for at in reads(start)} == {LOC_WAIT}

    def read_a_file(f):
        return f.read()

    assert {wait_kind(read_a_file.__code__, at) for at in reads(read_a_file.__code__)} == {LOC_IO}
