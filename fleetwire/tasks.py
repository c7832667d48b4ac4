"""The agent's work on the wire, defined once (docs/api.md "Agent protocol"): the long poll for work
(Acquire, AcquireReply) and what a node reports of a task while it runs (TaskStarted,
TaskRestarting, RendezvousPublish, Rendezvous, LogBatch); finish reports are in fleetwire.finish.
Each side builds its own message as one of these and reads the other's with `from_wire` (ValueError
names the bad field); fleetd's API schemas check the values first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fleetwire.checks import is_int, is_number


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object")
    return data


def _epoch(data: dict[str, Any]) -> int:
    epoch = data.get("epoch")
    if not is_int(epoch) or epoch < 0:
        raise ValueError("epoch must be a non-negative integer")
    return epoch


def _ports(data: dict[str, Any]) -> tuple[dict[str, Any], ...] | None:
    ports = data.get("ports")
    if ports is None:
        return None
    if not isinstance(ports, list) or not all(isinstance(p, dict) for p in ports):
        raise ValueError("ports must be a list of {port, host_port, protocol?}")
    return tuple(dict(p) for p in ports)


@dataclasses.dataclass(frozen=True)
class Acquire:
    """The long poll for work: wait up to `wait_seconds` for assignments or stops."""

    wait_seconds: float = 30
    max_assignments: int | None = (
        None  # up to this many at once (`assignments`); None: one (`assignment`)
    )

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"wait_seconds": self.wait_seconds}
        if self.max_assignments is not None:
            out["max_assignments"] = self.max_assignments
        return out

    @classmethod
    def from_wire(cls, data: Any) -> Acquire:
        data = _object(data or {}, "an acquire")
        wait, most = data.get("wait_seconds", 30), data.get("max_assignments")
        if not is_number(wait) or wait < 0:
            raise ValueError("wait_seconds must be a non-negative number")
        if most is not None and (not is_int(most) or most < 1):
            raise ValueError("max_assignments must be a positive integer")
        return cls(wait_seconds=wait, max_assignments=most)


@dataclasses.dataclass(frozen=True)
class AcquireReply:
    """The answer to an acquire. Each assignment stays in its wire form here: the agent checks each
    one on its own (fleetwire.assignment.Assignment.from_wire) and refuses only a bad one."""

    assignments: tuple[dict[str, Any], ...] = ()
    cancel: tuple[str, ...] = ()  # tasks whose processes the node must stop now
    batched: bool = False  # the acquire asked for several: the answer carries `assignments`
    # tasks whose output a reader waits for: seal the open chunk and upload it now
    flush_output: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "assignment": self.assignments[0] if self.assignments else None,
            "cancel": list(self.cancel),
        }
        if self.batched:
            out["assignments"] = list(self.assignments)
        if self.flush_output:  # sent only then: an older agent never sees it
            out["flush_output"] = list(self.flush_output)
        return out

    @classmethod
    def from_wire(cls, data: Any) -> AcquireReply:
        data = _object(data or {}, "an acquire's answer")
        cancel, flush = data.get("cancel") or [], data.get("flush_output") or []
        if not isinstance(cancel, list):
            raise ValueError("cancel must be a list of task ids")
        if not isinstance(flush, list):
            raise ValueError("flush_output must be a list of task ids")
        stops = tuple(c for c in cancel if isinstance(c, str))
        flushes = tuple(f for f in flush if isinstance(f, str))
        if "assignments" in data:
            found = data["assignments"] or []
            if not isinstance(found, list):
                raise ValueError("assignments must be a list")
            return cls(tuple(found), stops, batched=True, flush_output=flushes)
        one = data.get("assignment")
        return cls(() if not one else (one,), stops, flush_output=flushes)


@dataclasses.dataclass(frozen=True)
class TaskStarted:
    """The task's process runs."""

    epoch: int
    pid: int | None = None
    ports: tuple[dict[str, Any], ...] | None = (
        None  # an instance's run: its host port for each declared port
    )
    restarts: int = (
        0  # an instance's run: restarts by its policy so far (each restart is reported again)
    )
    started_seconds_ago: float | None = None  # how long before this report the process started

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch}
        if self.pid is not None:
            out["pid"] = self.pid
        if self.started_seconds_ago is not None:
            out["started_seconds_ago"] = round(self.started_seconds_ago, 6)
        if self.ports is not None:
            out["ports"] = [dict(p) for p in self.ports]
        if self.restarts:
            out["restarts"] = self.restarts
        return out

    @classmethod
    def from_wire(cls, data: Any) -> TaskStarted:
        data = _object(data, "a start report")
        pid, restarts = data.get("pid"), data.get("restarts", 0)
        if pid is not None and (not is_int(pid) or pid < 1):
            raise ValueError("pid must be a positive integer or null")
        if not is_int(restarts) or restarts < 0:
            raise ValueError("restarts must be a non-negative integer")
        ago = data.get("started_seconds_ago")
        if ago is not None and (
            not isinstance(ago, (int, float)) or isinstance(ago, bool) or ago < 0
        ):
            raise ValueError("started_seconds_ago must be a non-negative number or null")
        return cls(
            epoch=_epoch(data),
            pid=pid,
            ports=_ports(data),
            restarts=restarts,
            started_seconds_ago=None if ago is None else float(ago),
        )


