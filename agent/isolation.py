"""Who a task runs as on this host, and the walls around it.

fleetd says in each Assignment whom a task runs as (`run_as`): its owner's own host user
(`unix_user`, resolved here, where the user must exist, as Slurm needs), a uid fleetd allocated
to its owner (`dynamic`, the same on every node, so a gang's ranks and a resumed volume agree),
or root (`root`, only where the fleet allows it and an admin submitted the work). The agent
never runs a task as root unless fleetd said `root`; an assignment without `run_as` (from a
fleetd older than it) runs as `nobody`.

The switch is made by `setpriv` (util-linux) after the task was put in its cgroup, by the
root-owned shell that records an instance's exit status: supplementary groups cleared (or the
user's own, for a host user), `no_new_privs` set, and nothing inherited but stdin from
/dev/null and the output descriptors. Only an agent running as root can switch users; one that
does not (a developer's laptop) runs tasks as itself, says `isolation: none` in its node
capabilities and logs why once.

The walls are file modes: the state dir, the task directories and the volumes' directory are
0711 (passable, never listable), the agent's tokens and journals 0600 root, and a task's work
directory and its instance's volume belong to the task's uid, 0700.
"""

import dataclasses
import grp
import logging
import os
import pwd
import shutil
import stat
import time

from agent.task.errors import TaskError
from fleetwire.assignment import system_uid_problem
from fleetwire.heartbeat import MAX_ACCOUNTS

log = logging.getLogger("agent.isolation")

SETPRIV_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
FALLBACK_USER = "nobody"  # for an assignment that names nobody to run as (an older fleetd)
MIN_TASK_UID = 1000  # a dynamic uid below this is a system account's range: refused
MAX_HOST_UIDS = 4096  # host users listed to fleetd, so that its allocator skips their uids
PASSABLE = 0o711  # a directory a task passes through and cannot list
HOST_UIDS_SECONDS = 300.0  # how often the host's users are listed again
ACCOUNTS_SECONDS = 600.0  # how often an account looked up is looked up again (it may have gone)
ACCOUNTS_PER_CALL = 200  # lookups done at most per heartbeat


@dataclasses.dataclass(frozen=True)
class RunAs:
    """Whom one task runs as here."""

    uid: int
    gid: int
    user: str | None
    source: str  # unix_user, dynamic, root, fallback, or agent (this host cannot switch users)
    home: str | None = None
    host_groups: bool = False  # a host user's supplementary groups (initgroups), else none
    groups: tuple[int, ...] = ()  # supplementary groups given by fleetd (run_as claims)

    def describe(self):
        """The `run_as` of the local API's worker record."""
        return {"uid": self.uid, "gid": self.gid, "user": self.user, "source": self.source}


