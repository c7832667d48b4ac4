"""Host ports for instances: one host port per declared port, never one host port for two instances.

The table lives in ``<state_dir>/ports.json`` ({instance id: {declared port: host port}}), so that
an agent restart, a restart of the process or a resume of the instance keeps its ports; an
instance's ports are freed only with its volume (fleetd's `delete_volumes`). A port of the range
that something on the host already listens on is passed over, and so is a kept port that is
taken when its instance starts again (it gets another one, which the start report names).

Whether a host port serves its instance is read from the sockets that listen on it
(`port_states`): a process of another instance or user that binds a port while its instance is
between runs, or on an address the instance does not bind, must not get that instance's URL.
"""

import errno
import json
import logging
import os
import socket
import threading

from agent.procfs import socket_inodes, tcp_listeners
from agent.state import write_private

log = logging.getLogger("agent.ports")

PORTS_FILE = "ports.json"


class NoFreePort(Exception):
    """Every port of the range is taken; the message says which range."""


def listening(port):
    """True when something on this host listens on TCP `port` (an IPv4 or IPv6 bind of it fails)."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):  # nosec B104  # a probe: bound and closed at once, to learn whether the port is free on any address
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no listener
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


class PortAllocator:
    """The host ports of every instance on this host, kept in ports.json."""

    def __init__(self, state_dir, low=40000, high=41000, in_use=listening):
        self.path = os.path.join(state_dir, PORTS_FILE)
        self.low, self.high = low, high
        self.in_use = in_use
        self._lock = threading.Lock()
        self._table = self._load()

    def _load(self):
        try:
            with open(self.path) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("%s cannot be read (%s): instances get new host ports", self.path, exc)
            return {}
        table = {}
        for instance_id, ports in data.items() if isinstance(data, dict) else ():
            if isinstance(ports, dict):
                table[instance_id] = {
                    str(p): hp
                    for p, hp in ports.items()
                    if str(p).isdigit() and isinstance(hp, int) and 1 <= hp <= 65535
                }
        return table

    def _save(self):
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        write_private(self.path, json.dumps(self._table, indent=1, sort_keys=True) + "\n")

    def get(self, instance_id):
        """{declared port: host port} kept for an instance ({} when none)."""
        with self._lock:
            return {int(p): hp for p, hp in self._table.get(instance_id, {}).items()}

    def allocate(self, instance_id, ports):
        """{declared port: host port} for each of `ports`, the kept ones where they are still free.

        NoFreePort when the range has no port left; ports the instance no longer declares are freed.
        """
        with self._lock:
            kept = self._table.get(instance_id, {})
            others = {
                hp
                for other, table in self._table.items()
                if other != instance_id
                for hp in table.values()
            }
            chosen: dict[int, int] = {}
            for port in ports:
                host_port = kept.get(str(port))
                if host_port is not None and not (
                    self.low <= host_port <= self.high
                    and host_port not in others
                    and host_port not in chosen.values()
                    and not self.in_use(host_port)
                ):
                    log.warning(
                        "instance %s: host port %d of port %d is taken or out of range now; "
                        "choosing another",
                        instance_id,
                        host_port,
                        port,
                    )
                    host_port = None
                if host_port is None:
                    host_port = self._pick(others | set(chosen.values()) | set(kept.values()))
                chosen[port] = host_port
            table = {str(p): hp for p, hp in chosen.items()}
            if table != kept:
                if table:
                    self._table[instance_id] = table
                else:
                    self._table.pop(instance_id, None)
                self._save()
            return chosen

    def _pick(self, excluded):
        for port in range(self.low, self.high + 1):
            if port not in excluded and not self.in_use(port):
                return port
        raise NoFreePort(f"no free host port left in ports.range {self.low}-{self.high}")

    def release(self, instance_id):
        """Free an instance's host ports (its volume was deleted)."""
        with self._lock:
            if self._table.pop(instance_id, None) is not None:
                self._save()


PORT_OK = "ok"
PORT_NOT_LISTENING = "not_listening"
PORT_TAKEN = "taken_by_other_process"


def port_states(host_ports, owner_pids, published=False):
    """{host port: state} of one instance's host ports, from the sockets that listen on them now.

    "ok": something listens and every listener is held by one of `owner_pids` (the instance's
    processes, or its container runtime's forwarder for it), or nothing listens and the runtime
    `published` the port itself (forwarding in the kernel, e.g. nftables DNAT, has no listener);
    "not_listening": nothing listens (yet); "taken_by_other_process": another process listens on
    it, whose connections would reach that process rather than the instance.
    """
    listeners = tcp_listeners(host_ports)
    held = set()
    if any(listeners.values()):
        for pid in set(owner_pids):
            held |= socket_inodes(pid)
    states = {}
    for host_port, inodes in listeners.items():
        if not inodes:
            states[host_port] = PORT_OK if published else PORT_NOT_LISTENING
        else:
            states[host_port] = PORT_OK if inodes <= held else PORT_TAKEN
    return states
