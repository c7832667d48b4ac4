"""Owners' own accounts on the nodes of fleets that run tasks as them (`task_identity: nss`).

fleetd cannot list a lab's directory (LDAP, SSSD) from where it runs, and a node resolves only
what it is asked: so each heartbeat of a node of such a fleet asks it to look up the logins of
owners with queued work that it has not reported yet (`lookup_accounts`), and the node reports
each as `[uid, gid]`, or null where it does not resolve, in its capabilities (`accounts`), which
it looks up again every ten minutes. Capabilities are part of the inventory: a node of such a fleet
takes only the work of owners whose account it resolved (scheduler stage `identity`), and a new
answer brings the queued work back to placement at once.

What is read per heartbeat is held in memory for a few seconds per replica: which fleets run tasks
as their owners' accounts, and the logins of owners with queued work.
"""

import threading
import time

from fleetd.models import Fleet, Job, JobState

READ_SECONDS = 5.0  # how long the fleets and the queued owners' logins read are used
MAX_WANTED = 1000  # queued owners' logins read at once (the rest: once those are placed)
MAX_LOOKUPS = 100  # logins one heartbeat answer asks a node to look up
NSS = "nss"


class Accounts:
    """The fleets whose tasks run as their owners' own accounts, and the logins of owners with
    queued work, each read at most every READ_SECONDS (one per Runtime: rt.accounts)."""

    def __init__(self, monotonic=time.monotonic):
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._fleets: tuple[float | None, frozenset[str]] = (None, frozenset())
        self._wanted: tuple[float | None, tuple[str, ...]] = (None, ())

    def nss_fleets(self):
        read, fleets = self._fleets
        now = self.monotonic()
        if read is None or now - read >= READ_SECONDS:
            query = Fleet.select(Fleet.name).where(Fleet.task_identity == NSS)
            fleets = frozenset(row.name for row in query)
            with self._lock:
                self._fleets = (now, fleets)
        return fleets

    def any(self):
        """True while some fleet runs tasks as their owners' own accounts."""
        return bool(self.nss_fleets())

    def forget(self):
        """Read the fleets again at the next use (a fleet's task_identity changed here)."""
        with self._lock:
            self._fleets = (None, frozenset())

    def wanted(self):
        """Logins of owners with queued work (at most MAX_WANTED)."""
        read, logins = self._wanted
        now = self.monotonic()
        if read is None or now - read >= READ_SECONDS:
            query = (
                Job.select(Job.user)
                .where((Job.state == JobState.QUEUED.value) & Job.user.is_null(False))
                .distinct()
                .limit(MAX_WANTED)
            )
            logins = tuple(row.user for row in query if row.user)
            with self._lock:
                self._wanted = (now, logins)
        return logins

    def lookups_for(self, node):
        """The logins this node of an nss fleet is asked to look up (none for other fleets)."""
        if node.fleet_id not in self.nss_fleets():
            return ()
        known = (node.capabilities or {}).get("accounts") or {}
        return tuple(login for login in self.wanted() if login not in known)[:MAX_LOOKUPS]


def resolved(node, fleet):
    """The logins whose accounts resolve on this node, when its fleet runs tasks as their owners'
    accounts (None: any owner's work may run there)."""
    if fleet is None or fleet.task_identity != NSS:
        return None
    known = (node.capabilities or {}).get("accounts") or {}
    return frozenset(login for login, found in known.items() if found)
