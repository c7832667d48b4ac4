"""A loopback TCP forwarder a test can cut, as a network partition between an agent and fleetd."""

import socket
import threading

POLL_SECONDS = 0.2
MAX_POLLS = 36_000  # two hours of polling: far beyond any test, a bound all the same


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `target` (host, port). `cut()` makes it forward nothing while
    every connection stays open and new ones are still accepted: requests hang until their timeout,
    as through a network that drops packets. `restore()` forwards again; `close()` ends it all."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(POLL_SECONDS)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets = []
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept", daemon=True)]
        self._threads[0].start()

    def cut(self):
        self.forwarding.clear()

    def restore(self):
        self.forwarding.set()

    def close(self):
        self.closed.set()
        self.forwarding.set()  # pumps waiting on a cut see `closed` at once
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets + [self.listener]:
            try:
                sock.close()
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept(self):
        for _ in range(MAX_POLLS):
            if self.closed.is_set():
                return
            try:
                client, _addr = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(
                    target=self._pump, args=(src, dst), name="proxy-pump", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _pump(self, src, dst):
        src.settimeout(POLL_SECONDS)
        for _ in range(MAX_POLLS):
            if self.closed.is_set():
                break
            if (
                not self.forwarding.is_set()
            ):  # cut: the bytes stay where they are, nothing is closed
                self.forwarding.wait(POLL_SECONDS)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
