"""The programs tests run as tasks, and the gate that releases them: no task polls with sleeps.

A task that must wait for its test waits on a `Gate`: it connects to a Unix socket the test listens
on and blocks reading until the test opens the gate, so it goes on the moment the test says so.
An open gate lets every later arrival through at once (a rerun after a crash does not wait again);
a gate that is gone (the test ended) refuses the connection and the task goes on too. Every wait is
bounded by its own timeout.

A task that must simply run until it is stopped holds with `alarm` + `pause`: it blocks in the
kernel until a signal, and the alarm bounds it should nobody stop it.
"""

import os
import shutil
import socket
import sys
import tempfile
import threading

PY = sys.executable

# `gate_wait(path, seconds)`: blocks until the test opens the gate at `path` (True) or `seconds`
# pass or the gate is gone (False). Prepend it to a task's Python program.
GATE_WAIT = (
    "def gate_wait(path, seconds=60.0):\n"
    "    import socket\n"
    "    conn = socket.socket(socket.AF_UNIX)\n"
    "    conn.settimeout(seconds)\n"
    "    try:\n"
    "        conn.connect(path)\n"
    "        return conn.recv(1) == b'1'\n"
    "    except OSError:\n"
    "        return False\n"
    "    finally:\n"
    "        conn.close()\n"
)

# A task that waits for its gate (argv[1]) and exits 0.
WAIT_FOR_GATE = "import sys\n" + GATE_WAIT + "gate_wait(sys.argv[1])\n"


def hold(seconds=300):
    """A Python program that runs until it is signalled, at most `seconds` (then SIGALRM ends
    it)."""
    return f"import signal\nsignal.alarm({int(seconds)})\nsignal.pause()\n"


def hold_command(seconds=300):
    """`hold(seconds)` as a task's command line."""
    return [PY, "-c", hold(seconds)]


class Gate:
    """A release the test opens once: tasks blocked in `gate_wait(gate.path)` go on together, and
    later arrivals are let through at once. `arrivals` counts the tasks that reached the gate."""

    def __init__(self):
        # A short path of its own: a Unix socket path is limited to 107 bytes, and tasks of any uid
        # must reach it (0711 directory, 0777 socket).
        self.directory = tempfile.mkdtemp(prefix="gate-")
        os.chmod(self.directory, 0o711)  # nosec B103  # tasks run as other uids and only traverse it
        self.path = os.path.join(self.directory, "gate.sock")
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(self.path)
        os.chmod(self.path, 0o777)  # nosec B103  # any task uid connects; the test owns the directory
        self._listener.listen(128)
        self._lock = threading.Lock()
        self._open = False
        self._held = []
        self.arrivals = 0
        self._thread = threading.Thread(target=self._serve, name="gate", daemon=True)
        self._thread.start()

    def _serve(self):
        while True:  # bounded by close(): shutting the listener down ends accept() with an error
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.arrivals += 1
                if self._open:
                    self._release(conn)
                else:
                    self._held.append(conn)

    @staticmethod
    def _release(conn):
        try:
            conn.sendall(b"1")
        except OSError:  # the task is gone already (it timed out or was killed): nothing to release
            pass
        finally:
            conn.close()

    def open(self):
        """Release every task waiting now and every one that arrives later."""
        with self._lock:
            self._open = True
            held, self._held = self._held, []
            for conn in held:
                self._release(conn)

    def close(self):
        """Stop listening, drop held tasks (their wait returns False) and remove the socket."""
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=10)
        with self._lock:
            held, self._held = self._held, []
        for conn in held:
            conn.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def ticks(interval=0.05, seconds=600):
    """A Python program that appends `<FLEET_TASK_EPOCH> <wall clock>` to the file argv[1] every
    `interval` seconds (an interval timer, between which it blocks in `pause`), for at most
    `seconds`: the marks say when each copy of a task ran, so a test can see whether two copies
    overlapped."""
    return (
        "import os, signal, sys, time\n"
        "def tick(*_):\n"
        "    with open(sys.argv[1], 'a') as fh:\n"
        "        fh.write(f\"{os.environ.get('FLEET_TASK_EPOCH', '')} {time.time()}\\n\")\n"
        "signal.signal(signal.SIGALRM, tick)\n"
        f"signal.setitimer(signal.ITIMER_REAL, {interval}, {interval})\n"
        f"for _ in range({int(seconds / interval)}):\n"
        "    signal.pause()\n"
    )


# Parent and forked child ignore SIGTERM and print their pids, then hold until SIGKILLed (an alarm
# bounds each at 120 s): a task that only its kill grace's end can stop.
STUBBORN = (
    "import os, signal\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = os.fork()\n"
    "signal.alarm(120)\n"
    "if child == 0:\n"
    "    signal.pause()\n"
    "    os._exit(0)\n"
    "print(os.getpid(), child, flush=True)\n"
    "signal.pause()\n"
)


# Prints its pid, waits for the gate at argv[1] (without one: holds until stopped, 300 s at most),
# then prints 'released' and exits 0.
GATED = (
    "import os, signal, sys\n" + GATE_WAIT + "print(os.getpid(), flush=True)\n"
    "if len(sys.argv) > 1:\n"
    "    gate_wait(sys.argv[1], 300)\n"
    "else:\n"
    "    signal.alarm(300)\n"
    "    signal.pause()\n"
    "print('released', flush=True)\n"
)
