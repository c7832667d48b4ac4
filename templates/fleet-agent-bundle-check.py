#!/usr/bin/env python3
"""Checks an offline bundle on the controller before any host is touched (the fleet_agent role
runs it first): the file exists and is readable, it is a fleet-agent bundle with a valid
manifest, and every wheel matches its SHA-256 in the manifest. Prints one JSON object
{path, version, sha256}; on a problem prints the reason on stderr and exits 2.
Usage: fleet-agent-bundle-check.py BUNDLE [BASE_DIR]  (a relative BUNDLE is taken from BASE_DIR: the
directory ansible-playbook runs in, which modules do not run in; default the current directory)
"""

import hashlib
import json
import os
import sys
import tarfile
from typing import NoReturn


def fail(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(2)


def regular_file(tar, member, path):
    """The contents of a bundle's member; fails when it is no regular file (a directory, a
    device)."""
    fh = tar.extractfile(member)
    if fh is None:
        fail(f"{path}: {member.name} is not a regular file")
    return fh


def main(argv):
    if len(argv) not in (2, 3) or not argv[1]:
        fail(
            "set fleet_agent_bundle to a fleet-agent-bundle-<version>.tar.gz made by `fleetd "
            "bundle build`"
        )
    base = argv[2] if len(argv) == 3 and os.path.isabs(argv[2]) else os.getcwd()
    path = os.path.normpath(os.path.join(base, os.path.expanduser(argv[1])))
    where = (
        f"{argv[1]} (looked for {path}; a relative path is taken from the directory "
        f"ansible-playbook runs in)"
    )
    if not os.path.exists(path):
        fail(f"no bundle at {where}")
    if not os.path.isfile(path):
        fail(f"the bundle {where} is not a file")
    if not os.access(path, os.R_OK):
        fail(f"the bundle {path} is not readable by {os.getuid()}")
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        with tarfile.open(path, "r:gz") as tar:
            members = {m.name: m for m in tar.getmembers()}
            manifests = [n for n in members if n.count("/") == 1 and n.endswith("/manifest.json")]
            if len(manifests) != 1:
                fail(f"{path} is not a fleet-agent bundle (no single manifest.json)")
            top = manifests[0].split("/")[0]
            manifest = json.load(regular_file(tar, members[manifests[0]], path))
            version, wheels = manifest.get("version"), manifest.get("wheels")
            if (
                not isinstance(version, str)
                or not version
                or not isinstance(wheels, dict)
                or not wheels
            ):
                fail(f"{path}: manifest.json has no version or no wheels")
            if top != f"fleet-agent-bundle-{version}":
                fail(f"{path}: top directory {top} does not match version {version}")
            for name, expected in sorted(wheels.items()):
                member = members.get(f"{top}/wheels/{name}")
                if member is None:
                    fail(f"{path}: {name} is in the manifest but not in the bundle")
                if hashlib.sha256(regular_file(tar, member, path).read()).hexdigest() != expected:
                    fail(f"{path}: {name} does not match its SHA-256 in the manifest")
    except (OSError, tarfile.TarError, ValueError, AttributeError) as exc:
        fail(f"cannot read the bundle {path}: {exc}")
    print(json.dumps({"path": path, "version": version, "sha256": digest.hexdigest()}))


if __name__ == "__main__":
    main(sys.argv)