class Isolation:
    """Whether this agent can switch users, and how a task is started as its user."""

    def __init__(self, euid=None, setpriv=None):
        self.euid = os.geteuid() if euid is None else euid
        self.setpriv = (
            setpriv if setpriv is not None else shutil.which("setpriv", path=SETPRIV_PATH)
        )
        self.reason = ""
        if self.euid != 0:
            self.reason = (
                f"fleet-agent runs as uid {self.euid}, not root: it cannot switch users, so tasks "
                f"run as uid {self.euid}"
            )
        elif not self.setpriv:
            self.reason = (
                "setpriv (util-linux) is not installed: tasks cannot be started as another user"
            )
        self.mode = "none" if self.reason else "uid"
        self._host_uids: tuple[float | None, list[int]] = (
            None,
            [],
        )  # (monotonic time listed, uids)
        if self.reason:
            log.warning("isolation: none: %s", self.reason)
        # login -> (monotonic time looked up, [uid, gid] or None): owners' own accounts as this
        # host's user database (NSS: local users, LDAP, SSSD) resolves them, for fleetd's placement
        # of an nss fleet's work
        self._accounts: dict[str, tuple[float, list[int] | None]] = {}

    @property
    def enabled(self):
        """True when tasks run as their own uid."""
        return self.mode == "uid"

    def capabilities(self):
        """The node capabilities this module reports: isolation, why not, the host's users' uids,
        and the owners' accounts fleetd asked about (login: [uid, gid], or null where it does not
        resolve)."""
        listed, uids = self._host_uids
        if listed is None or time.monotonic() - listed >= HOST_UIDS_SECONDS:
            uids = host_uids()
            self._host_uids = (time.monotonic(), uids)
        caps: dict[str, object] = {"isolation": self.mode, "host_uids": uids}
        if self.reason:
            caps["isolation_reason"] = self.reason
        if self._accounts:
            self._look_up_again()
            caps["accounts"] = {login: found for login, (_, found) in self._accounts.items()}
        return caps

    def look_up(self, logins):
        """Resolve these logins (fleetd asks for those with work queued for this node's nss fleet):
        the next capabilities report them."""
        now = time.monotonic()
        for login in list(logins)[:ACCOUNTS_PER_CALL]:
            if login in self._accounts or len(self._accounts) < MAX_ACCOUNTS:
                self._accounts[login] = (now, account(login))

    def _look_up_again(self):
        now = time.monotonic()
        stale = [
            login
            for login, (looked, _) in self._accounts.items()
            if now - looked >= ACCOUNTS_SECONDS
        ]
        for login in stale[:ACCOUNTS_PER_CALL]:
            self._accounts[login] = (now, account(login))

    def resolve(self, run_as):
        """The RunAs for an assignment's `run_as` (None: the fallback user); TaskError when it
        cannot be met."""
        if not self.enabled:
            try:
                entry = pwd.getpwuid(self.euid)
                user, home = entry.pw_name, entry.pw_dir
            except KeyError:
                user, home = None, None
            return RunAs(self.euid, os.getegid(), user, "agent", home)
        if run_as is None:
            return _host_user(FALLBACK_USER, "fallback")
        source = run_as.get("source")
        if source == "root":
            return RunAs(0, 0, "root", "root", "/root")
        if source == "unix_user":
            return _host_user(run_as.get("user"), "unix_user")
        if source == "nss":
            found = _host_user(run_as.get("user"), "nss")
            problem = system_uid_problem(found.user, found.uid)
            if problem:
                raise TaskError(problem)
            return found
        if source == "claims":
            return _claimed(run_as)
        if source == "dynamic":
            return _dynamic(run_as.get("uid"), run_as.get("gid"))
        raise TaskError(
            f"run_as.source {source!r} is not one of unix_user, nss, claims, dynamic, root"
        )

    def wrap(self, run_as, argv):
        """`argv` started as `run_as` with no_new_privs (unchanged where this host cannot switch
        users)."""
        if not self.enabled:
            return list(argv)
        if run_as.uid == 0:
            return [self.setpriv, "--no-new-privs", "--", *argv]
        if run_as.host_groups:
            groups = "--init-groups"
        elif run_as.groups:
            groups = "--groups=" + ",".join(str(g) for g in run_as.groups)
        else:
            groups = "--clear-groups"
        return [
            self.setpriv,
            f"--reuid={run_as.uid}",
            f"--regid={run_as.gid}",
            groups,
            "--no-new-privs",
            "--inh-caps=-all",
            "--",
            *argv,
        ]

    def env(self, run_as, env, home):
        """`env` with HOME, USER and LOGNAME of `run_as` (HOME: its own, else `home`, the task's
        directory)."""
        if not self.enabled:
            return env
        env["HOME"] = run_as.home if run_as.home and run_as.source != "dynamic" else home
        for name in ("USER", "LOGNAME"):
            if run_as.user:
                env[name] = run_as.user
            else:
                env.pop(name, None)
        return env

    def own(self, run_as, path):
        """Give `path` (a directory the agent made for the task) to the task's user."""
        if self.enabled:
            os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)

    def own_below(self, run_as, root, path):
        """Give `path` and every directory between `root` (exclusive) and it to the task's user."""
        if not self.enabled:
            return
        root = os.path.normpath(root)
        current = os.path.normpath(path)
        for _ in range(4096):
            if current == root or not current.startswith(root + os.sep):
                return
            os.chown(current, run_as.uid, run_as.gid, follow_symlinks=False)
            current = os.path.dirname(current)

    def passable(self, path):
        """Make a directory of the agent's one that tasks pass through: 0711 where users are
        switched."""
        os.chmod(path, PASSABLE if self.enabled else 0o700)

    def check_reachable(self, run_as, path):
        """TaskError naming the directory on the way to `path` (the state dir) that `run_as` cannot
        pass, where users are switched: the task could not enter its own directory ("Permission
        denied")."""
        if not self.enabled or run_as.uid == 0:
            return
        groups = {run_as.gid, *run_as.groups}
        if run_as.host_groups and run_as.user:
            try:
                groups.update(os.getgrouplist(run_as.user, run_as.gid))
            except OSError:
                pass
        blocked = blocked_directory(path, run_as.uid, groups)
        if blocked is not None:
            directory, mode = blocked
            raise TaskError(
                f"the task's uid {run_as.uid} cannot pass {directory} (mode {mode:04o}) on the way "
                f"to the agent's state dir {path}: make it passable (chmod o+x {directory}) or "
                "move state_dir"
            )


