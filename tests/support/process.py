"""A child process whose output is kept as lines for assertions, and killed by pid at the end."""

import os
import re
import signal
import subprocess
import threading

from tests.support.polling import wait_until


class LoggedProcess:
    """A child started by `_spawn` with one output stream piped; its lines are kept (`lines`, `log`)
    and can be waited for (`wait_for_line`)."""

    def __init__(self):
        self.proc = None
        self.lines = []
        self._eof = False
        self._new_line = threading.Condition()

    def _spawn(self, argv, env, **popen):
        """Popen(argv) with stdout or stderr set to subprocess.PIPE in `popen`: that stream is
        kept."""
        with self._new_line:
            self.lines, self._eof = [], False
        self.proc = subprocess.Popen(argv, text=True, env=env, **popen)
        stream = self.proc.stdout if self.proc.stdout is not None else self.proc.stderr
        threading.Thread(target=self._pump, args=(stream, self.lines), daemon=True).start()
        return self.proc

    def _pump(self, stream, lines):
        for line in stream:
            with self._new_line:
                lines.append(line)
                self._new_line.notify_all()
        with self._new_line:
            if lines is self.lines:  # not the output of an earlier run
                self._eof = True
            self._new_line.notify_all()

    def wait_for_line(self, pattern, timeout=30.0, count=1):
        """The count-th log line matching `pattern` (a regex match); AssertionError on timeout or
        exit."""
        regex = re.compile(pattern)
        what = f"{count} line(s) matching {pattern!r}"

        def found():
            matches = [m for m in (regex.search(line) for line in self.lines) if m]
            if len(matches) >= count:
                return matches[count - 1]
            if self._eof:
                raise AssertionError(f"no {what} before the output ended:\n{self.log}")
            return None

        with self._new_line:
            return wait_until(
                found, timeout, 0.5, what, pause=self._new_line.wait, details=lambda: self.log
            )

    @property
    def log(self):
        return "".join(self.lines)

    def signal(self, signum):
        os.kill(self.proc.pid, signum)

    def wait(self, timeout=30):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
