"""A real OpenID provider for the sign-in tests (tests/support/oidc/server.js: panva's
oidc-provider under Node.js), and a person who signs in at it: the user agent follows the
provider's own pages (the device code confirmation, its login form) over HTTP."""

import html.parser
import json
import os
import shutil
import socket
import subprocess
import urllib.parse
from pathlib import Path

import pytest
import requests

from tests.support.process import LoggedProcess

SERVER = Path(__file__).parent / "oidc" / "server.js"
CLIENT_ID, CLIENT_SECRET = "fleetd", "fleetd-test-secret"
# fleetd's callback for the provider `lab` as Flask's test client reaches it (http://localhost).
TEST_CLIENT_CALLBACK = "http://localhost/api/v1/auth/callback/lab"
# The lab the sign-in tests use: its people, and binding rules in order (per field, the first
# matching rule wins: an admin's role before a member's); bob's groups bind to nothing.
LAB_ACCOUNTS = {
    "alice": {"name": "Alice Liddell", "email": "alice@lab.example", "groups": ["ml-vision"]},
    "bob": {"name": "Bob", "groups": ["finance"]},
}
LAB_RULES = [
    {"provider": "lab", "claim": "groups", "contains": "ml-admins", "role": "admin"},
    {
        "provider": "lab",
        "claim": "groups",
        "contains": "ml-vision",
        "role": "member",
        "team": "ml",
        "projects": [{"project": "vision", "role": "member"}],
    },
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OidcProvider(LoggedProcess):
    """The provider on 127.0.0.1; `accounts` ({login: {name, email, groups, uid, gid}}) is a file it
    reads at every sign-in and refresh, so a test changes a person's groups with set_account()."""

    def __init__(
        self,
        tmp_path,
        accounts,
        redirect_uris=(TEST_CLIENT_CALLBACK,),
        client_auth="client_secret_basic",
    ):
        super().__init__()
        self.accounts_file = tmp_path / "oidc-accounts.json"
        self.accounts_file.write_text(json.dumps(accounts))
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.redirect_uris = list(redirect_uris)  # fleetd's callbacks the client allows
        self.client_auth = client_auth  # how clients authenticate at the token endpoint

    def start(self):
        node = shutil.which("node")
        if node is None or not (SERVER.parent / "node_modules" / "oidc-provider").is_dir():
            pytest.fail(
                "Node.js and tests/support/oidc/node_modules are needed: run scripts/setup.sh"
            )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PORT": str(self.port),
            "OIDC_ACCOUNTS_FILE": str(self.accounts_file),
            "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        }
        env["OIDC_REDIRECT_URIS"] = json.dumps(self.redirect_uris)
        env["OIDC_CLIENT_AUTH"] = self.client_auth
        self._spawn(
            [node, str(SERVER)],
            env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=SERVER.parent,
        )
        self.wait_for_line(r"^listening ", timeout=60)
        return self

    def set_account(self, login, **fields):
        accounts = json.loads(self.accounts_file.read_text())
        accounts[login] = {**accounts.get(login, {}), **fields}
        self.accounts_file.write_text(json.dumps(accounts))

    def lab_requests(self):
        """[(method, path, body)] an admin sends to set the lab up: this provider as `lab`, the
        project `vision`, LAB_RULES."""
        return [
            ("PUT", "/api/v1/auth/providers/lab", self.provider_body()),
            ("POST", "/api/v1/projects", {"key": "vision", "team": "ml"}),
            ("PUT", "/api/v1/auth/bindings", LAB_RULES),
        ]

    def configure_lab(self, api):
        """lab_requests through the admin ApiClient `api`; returns it."""
        for method, path, body in self.lab_requests():
            resp = api.call(method, path, json=body)
            assert resp.status_code in (200, 201), resp.get_json()
        return api

    def provider_body(self, **extra):
        """The body of PUT /api/v1/auth/providers/{name} for this provider."""
        return {
            "kind": "oidc",
            "issuer": self.issuer,
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            **extra,
        }

    def token_for(self, login, client_id=CLIENT_ID, client_secret=CLIENT_SECRET):
        """An ID token (and the whole token answer) for `login`, got through the provider's own
        device flow by a client of its own (as a CLI that signs in by itself would)."""
        auth = (client_id, client_secret)
        started = requests.post(
            f"{self.issuer}/device/auth",
            data={"scope": "openid profile email groups"},
            auth=auth,
            timeout=10,
        ).json()
        approve_device(started["verification_uri_complete"], login)
        answer = requests.post(
            f"{self.issuer}/token",
            auth=auth,
            timeout=10,
            data={
                "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
                "device_code": started["device_code"],
            },
        )
        return answer.json()


@pytest.fixture(name="provider")
def lab_provider(tmp_path):
    """The lab's provider (LAB_ACCOUNTS), started; killed at the end of the test."""
    started = OidcProvider(tmp_path, LAB_ACCOUNTS).start()
    yield started
    started.kill()


class _Forms(html.parser.HTMLParser):
    """The forms of a page: [(action, {name: value})]."""

    def __init__(self):
        super().__init__()
        self.forms = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.forms.append((attrs.get("action") or "", {}))
        elif tag == "input" and self.forms and attrs.get("name"):
            self.forms[-1][1][attrs["name"]] = attrs.get("value") or ""


def _forms(text):
    parser = _Forms()
    parser.feed(text)
    return parser.forms


def approve_device(verification_uri_complete, login, password="any"):
    """As the person at a browser: open the verification URL, confirm the code, sign in at the
    provider's login form. Returns the last page's text."""
    session = requests.Session()
    page = session.get(verification_uri_complete, timeout=10)
    for _ in range(6):  # the code's confirmation, the login form, then the provider's success page
        forms = _forms(page.text)
        if not forms:
            return page.text
        action, fields = forms[0]
        if fields.get("prompt") == "login":
            fields.update(login=login, password=password)
        page = session.post(urllib.parse.urljoin(page.url, action), data=fields, timeout=10)
        page.raise_for_status()
    raise AssertionError(f"the provider's pages did not end:\n{page.text[:2000]}")


def authorize(authorization_url, login, redirect_uri, password="any"):
    """As the person at a browser sent to the provider's authorization endpoint: sign in at its
    login form (and consent where it asks) until it sends the browser back to `redirect_uri`.
    Returns that URL (with its `code` and `state`, or an `error`)."""
    session = requests.Session()
    url, method, fields = authorization_url, "GET", None
    for _ in range(12):
        page = session.request(method, url, data=fields, timeout=10, allow_redirects=False)
        if page.is_redirect:
            url = urllib.parse.urljoin(page.url, page.headers["Location"])
            if url.startswith(redirect_uri):
                return url
            method, fields = "GET", None
            continue
        page.raise_for_status()
        forms = _forms(page.text)
        if not forms:
            raise AssertionError(f"the provider's page has no form:\n{page.text[:2000]}")
        action, fields = forms[0]
        if fields.get("prompt") == "login":
            fields.update(login=login, password=password)
        url, method = urllib.parse.urljoin(page.url, action), "POST"
    raise AssertionError(f"the provider did not send the browser back to {redirect_uri}")
