"""Task directories, made from recycled ones where that is safe.

Each task gets ``<state>/tasks/<task>.<epoch>/`` holding its state file and its work directory.
Making and removing them costs three inodes a task, and an inode is dear on ext4: the allocator
searches the block group for a free one and, on a file system without a journal, passes over
every inode freed in the last half minute. At a few hundred short tasks a second each `mkdir`
cost 50-400 µs of CPU on the benchmark VM (measured 2026-11-30; in the history of
docs/benchmarks.md: `git log -S '400 µs' -- docs/benchmarks.md`).

So a task directory that its task left exactly as it was made (an empty work directory of mode
0700, the task directory of its mode and ours, its output and exit-status files ours and of no
other name, which are emptied, no extended attribute beyond those every new directory gets,
nothing beside the state file, which has no other link), once none of the task's processes is
left (its cgroup is gone; without cgroups nothing is reused), is kept: its state file is blanked and
the directory is renamed into ``<state>/spare-task-dirs/``. The next task's directory is renamed
out of there. A rename allocates nothing. Anything a task changed sends its directory the old way,
through removal, so no task ever finds a trace of another. Spares left from before a restart are
removed unchecked rather than trusted.
"""

import itertools
import logging
import os
import shutil
import stat
import threading

from agent.task.output import OUTPUT_FILES

log = logging.getLogger(__name__)

STATE_FILE = "task.json"
WORK_DIR = "work"
STATUS_FILE = "exit-status"  # what the task's root-owned wrapper recorded (agent/task/task.py)
# Files a task's directory keeps for the next task, emptied: its output and its exit status.
KEPT_FILES = (*(name for _, name in OUTPUT_FILES), STATUS_FILE)
SPARE_DIR = "spare-task-dirs"
DEFAULT_KEEP = 64  # spares at most: a burst of short tasks on one host needs no more


def make_task_dir(path, mode=0o700):
    """Create a task's directory (`mode`: 0711 where tasks run as their own uid, which must pass
    through it) and its work directory (0700), and the directory of all tasks (`mode` too) where
    it is missing. A directory left from an earlier try is kept."""
    try:
        os.mkdir(path, mode)
    except FileNotFoundError:  # the first task: os.makedirs would make `path` itself 0755
        os.makedirs(os.path.dirname(path), mode=mode, exist_ok=True)
        os.chmod(os.path.dirname(path), mode)  # makedirs' mode is masked by the umask
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    os.chmod(path, mode)  # mkdir's mode is masked by the umask
    try:
        os.mkdir(os.path.join(path, WORK_DIR), 0o700)
    except FileExistsError:
        pass


