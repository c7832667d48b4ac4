"""A real HTTP receiver of webhook deliveries on loopback (fleetd allows 127.0.0.0/8 in tests), and
its fixture `receiver`."""

import http.server
import ssl
import threading

import pytest

SECRET = "s3cret-for-the-receiver-0123"


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread: records each POST, answers with the next queued
    status."""

    def __init__(self, tls=None):
        """`tls`: (certificate, key) files to answer over HTTPS; the server names clients ask for
        (SNI) are kept in `server_names`."""
        self.requests = []
        self.server_names = []
        self.statuses = []  # answered in order; 204 once empty
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer.lock:
                    outer.requests.append((self.path, dict(self.headers), body))
                    status = outer.statuses.pop(0) if outer.statuses else 204
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://example.invalid/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            context.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.url = f"https://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def receiver():
    """A Receiver, closed at the end."""
    r = Receiver()
    yield r
    r.close()
