"""Files in the state dir: node.json, session.token, local-api.token; mode 0600, written
atomically."""

import json
import os
import secrets
import tempfile

NODE_FILE = "node.json"
SESSION_FILE = "session.token"
LOCAL_API_TOKEN_FILE = "local-api.token"
LOCAL_API_TOKEN_PREFIX = "fll_"


def _private_temp(path, text):
    """A temp file beside `path` with `text` in it, mode 0600, fsynced: (its path, the directory).
    Removed again if writing it fails."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        _remove(tmp)
        raise
    return tmp, directory


def _remove(tmp):
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def write_private(path, text):
    """Write `text` to `path` atomically (temp file, fsync, rename, fsync dir) with mode 0600."""
    tmp, directory = _private_temp(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def create_private(path, text):
    """Create `path` (mode 0600) with `text` unless it exists; returns False if it already did."""
    tmp, _ = _private_temp(path, text)
    try:
        try:
            os.link(tmp, path)  # atomic and exclusive: two racing creators agree on one token
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return None


class State:
    """The agent's state dir."""

    def __init__(self, state_dir):
        self.dir = state_dir

    def path(self, name):
        """Absolute path of a file in the state dir."""
        return os.path.join(self.dir, name)

    def ensure_dir(self):
        """Create the state dir (mode 0700) if needed."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    def node(self):
        """{node_id, fleet, server_url, machine_id, ...} from node.json, or None before join."""
        text = _read(self.path(NODE_FILE))
        return json.loads(text) if text else None

    def session_token(self):
        """The node session token, or None before join."""
        text = _read(self.path(SESSION_FILE))
        return text.strip() if text and text.strip() else None

    def enrolled(self):
        """True once join has stored both the node and its session token."""
        return self.node() is not None and self.session_token() is not None

    def save_enrolment(self, node, session_token):
        """Store what register returned; the session token first, so node.json marks completion."""
        self.ensure_dir()
        write_private(self.path(SESSION_FILE), session_token + "\n")
        write_private(self.path(NODE_FILE), json.dumps(node, indent=2, sort_keys=True) + "\n")

    def local_api_token(self, create=True):
        """The local API bearer token, created (0600) on first use when `create`."""
        text = _read(self.path(LOCAL_API_TOKEN_FILE))
        if text and text.strip():
            return text.strip()
        if not create:
            return None
        self.ensure_dir()
        token = LOCAL_API_TOKEN_PREFIX + secrets.token_urlsafe(32)
        if create_private(self.path(LOCAL_API_TOKEN_FILE), token + "\n"):
            return token
        return _read(self.path(LOCAL_API_TOKEN_FILE)).strip()
