"""`fleetd login --provider` against a real `fleetd serve` and a real OpenID provider: the CLI
shows where to sign in, waits for the person, saves the session (0600), and later commands refresh
it before it ends."""

import os
import re
import subprocess

import pytest

from tests.integration.conftest import Http, fleetd_cmd
from tests.support.oidc_provider import OidcProvider, approve_device

pytestmark = pytest.mark.integration


@pytest.fixture
def provider(tmp_path):
    started = OidcProvider(tmp_path, {"alice": {"name": "Alice", "groups": ["lab"]}}).start()
    yield started
    started.kill()


def test_login_with_a_provider_saves_a_session_that_later_commands_refresh(
    server, admin, provider, tmp_path
):
    http = Http(server.url, admin)
    http("PUT", "/api/v1/auth/providers/lab", json=provider.provider_body(), expect=200)
    rules = [{"provider": "lab", "claim": "groups", "contains": "lab", "role": "member"}]
    http("PUT", "/api/v1/auth/bindings", json=rules, expect=200)
    config = tmp_path / "config"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(config),
        "FLEETD_URL": server.url,
    }
    login = subprocess.Popen(
        fleetd_cmd("login", "--provider", "lab"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        shown = login.stdout.readline()
        where = re.search(r"Open (\S+) and enter the code (\S+)", shown)
        assert where, shown
        approve_device(where.group(1), "alice")
        out, _ = login.communicate(timeout=60)
    finally:
        if login.poll() is None:
            login.kill()
            login.wait(timeout=30)
    assert login.returncode == 0, shown + out
    assert "signed in to" in out and "as user:alice (member)" in out
    saved = config / "fleetd" / "config.toml"
    assert saved.stat().st_mode & 0o777 == 0o600
    text = saved.read_text()
    assert 'token = "fls_' in text and 'refresh_token = "flr_' in text

    def status():
        proc = subprocess.run(
            fleetd_cmd("status", "--json"), env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert '"principal": "user:alice"' in status()
    # A session about to end is refreshed by the next command, which saves the new one.
    saved.write_text(re.sub(r'expires_at = "[^"]*"', 'expires_at = "2000-01-01T00:00:00Z"', text))
    assert '"principal": "user:alice"' in status()
    renewed = saved.read_text()
    assert renewed != text and "2000-01-01" not in renewed
    old_token = re.search(r'^token = "([^"]+)"', text, re.M).group(1)
    http("GET", "/api/v1/whoami", token=old_token, expect=401)
