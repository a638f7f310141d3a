"""A local process killed under the monitor (moved from tests/unit/test_monitor_handle.py: it starts one)."""

from dyper.agent import protocol
from dyper.monitor.server import Monitor
from tests.factories import HELLO, make_report


def test_a_local_process_killed_without_a_bye_is_marked_gone_and_a_report_reconnects_it():
    import os
    import socket
    import subprocess
    import sys

    import psutil

    host = socket.gethostname()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        m = Monitor("tcp://127.0.0.1:0")
        started = round(psutil.Process(proc.pid).create_time(), 2)
        live = dict(HELLO, agent=f"{host}:{proc.pid}:a", host=host, pid=proc.pid, start_time=started)
        # the same pid with another start time is another process: the one that said hello is gone
        reused = dict(HELLO, agent=f"{host}:{os.getpid()}:b", host=host, pid=os.getpid(), start_time=1000.0)
        # an agent on another host is not this monitor's to judge
        remote = dict(HELLO, agent="elsewhere:1:c", host="elsewhere", pid=1, start_time=1.0)
        for hello in (live, reused, remote):
            m.handle(hello["agent"].encode(), protocol.encode(protocol.HELLO, hello))
        assert m.check_gone() == [os.getpid()]
        assert m.session_for(proc.pid).connected and m.session_for(1).connected
        proc.kill()  # SIGKILL: no bye
        proc.wait()
        assert m.check_gone() == [proc.pid]
        assert not m.session_for(proc.pid).connected
        assert m.check_gone() == []  # said once
        # a report after all (a pid namespace the monitor cannot see): connected again
        report = dict(make_report([(7, 3, [1, 0])]), agent=live["agent"])
        m.handle(live["agent"].encode(), protocol.encode(protocol.REPORT, report))
        assert m.session_for(proc.pid).connected
    finally:
        proc.kill()
        proc.wait()
