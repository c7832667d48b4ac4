"""Who a task runs as on its node (its `run_as`): the owner's unix_user, root (admins' work in a
fleet that allows it) or a uid fleetd allocates to the owner once, from the configured range.

An owner is a user (or a service account's token), by id. What decides its run_as is read once: a
token's role and unix_user are fixed when it is made; a user's change only through the users
service, which calls `forget(owner)` on every replica's next read (the Identities entry is dropped
where the change is made; others keep the old run_as for work they place until they restart, and a
role change only ever matters for root, which a fleet must allow); an allocated uid is never given
back or reused. So all of it is kept in memory once read (the `Identities` of the Runtime), and a
scheduling pass that places thousands of tasks reads nothing for them but what it already holds.
"""

import pwd
import threading

import peewee

from fleetd.credentials import ADMIN
from fleetd.db import write_transaction
from fleetd.models import ApiToken, Node, OwnerUid, User
from fleetwire.assignment import system_uid_problem

UNIX_USER, ROOT, DYNAMIC, NSS, CLAIMS = "unix_user", "root", "dynamic", "nss", "claims"
_ALLOCATION_TRIES = 5  # another replica may take the uid this one chose: choose again


class UidsExhausted(Exception):
    """Every uid of the configured range is allocated (or a host user's)."""


def run_as_unix_user(name, allow_system_user=False):
    """A unix_user's run_as; `allow_system_user` (sent only when true) tells the node that the
    operator allowed this user although it is a system account
    (settings.tokens_allow_system_users)."""
    run_as = {"source": UNIX_USER, "user": name, "uid": None, "gid": None}
    if allow_system_user:
        run_as["allow_system_user"] = True
    return run_as


def unix_user_problem(name, allowed_system_users):
    """Why a token may not take host user `name` as its unix_user, or None: a system account (below
    uid 1000, or nobody) that the operator did not allow, as this fleetd host's user database reads
    it. A name unknown here is the nodes' to resolve; each node refuses a system account again at
    launch, by its own database (fleetwire.assignment.system_uid_problem)."""
    if name in allowed_system_users:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        return f"host user {name!r} has uid or gid 0: tasks never run as root through a token"
    return system_uid_problem(name, entry.pw_uid)


RUN_AS_ROOT = {"source": ROOT, "user": "root", "uid": 0, "gid": 0}


def run_as_uid(uid):
    return {"source": DYNAMIC, "user": None, "uid": uid, "gid": uid}


class Identities:
    """Tokens' role and unix_user, and owners' allocated uids, read (or allocated) once."""

    def __init__(self, uids, allowed_system_users=frozenset()):
        self.uids = uids  # the range owners' uids come from (settings.task_uids)
        self.allowed_system_users = allowed_system_users  # settings.allowed_system_users
        self._tokens = {}  # owner id -> (role or None, unix_user or None, posix or None)
        self._owner_uids = {}  # token id -> uid
        self._lock = threading.Lock()

    def run_as(self, owner, allows_root, now, identity=DYNAMIC, login=None):
        """The run_as of a task of this owner (a user's or a service account's id) on a node of a
        fleet; `allows_root()` says whether that fleet allows root tasks (asked only for an admin's
        work); `identity`: the fleet's task_identity, with the owner's `login` (nss: its own
        account, as the node resolves it; claims: the uid, gid and groups of its provider's
        claims, where it has them). UidsExhausted when it needs a uid and none is left. A first
        need allocates (at `now`), in a transaction of its own or of the caller's."""
        role, unix_user, posix = self._token(owner)
        if unix_user:
            return run_as_unix_user(unix_user, unix_user in self.allowed_system_users)
        if role == ADMIN and allows_root():
            return dict(RUN_AS_ROOT)
        if identity == NSS and login:
            return {"source": NSS, "user": login, "uid": None, "gid": None}
        if identity == CLAIMS and posix:
            return {
                "source": CLAIMS,
                "user": login,
                "uid": posix["uid"],
                "gid": posix["gid"],
                "groups": list(posix.get("groups") or ()),
            }
        return run_as_uid(self.uid(owner, now))

    def _token(self, owner):
        found = self._tokens.get(owner)
        if found is None:
            user = (
                User.select(User.role, User.unix_user, User.posix).where(User.id == owner).first()
            )
            if user is not None:
                found = (user.role, user.unix_user, user.posix)
            else:  # a service account (a token without a user)
                row = (
                    ApiToken.select(ApiToken.role, ApiToken.unix_user)
                    .where(ApiToken.id == owner)
                    .first()
                )
                # A token deleted after its expiry: its work runs as its uid, never as root.
                found = (row.role, row.unix_user, None) if row is not None else (None, None, None)
            with self._lock:
                self._tokens[owner] = found
        return found

    def forget(self, owner):
        """Read this owner's role and unix_user again at its next placement (an admin changed
        them)."""
        with self._lock:
            self._tokens.pop(owner, None)

    def uid(self, owner, now):
        """The owner's uid: the one allocated before, else a new one (the lowest free uid of the
        range that no node lists among its host users)."""
        uid = self._owner_uids.get(owner)
        if uid is not None:
            return uid
        for _ in range(_ALLOCATION_TRIES):
            try:
                with write_transaction():
                    row = OwnerUid.get_or_none_by_id(owner)
                    if row is None:
                        row = OwnerUid.create(
                            token_id=owner, uid=self._free_uid(), allocated_at=now
                        )
            except peewee.IntegrityError:
                # Another writer took that uid (or allocated this owner's) first: look again.
                continue
            with self._lock:
                self._owner_uids[owner] = row.uid
            return row.uid
        raise UidsExhausted(
            f"could not allocate a uid for owner {owner} in {_ALLOCATION_TRIES} tries"
        )

    def _free_uid(self):
        taken = {
            uid
            for (uid,) in OwnerUid.select(OwnerUid.uid)
            .where((OwnerUid.uid >= self.uids.start) & (OwnerUid.uid < self.uids.stop))
            .tuples()
            .execute()
        }
        for (capabilities,) in (
            Node.select(Node.capabilities)
            .where(Node.capabilities.is_null(False))
            .tuples()
            .execute()
        ):
            taken.update((capabilities or {}).get("host_uids") or ())
        for uid in self.uids:
            if uid not in taken:
                return uid
        raise UidsExhausted(
            f"every uid of task_uid_range {self.uids.start}-{self.uids.stop - 1} is allocated to "
            f"an owner or belongs to a host user"
        )
