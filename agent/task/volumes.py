"""Instance volumes: ``<state_dir>/volumes/<instance id>/``, kept from one run of an instance to the
next.

A volume is made at an instance's first start and outlives its runs (stop, resume, an agent
restart); it goes only when fleetd lists it in a heartbeat reply's `delete_volumes`. Deleting
never follows a symlink out of the volume (shutil.rmtree walks by file descriptor and unlinks
links). The space used is measured by a walk that follows no link and counts allocated blocks.
"""

import logging
import os
import shutil
import stat
import sys

from fleetwire.assignment import INSTANCE_ID_RE

log = logging.getLogger("agent.runner")

VOLUMES_DIR = "volumes"
MAX_WALK_ENTRIES = 2_000_000  # a measure stops here (and says so) rather than walk for ever


class Volumes:
    """The volume directories of this host's instances."""

    def __init__(self, state_dir, root_mode=0o700):
        self.root = os.path.join(state_dir, VOLUMES_DIR)
        self.root_mode = (
            root_mode  # 0711 where tasks run as their own uid: they pass through, never list
        )

    def prepare(self):
        """Make the directory of all volumes, of its mode (an older agent's may have another)."""
        os.makedirs(self.root, mode=self.root_mode, exist_ok=True)
        if stat.S_IMODE(os.stat(self.root).st_mode) != self.root_mode:
            os.chmod(self.root, self.root_mode)

    def path(self, instance_id):
        """The directory of an instance's volume; ValueError for an id that is no instance id."""
        if not INSTANCE_ID_RE.fullmatch(instance_id or "") or instance_id in (".", ".."):
            raise ValueError(f"{instance_id!r} is not an instance id")
        return os.path.join(self.root, instance_id)

    def ensure(self, instance_id, mode=0o700):
        """The volume's directory, made (with `mode`) when missing; OSError when it is not a
        directory."""
        path = self.path(instance_id)
        self.prepare()
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise OSError(f"{path} exists and is not a directory") from None
        os.chmod(path, mode)
        return path

    def room_for(self, instance_id, size):
        """None when `size` bytes fit the volume (what it holds counts), else why not: the file
        system of the volumes has less free space than the volume still needs."""
        if not size:
            return None
        stats = os.statvfs(self.root)
        free = stats.f_bavail * stats.f_frsize
        needed = size - (self.used_bytes(instance_id) or 0)
        if needed <= free:
            return None
        return (
            f"the volume of {size} bytes does not fit on this host: {free} bytes are free on "
            f"{self.root}'s file system and it needs {needed} more"
        )

    def list(self):
        """The instance ids whose volume directory is present."""
        try:
            with os.scandir(self.root) as entries:
                return sorted(
                    e.name
                    for e in entries
                    if e.is_dir(follow_symlinks=False)
                    and INSTANCE_ID_RE.fullmatch(e.name)
                    and e.name not in (".", "..")
                )
        except FileNotFoundError:
            return []

    def delete(self, instance_id):
        """Remove a volume and all in it; True when it is gone."""
        path = self.path(instance_id)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(mode):  # a link or a file where a volume should be: only the name goes
            os.unlink(path)
            return True
        errors = []

        def note(_fn, failed, exc):  # onexc gets the exception, onerror its exc_info
            errors.append((failed, exc[1] if isinstance(exc, tuple) else exc))

        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=note)  # novermin - this branch runs on 3.12 and later only
        else:
            shutil.rmtree(path, onerror=note)
        for failed, exc in errors[:5]:
            log.error("volume %s: cannot delete %s: %s", instance_id, failed, exc)
        return not os.path.lexists(path)

    def used_bytes(self, instance_id):
        """Bytes the volume's files take on disk (allocated blocks), or None when it cannot be
        read."""
        try:
            path = self.path(instance_id)
        except ValueError:
            return None
        return tree_bytes(path, f"volume {instance_id}")


def tree_bytes(path, what):
    """Bytes the files under `path` take on disk (allocated blocks; no link followed), or None when
    `path` cannot be read. `what` names it in the warning of a walk cut short."""
    try:
        total, stack, seen = os.lstat(path).st_blocks * 512, [path], 0
    except OSError:
        return None
    for _ in range(MAX_WALK_ENTRIES):
        if not stack:
            return total
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue  # removed while walked, or unreadable: what was counted stands
        if seen >= MAX_WALK_ENTRIES:
            break
    log.warning("%s: more than %d entries; its size is counted up to there", what, MAX_WALK_ENTRIES)
    return total