@dataclasses.dataclass(frozen=True)
class TaskRestarting:
    """An instance run's process ended; its restart policy starts it again after
    `backoff_seconds`."""

    epoch: int
    backoff_seconds: float
    exit_code: int | None = None
    signal: str | None = None  # the signal that ended it (SIGKILL), if one did
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "backoff_seconds": self.backoff_seconds,
        }

    @classmethod
    def from_wire(cls, data: Any) -> TaskRestarting:
        data = _object(data, "a restart report")
        backoff, exit_code, signal = (
            data.get("backoff_seconds"),
            data.get("exit_code"),
            data.get("signal"),
        )
        if not is_number(backoff) or backoff < 0:
            raise ValueError("backoff_seconds must be a non-negative number")
        if exit_code is not None and not is_int(exit_code):
            raise ValueError("exit_code must be an integer or null")
        if signal is not None and not isinstance(signal, str):
            raise ValueError("signal must be a string or null")
        reason = data.get("reason") or ""
        if not isinstance(reason, str):
            raise ValueError("reason must be a string")
        return cls(
            epoch=_epoch(data),
            backoff_seconds=backoff,
            exit_code=exit_code,
            signal=signal,
            reason=reason,
        )


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """Where rank 0 of a gang listens (its address and port): what the other ranks connect to."""

    addr: str
    port: int

    def to_wire(self) -> dict[str, Any]:
        return {"addr": self.addr, "port": self.port}

    @classmethod
    def from_wire(cls, data: Any) -> Rendezvous:
        data = _object(data, "a rendezvous")
        addr, port = data.get("addr"), data.get("port")
        if not isinstance(addr, str) or not addr:
            raise ValueError("addr must be a non-empty string")
        if not is_int(port) or not 1 <= port <= 65535:
            raise ValueError("port must be an integer from 1 to 65535")
        return cls(addr=addr, port=port)


@dataclasses.dataclass(frozen=True)
class RendezvousPublish:
    """Rank 0 publishes its rendezvous for its epoch."""

    epoch: int
    addr: str
    port: int

    def to_wire(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "addr": self.addr, "port": self.port}

    @classmethod
    def from_wire(cls, data: Any) -> RendezvousPublish:
        point = Rendezvous.from_wire(data)
        return cls(epoch=_epoch(data), addr=point.addr, port=point.port)


@dataclasses.dataclass(frozen=True)
class LogBatch:
    """Output lines of a task: (stream, text) or (stream, text, rank); stream is stdout, stderr or
    system."""

    epoch: int
    lines: tuple[
        Any, ...
    ]  # each [stream, text] or [stream, text, rank] as it came (a list or a tuple)

    def to_wire(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "lines": list(self.lines)}  # JSON writes a tuple as an array

    @classmethod
    def from_wire(cls, data: Any) -> LogBatch:
        data = _object(data, "a log batch")
        lines = data.get("lines")
        if not isinstance(lines, list) or not all(
            isinstance(line, (list, tuple)) and len(line) in (2, 3) for line in lines
        ):
            raise ValueError("lines must be [[stream, text] or [stream, text, rank], ...]")
        return cls(epoch=_epoch(data), lines=tuple(lines))


@dataclasses.dataclass(frozen=True)
class ValidationReport:
    """A node's results of a validation fleetd gave it: each check, for the node or one GPU, and
    what the agent read of the system (driver and CUDA versions)."""

    checks: tuple[dict[str, Any], ...]
    system: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"checks": [dict(check) for check in self.checks], "system": dict(self.system)}

    @classmethod
    def from_wire(cls, data: Any) -> ValidationReport:
        data = _object(data, "a validation report")
        checks, system = data.get("checks"), data.get("system") or {}
        if (
            not isinstance(checks, list)
            or not checks
            or not all(isinstance(c, dict) for c in checks)
        ):
            raise ValueError("checks must be a non-empty list of objects")
        if not isinstance(system, dict):
            raise ValueError("system must be an object")
        return cls(checks=tuple(dict(c) for c in checks), system=dict(system))