def blocked_directory(path, uid=None, gids=()):
    """(directory, mode) of the first directory from / down to `path` (as far as it exists) that
    `uid` (None: a uid that owns none of them and is in none of their groups) cannot pass, or
    None."""
    current = "/"
    for part in [p for p in os.path.realpath(path).split("/") if p]:
        current = os.path.join(current, part)
        try:
            info = os.stat(current)
        except FileNotFoundError:
            return None
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            return None
        if info.st_uid == uid:
            bit = stat.S_IXUSR
        elif info.st_gid in gids:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return current, stat.S_IMODE(info.st_mode)
    return None


def _host_user(name, source):
    if not isinstance(name, str) or not name:
        raise TaskError("run_as names no host user")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise TaskError(
            f"host user {name!r} does not exist on this node (the token's unix_user must be a user "
            "on every node that runs its tasks)"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise TaskError(
            f"host user {name!r} has uid or gid 0: tasks never run as root through unix_user"
        )
    return RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name, source, entry.pw_dir, host_groups=True)


def account(login):
    """[uid, gid] of the host user `login` as NSS resolves it, or None (unknown, or a system account
    a task never runs as)."""
    try:
        entry = pwd.getpwnam(login)
    except (KeyError, ValueError):
        return None
    if entry.pw_gid == 0 or system_uid_problem(entry.pw_name, entry.pw_uid):
        return None
    return [entry.pw_uid, entry.pw_gid]


def _claimed(run_as):
    """The RunAs of uid, gid and groups an identity provider's claims gave the owner (run_as
    claims): an account of the directory this node need not know, never a system account's ids."""
    uid, gid, groups = run_as.get("uid"), run_as.get("gid"), run_as.get("groups") or []
    for name, number in [("uid", uid), ("gid", gid)] + [("groups", g) for g in groups]:
        if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 2**31 - 1:
            raise TaskError(f"run_as.{name} {number!r} is not a positive id")
    if uid < MIN_TASK_UID:
        raise TaskError(f"run_as.uid {uid} is a system account's (below {MIN_TASK_UID})")
    return RunAs(uid, gid, run_as.get("user"), "claims", groups=tuple(groups))


def _dynamic(uid, gid):
    if not isinstance(uid, int) or isinstance(uid, bool) or uid < MIN_TASK_UID or uid >= 2**31 - 1:
        raise TaskError(f"run_as.uid {uid!r} is not a task uid (at least {MIN_TASK_UID})")
    gid = uid if gid is None else gid
    if not isinstance(gid, int) or isinstance(gid, bool) or gid < MIN_TASK_UID or gid >= 2**31 - 1:
        raise TaskError(f"run_as.gid {gid!r} is not a task gid (at least {MIN_TASK_UID})")
    user, group = _name_of(pwd.getpwuid, uid), _name_of(grp.getgrgid, gid)
    if user is not None:
        raise TaskError(
            f"uid {uid} belongs to host user {user!r} on this node: fleetd's task uid range "
            "overlaps the host's users"
        )
    if group is not None:
        raise TaskError(
            f"gid {gid} belongs to host group {group!r} on this node: fleetd's task uid range "
            "overlaps the host's groups"
        )
    return RunAs(uid, gid, None, "dynamic")


def _name_of(lookup, number):
    try:
        return lookup(number)[0]
    except KeyError:
        return None


def host_uids():
    """The uids (>= 1000) of this host's users, at most MAX_HOST_UIDS of them, sorted."""
    try:
        uids = sorted({entry.pw_uid for entry in pwd.getpwall() if entry.pw_uid >= MIN_TASK_UID})
    except OSError:
        return []
    return uids[:MAX_HOST_UIDS]
