"""Offline bundles: a wheelhouse holding fleet-agent (the fleetd distribution with its [agent]
extra), every dependency and pip itself, so that hosts without internet access can install.

Layout of `fleet-agent-bundle-<version>.tar.gz`::

    fleet-agent-bundle-<version>/manifest.json
    fleet-agent-bundle-<version>/wheels/*.whl

The manifest names the version, the SHA-256 of every wheel, and the Python versions and CPU
architectures the binary wheels were built for; preflight compares those with each host.

Builds are reproducible: the same sources give the same bytes, so the same SHA-256, and a rerun
of `fleetd bootstrap` (which builds a bundle when given none) finds the agent it installed and
changes nothing. Wheels are built with SOURCE_DATE_EPOCH (fixed zip timestamps), and the archive
has fixed owners, modes, times and order and no time or name in its gzip header.
"""

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = 1
PIP_TIMEOUT = 1800
#: The time every member of a bundle (and every wheel built for it) carries unless SOURCE_DATE_EPOCH
#: says otherwise: 1980-01-01, the earliest a zip file (a wheel) can hold.
EPOCH = 315532800
_WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


class BundleError(Exception):
    """A bundle could not be built or read; the message says why."""


@dataclasses.dataclass
class Bundle:
    """A built bundle on disk."""

    path: Path
    version: str
    sha256: str
    manifest: dict

    @property
    def size(self):
        return self.path.stat().st_size

    def supports(self, python_version, arch):
        """'' when a host with this Python (X.Y[.Z]) and CPU architecture can install the bundle,
        else why not."""
        return check_host_compat(self.manifest.get("wheels", {}), python_version, arch)


def sha256_file(path):
    """Hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_source_tree():
    """The fleetd source tree this code runs from (an editable install or a checkout), or None."""
    here = Path(__file__).resolve().parent.parent.parent
    setup_cfg = here / "setup.cfg"
    if setup_cfg.is_file() and re.search(r"^name\s*=\s*fleetd\s*$", setup_cfg.read_text(), re.M):
        return here
    return None


def _parse_wheel(filename):
    match = _WHEEL_RE.match(filename)
    if not match:
        raise BundleError(f"{filename} is not a wheel file name")
    return match.groupdict()


def _python_tag_ok(py_tags, abi_tags, version):
    major, minor = (int(x) for x in version.split(".")[:2])
    for tag in py_tags.split("."):
        if tag in ("py3", f"py{major}", f"py{major}{minor}"):
            return True
        match = re.fullmatch(r"cp(\d)(\d+)", tag)
        if match and int(match.group(1)) == major:
            if int(match.group(2)) == minor:
                return True
            if "abi3" in abi_tags.split(".") and int(match.group(2)) <= minor:
                return True
    return False


def _platform_ok(plat_tags, arch):
    return any(tag == "any" or tag.endswith("_" + arch) for tag in plat_tags.split("."))


def check_host_compat(wheels, python_version, arch):
    """'' when every project in the wheelhouse has a wheel for this Python and architecture, else
    why not."""
    if not python_version:
        return "no Python found"
    projects: dict[str, bool] = {}
    for filename in wheels:
        tags = _parse_wheel(filename)
        ok = _python_tag_ok(tags["py"], tags["abi"], python_version) and _platform_ok(
            tags["plat"], arch
        )
        name = tags["name"].lower().replace("_", "-")
        projects[name] = projects.get(name, False) or ok
    missing = sorted(name for name, ok in projects.items() if not ok)
    if missing:
        short = ".".join(python_version.split(".")[:2])
        return (
            f"the bundle has no wheel of {', '.join(missing)} for Python {python_version} on "
            f"{arch} (build one with `fleetd bundle build --python-version {short} --platform "
            f"manylinux2014_{arch}`)"
        )
    return ""


def source_date_epoch():
    """The timestamp a bundle's files carry: SOURCE_DATE_EPOCH when set (reproducible-builds.org),
    else EPOCH."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return max(int(value), EPOCH) if value.isdigit() else EPOCH


def _pip(args, log):
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    log("running " + " ".join(cmd))
    # Wheels built here (fleetd's own, a dependency from an sdist) get fixed zip timestamps.
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(source_date_epoch()), PYTHONHASHSEED="0")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        raise BundleError(f"pip did not finish within {PIP_TIMEOUT}s") from None
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise BundleError(f"pip {args[0]} failed:\n{tail}")
    return result