def remove_task_dir(path):
    """Remove a task's directory: its state file and empty work directory at a few syscalls' cost,
    anything more through shutil.rmtree; errors are ignored, as rmtree's ignore_errors does."""
    try:
        os.unlink(os.path.join(path, STATE_FILE))
        os.rmdir(os.path.join(path, WORK_DIR))
        os.rmdir(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _xattrs(path):
    """{name: value} of a path's extended attributes; {} where the file system has none."""
    try:
        return {
            name: os.getxattr(path, name, follow_symlinks=False)
            for name in os.listxattr(path, follow_symlinks=False)
        }
    except OSError:
        return {}


def _blank(path):
    """Empty a state file to one blank line (which read_state skips), not to nothing: ext4
    writes a file out at its next close once it was truncated to zero length and written
    again (auto_da_alloc), which cost a disk write and about 80 µs of CPU per task."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.pwrite(fd, b"\n", 0)
        os.ftruncate(fd, 1)
    finally:
        os.close(fd)


class TaskDirs:
    """Makes and removes task directories, keeping up to `keep` clean ones for reuse."""

    def __init__(self, spare_dir, keep=DEFAULT_KEEP, mode=0o700):
        self.spare_dir = spare_dir
        self.keep = keep
        self.mode = mode  # of a task's directory (its work directory is 0700, its user's)
        self._lock = threading.Lock()
        self._spares = []  # names in spare_dir, each a clean task directory with a blank state file
        self._names = itertools.count()
        self._uid, self._gid = os.geteuid(), os.getegid()
        # The extended attributes every new directory and file gets (an SELinux label).
        self._born = {}
        shutil.rmtree(spare_dir, ignore_errors=True)
        if keep:
            try:
                os.makedirs(spare_dir, mode=0o700, exist_ok=True)
                probe = os.path.join(spare_dir, "probe")
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                self._born = {stat.S_IFDIR: _xattrs(spare_dir), stat.S_IFREG: _xattrs(probe)}
                os.unlink(probe)
            except OSError as exc:
                log.warning(
                    "cannot create %s (%s): task directories are not reused",
                    spare_dir,
                    exc.strerror or exc,
                )
                self.keep = 0

    def make(self, path, owner=None):
        """Create the directory of a task at `path`, with its work directory, which belongs to
        `owner` ((uid, gid); None: the agent)."""
        uid, gid = owner or (self._uid, self._gid)
        with self._lock:
            name = self._spares.pop() if self._spares else None
        if name is not None:
            spare = os.path.join(self.spare_dir, name)
            try:
                os.rename(spare, path)
            except OSError:  # `path` is left from an earlier try, or the spare went
                shutil.rmtree(spare, ignore_errors=True)
            else:
                self._give(path, uid, gid)
                return
        make_task_dir(path, self.mode)
        self._give(path, uid, gid)

    @staticmethod
    def _give(path, uid, gid):
        work = os.path.join(path, WORK_DIR)
        st = os.lstat(work)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(work, uid, gid, follow_symlinks=False)

    def remove(self, path, reuse=True):
        """Remove a task's directory, or keep it as a spare when it is exactly as it was made and
        `reuse` (the caller knows that no process of the task is left to write into it)."""
        if reuse and len(self._spares) < self.keep and self._clean(path):
            spare = os.path.join(self.spare_dir, str(next(self._names)))
            try:
                for (
                    name
                ) in KEPT_FILES:  # emptied, not removed: the next task's writes allocate no inode
                    kept = os.path.join(path, name)
                    if os.path.exists(kept) and os.stat(kept).st_size:
                        os.truncate(kept, 0)
                _blank(os.path.join(path, STATE_FILE))
                os.rename(path, spare)
            except OSError:
                pass
            else:
                with self._lock:
                    self._spares.append(os.path.basename(spare))
                return
        remove_task_dir(path)

    def spares(self):
        """How many clean directories wait for a task."""
        with self._lock:
            return len(self._spares)

    def _clean(self, path):
        state, work = os.path.join(path, STATE_FILE), os.path.join(path, WORK_DIR)
        # The work directory may belong to the task's user: it is given to the next task's at reuse.
        made = (
            (path, stat.S_IFDIR, self.mode, True),
            (work, stat.S_IFDIR, 0o700, False),
            (state, stat.S_IFREG, 0o600, True),
        )
        try:
            with os.scandir(path) as entries:
                names = {entry.name for entry in entries}
            if not {STATE_FILE, WORK_DIR} <= names or not names <= {
                STATE_FILE,
                WORK_DIR,
                *KEPT_FILES,
            }:
                return False
            # The output files are 0600; the wrapper's shell makes the exit status 0644.
            made += tuple(
                (os.path.join(path, name), stat.S_IFREG, (0o600, 0o644), True)
                for name in sorted(names & set(KEPT_FILES))
            )
            for p, kind, mode, ours in made:
                st = os.lstat(p)
                if (
                    stat.S_IFMT(st.st_mode) != kind
                    or stat.S_IMODE(st.st_mode)
                    not in (mode if isinstance(mode, tuple) else (mode,))
                    or (ours and (st.st_uid != self._uid or st.st_gid != self._gid))
                    or (kind == stat.S_IFREG and st.st_nlink != 1)
                ):  # the file has no other name
                    return False
            with os.scandir(work) as entries:
                if next(entries, None) is not None:
                    return False
        except OSError:
            return False
        return all(_xattrs(p) == self._born[kind] for p, kind, _, _ in made)
