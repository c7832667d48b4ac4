"""The agent's installs on a host, side by side: each bundle in a venv of its own,
INSTALL_DIR/versions/VERSION-SHA12, and one symlink, INSTALL_DIR/current, that the systemd unit's
ExecStart goes through, switched in one rename. An upgrade installs beside the running agent (which
it never touches), switches current, and switches it back when the new agent does not come up;
once the new one answers, installs beyond the last KEEP_VERSIONS are removed. The work on the host
is done by templates/fleet-agent-install.sh and fleet-agent-versions.sh, which the Ansible role runs
as they are; this module runs them over SSH for `fleetd bootstrap` and `fleetd rollout`.

An install of the older layout (one venv in INSTALL_DIR itself, upgraded in place) is taken over as
it is: current -> "." until an upgrade installs beside it, and a later one removes it.
"""

import dataclasses
import posixpath
import shlex

from fleetd.provision import rendering

#: Installs kept on a host: the one that runs and the one before it (what a failed upgrade goes
#: back to).
KEEP_VERSIONS = 2
#: Space the upload needs beyond the bundle itself: its unpacked wheels, and some to spare.
UNPACK_FACTOR = 2


class InstallFailed(Exception):
    """The install or the switch failed; the host runs what it ran before. The message is the cause
    ("no space left on ..." for a full disk)."""


@dataclasses.dataclass
class Switched:
    """What an install switched: current named `previous` before ("." for an install of the older
    layout, "" for none) and names `installed` now; `answered` once the new agent heartbeats."""

    previous: str = ""
    installed: str = ""
    answered: bool = False

    @property
    def pending(self):
        """A failure now switches back: the new agent has not answered and there is one to go back
        to."""
        return bool(self.installed and self.previous) and not self.answered


def key_values(text):
    """key=value lines of the scripts' output -> dict (the last of a key wins)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            out[key] = value.strip()
    return out


def _error(out, err, what):
    """The scripts' own error lines (they name the step and the cause), else the end of the
    output."""
    lines = [line.strip() for line in (err + "\n" + out).splitlines() if line.strip()]
    errors = [line[len("error: ") :] for line in lines if line.startswith("error: ")]
    return "; ".join(errors) if errors else f"{what}: {' | '.join(lines[-3:]) or '(no output)'}"


def _versions(remote, *args, timeout=120.0):
    """fleet-agent-versions.sh ARGS on the host; (exit code, key=values, stdout, stderr)."""
    code, out, err = remote.run_script(
        rendering.script(rendering.VERSIONS_SCRIPT), args, timeout=timeout, check=False
    )
    return code, key_values(out), out, err


def install(remote, bundle, python, install_dir, unit_path, timeout):
    """Upload `bundle`, install it beside what runs, and switch current to it. Returns (Switched,
    whether the unit was rewritten for this layout). InstallFailed: nothing changed that runs."""
    code, out, err = remote.run(
        'tmp=$(mktemp -d) && echo "tmp=$tmp" && '
        'df -Pk "$tmp" | awk \'NR == 2 { print "free_kb=" $4 }\'',
        timeout=60,
        check=False,
    )
    facts = key_values(out)
    tmp = facts.get("tmp", "")
    if code != 0 or not tmp.startswith("/"):
        raise InstallFailed(
            f"cannot make a temporary directory for the bundle: {err.strip()[:300]}"
        )
    try:
        size_kb = bundle.path.stat().st_size // 1024 + 1
        free_kb = facts.get("free_kb", "")
        if free_kb.isdigit() and int(free_kb) < size_kb * UNPACK_FACTOR:
            raise InstallFailed(
                f"no space left on {posixpath.dirname(tmp)} ({int(free_kb) // 1024} MiB free) for "
                f"the bundle: it needs {size_kb * UNPACK_FACTOR // 1024 + 1} MiB there to be "
                "uploaded and unpacked; nothing was installed"
            )
        bundle_remote = posixpath.join(tmp, bundle.path.name)
        remote.put(bundle.path, bundle_remote)
        _, out, _ = remote.run(f"sha256sum {shlex.quote(bundle_remote)}", timeout=120)
        if out.split()[:1] != [bundle.sha256]:
            raise InstallFailed("the uploaded bundle does not match its SHA-256")
        code, out, err = remote.run_script(
            rendering.script(rendering.INSTALL_SCRIPT),
            [bundle_remote, python, install_dir],
            timeout=timeout,
            check=False,
        )
        done = key_values(out)
        if code != 0 or done.get("installed") != bundle.version or not done.get("version_dir"):
            raise InstallFailed(_error(out, err, f"installing fleet-agent {bundle.version}"))
    finally:
        remote.run(f"rm -rf {shlex.quote(tmp)}", timeout=60, check=False)
    installed = done["version_dir"]
    code, result, out, err = _versions(remote, "switch", install_dir, installed, unit_path)
    if code != 0 or result.get("current") != installed:
        why = _error(out, err, f"switching to {installed}")
        _versions(remote, "discard", install_dir, installed)
        raise InstallFailed(f"{why}; the new install was removed")
    previous = result.get("previous", "")
    return Switched(previous=previous, installed=installed), result.get("unit") == "rewritten"


def switch_back(remote, install_dir, switched):
    """Point current back at what it named before `switched` and remove the new install. Returns
    None, or why it could not (the host then runs the new install)."""
    code, result, out, err = _versions(remote, "switch", install_dir, switched.previous)
    if code != 0 or result.get("current") != switched.previous:
        return _error(out, err, f"switching back to {switched.previous}")
    _versions(remote, "discard", install_dir, switched.installed)
    return None


def adopt(remote, install_dir):
    """Give an install of the older layout its current link (before a unit that goes through it is
    written). InstallFailed when it cannot."""
    code, _, out, err = _versions(remote, "adopt", install_dir)
    if code != 0:
        raise InstallFailed(_error(out, err, f"linking {install_dir}/current"))


def prune(remote, install_dir, keep=KEEP_VERSIONS):
    """Remove installs beyond the last `keep`; returns (removed names, why it failed or None)."""
    code, _, out, err = _versions(remote, "prune", install_dir, keep)
    removed = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("removed=")]
    return removed, (None if code == 0 else _error(out, err, "removing older installs"))