def build_bundle(
    output_dir,
    source=None,
    python_versions=(),
    platforms=(),
    find_links=(),
    no_index=False,
    log=lambda message: None,
):
    """Build a bundle from the fleetd source tree `source` (default: the one this code runs
    from)."""
    source = Path(source) if source else find_source_tree()
    if source is None or not (source / "setup.cfg").is_file():
        raise BundleError("no fleetd source tree found: give --source (a checkout of fleetd)")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    index_args = [f"--find-links={link}" for link in find_links] + (
        ["--no-index"] if no_index else []
    )
    with tempfile.TemporaryDirectory(prefix="fleet-agent-bundle-") as tmp:
        build = Path(tmp) / "own"
        # Build from a copy: pip must not leave build/ or *.egg-info behind in the source tree.
        shutil.copytree(
            source,
            build,
            ignore=shutil.ignore_patterns(
                ".git",
                ".venv",
                "build",
                "dist",
                "*.egg-info",
                "__pycache__",
                ".pytest_cache",
                "node_modules",
                ".dev",
            ),
        )
        own = Path(tmp) / "own-wheel"
        _pip(["wheel", "--no-deps", "-w", str(own), *index_args, str(build)], log)
        built = sorted(own.glob("fleetd-*.whl"))
        if len(built) != 1:
            raise BundleError(f"building fleetd gave {len(built)} wheels, expected 1")
        own_wheel = built[0]
        version = _parse_wheel(own_wheel.name)["version"]
        root = Path(tmp) / f"fleet-agent-bundle-{version}"
        wheels = root / "wheels"
        wheels.mkdir(parents=True)
        shutil.copy2(own_wheel, wheels / own_wheel.name)
        requirement = f"{wheels / own_wheel.name}[agent]"
        if python_versions:
            plats = list(platforms) or [
                "manylinux2014_x86_64",
                "manylinux_2_17_x86_64",
                "linux_x86_64",
            ]
            for version_ in python_versions:
                _pip(
                    [
                        "download",
                        "--only-binary=:all:",
                        "--implementation=cp",
                        f"--python-version={version_}",
                        *[f"--platform={p}" for p in plats],
                        "-d",
                        str(wheels),
                        *index_args,
                        requirement,
                        "pip",
                    ],
                    log,
                )
        else:
            _pip(
                [
                    "wheel",
                    "-w",
                    str(wheels),
                    f"--find-links={wheels}",
                    *index_args,
                    requirement,
                    "pip",
                ],
                log,
            )
        files = sorted(p.name for p in wheels.glob("*.whl"))
        if not any(name.startswith("pip-") for name in files):
            raise BundleError("the wheelhouse has no pip wheel")
        binary = [name for name in files if _parse_wheel(name)["plat"] != "any"]
        manifest = {
            "format": FORMAT,
            "name": "fleet-agent",
            "version": version,
            "requirement": f"fleetd[agent]=={version}",
            "built_with_python": ".".join(str(x) for x in sys.version_info[:3]),
            "python_versions": list(python_versions)
            or [f"{sys.version_info[0]}.{sys.version_info[1]}"],
            "binary_wheels": binary,
            "wheels": {name: sha256_file(wheels / name) for name in files},
        }
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        target = output_dir / f"fleet-agent-bundle-{version}.tar.gz"
        partial = target.with_name(target.name + ".part")
        _write_archive(root, partial)
        os.replace(partial, target)
    log(f"wrote {target}")
    return read_bundle(target)


def _write_archive(root, path):
    """root as a .tar.gz whose bytes depend on the files' names and contents only: members in
    sorted order with fixed owners, modes and times, and a gzip header without time or file name."""
    mtime = source_date_epoch()
    paths = [root, *sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix())]
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for item in paths:
            name = root.name if item == root else f"{root.name}/{item.relative_to(root).as_posix()}"
            info = tar.gettarinfo(str(item), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755 if info.isdir() else 0o644
            info.mtime = mtime
            info.pax_headers = {}
            if info.isfile():
                with open(item, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)


def _regular_file(tar, member, path):
    """The contents of a bundle's member; BundleError when it is no regular file (a directory, a
    device)."""
    fh = tar.extractfile(member)
    if fh is None:
        raise BundleError(f"{path}: {member.name} is not a regular file")
    return fh


def read_bundle(path):
    """Open a bundle, check its wheels against the manifest; returns a Bundle."""
    path = Path(path)
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = {m.name: m for m in tar.getmembers()}
            manifests = [
                name for name in members if name.count("/") == 1 and name.endswith("/" + MANIFEST)
            ]
            if len(manifests) != 1:
                raise BundleError(f"{path} is not a fleet-agent bundle (no single manifest.json)")
            top = manifests[0].split("/")[0]
            manifest = json.load(io.TextIOWrapper(_regular_file(tar, members[manifests[0]], path)))
            for name, digest in manifest.get("wheels", {}).items():
                member = members.get(f"{top}/wheels/{name}")
                if member is None:
                    raise BundleError(f"{path}: {name} is in the manifest but not in the bundle")
                actual = hashlib.sha256(_regular_file(tar, member, path).read()).hexdigest()
                if actual != digest:
                    raise BundleError(f"{path}: {name} does not match its SHA-256 in the manifest")
    except (OSError, tarfile.TarError, ValueError) as exc:
        raise BundleError(f"cannot read bundle {path}: {exc}") from None
    if manifest.get("format") != FORMAT or not manifest.get("version"):
        raise BundleError(f"{path}: unsupported bundle format {manifest.get('format')!r}")
    if top != f"fleet-agent-bundle-{manifest['version']}":
        raise BundleError(
            f"{path}: top directory {top} does not match version {manifest['version']}"
        )
    return Bundle(
        path=path, version=manifest["version"], sha256=sha256_file(path), manifest=manifest
    )
