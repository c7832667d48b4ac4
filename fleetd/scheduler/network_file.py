"""A network topology file in Slurm's forms, read into each host's place in the network.

Two forms, as Slurm's topology.conf writes them (one form per file):

- tree (`topology/tree`): `SwitchName=s1 Nodes=gpu[001-016]` for a leaf switch and
  `SwitchName=agg1 Switches=s[1-4]` for a switch above others. A host's leaf is the switch that
  lists it; its spine is the top of its tree (the switch no other lists), when that is not the
  leaf itself; its block is the leaf's parent below the spine in a tree of three or more levels,
  else the leaf (in a two-level tree the nodes under one leaf are the ones that talk fastest).
- block (`topology/block`): `BlockName=b1 Nodes=gpu[001-018]`: the block, no leaf or spine.
  `BlockSizes=` is accepted and ignored (fleetd places whole gangs, not Slurm's sub-blocks).

Hostnames take Slurm's bracket ranges (`gpu[001-016]`, `n[1-3,7]`, `r[1-2]-n[01-04]`) and
comma-separated lists. `#` starts a comment; other attributes (`LinkSpeed=`) are ignored. A wrong
line raises `TopologyFileError` naming the line. Pure: no I/O.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from fleetd.scheduler.model import NetworkPlace

MAX_HOSTS = 200_000  # hosts one file may name (ranges expanded): a typo must not eat the memory
MAX_LINES = 100_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TREE_KEYS = {"switchname", "switches", "nodes", "linkspeed"}
_BLOCK_KEYS = {"blockname", "nodes"}


class TopologyFileError(ValueError):
    """A topology file that cannot be read: the line number (1-based; 0 for the whole file), the
    line itself and what is wrong with it."""

    def __init__(self, line_no: int, line: str, problem: str):
        where = f"line {line_no}: {line.strip()!r}: " if line_no else ""
        super().__init__(where + problem)
        self.line_no = line_no
        self.line = line
        self.problem = problem


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list (`gpu[001-003],cpu1`) as the hostnames it names, in order; ValueError when
    it is malformed or names more than MAX_HOSTS."""
    out: list[str] = []
    for item in _split_top(text):
        if not item:
            raise ValueError("an empty host name in the list")
        parts = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        total = 1
        for part in parts:
            if part.startswith("["):
                values = _expand_brackets(part[1:-1])
                total *= len(values)
                choices.append(values)
            elif part:
                if "[" in part or "]" in part:
                    raise ValueError(f"unbalanced brackets in {item!r}")
                choices.append([part])
            if total + len(out) > MAX_HOSTS:
                raise ValueError(f"names more than {MAX_HOSTS} hosts")
        for combo in itertools.product(*choices):
            name = "".join(combo)
            if not _NAME.match(name):
                raise ValueError(f"{name!r} is not a host name")
            out.append(name)
    return out


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    items.append(text[start:])
    return items


def _expand_brackets(inner: str) -> list[str]:
    values: list[str] = []
    for piece in inner.split(","):
        m = _RANGE.match(piece.strip())
        if m is None:
            raise ValueError(f"[{inner}] is not a list of numbers and ranges")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"range {piece} runs backwards")
        if int(hi) - int(lo) + 1 > MAX_HOSTS:
            raise ValueError(f"names more than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        values.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return values


def _fields(line_no: int, line: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if not sep or not key or not value:
            raise TopologyFileError(line_no, line, f"{token!r} is not Key=Value")
        key = key.lower()
        if key in out:
            raise TopologyFileError(line_no, line, f"{key} given twice")
        out[key] = value
    return out


def parse_topology(text: str) -> dict[str, NetworkPlace]:
    """{hostname: its NetworkPlace} from a topology file's text; TopologyFileError on a wrong
    line."""
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise TopologyFileError(0, "", f"more than {MAX_LINES} lines")
    switches: dict[str, tuple[int, str, list[str], list[str]]] = {}  # name -> line, children, hosts
    blocks: dict[str, list[str]] = {}
    form = None
    hosts_seen: dict[str, int] = {}
    total = 0
    for line_no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = _fields(line_no, line)
        if "blocksizes" in fields and len(fields) == 1:
            continue
        kind = "tree" if "switchname" in fields else "block" if "blockname" in fields else None
        if kind is None:
            raise TopologyFileError(line_no, raw, "expected SwitchName=... or BlockName=...")
        if form is not None and kind != form:
            raise TopologyFileError(
                line_no,
                raw,
                "a file is either the tree form (SwitchName=) or the block form "
                "(BlockName=), not both",
            )
        form = kind
        unknown = set(fields) - (_TREE_KEYS if kind == "tree" else _BLOCK_KEYS)
        if unknown:
            raise TopologyFileError(line_no, raw, f"unknown key(s) {', '.join(sorted(unknown))}")
        name = fields["switchname" if kind == "tree" else "blockname"]
        if not _NAME.match(name):
            raise TopologyFileError(line_no, raw, f"{name!r} is not a switch or block name")
        if name in switches or name in blocks:
            raise TopologyFileError(line_no, raw, f"{name} is defined twice")
        try:
            hosts = expand_hostlist(fields["nodes"]) if "nodes" in fields else []
            children = expand_hostlist(fields["switches"]) if "switches" in fields else []
        except ValueError as exc:
            raise TopologyFileError(line_no, raw, str(exc)) from None
        total += len(hosts)
        if total > MAX_HOSTS:
            raise TopologyFileError(line_no, raw, f"the file names more than {MAX_HOSTS} hosts")
        for host in hosts:
            if host in hosts_seen:
                raise TopologyFileError(
                    line_no, raw, f"host {host} is already placed on line {hosts_seen[host]}"
                )
            hosts_seen[host] = line_no
        if kind == "block":
            if not hosts:
                raise TopologyFileError(line_no, raw, "a block needs Nodes=")
            blocks[name] = hosts
        else:
            if hosts and children:
                raise TopologyFileError(
                    line_no, raw, "a switch lists either Nodes= (a leaf) or Switches=, not both"
                )
            if not hosts and not children:
                raise TopologyFileError(line_no, raw, "a switch needs Nodes= or Switches=")
            switches[name] = (line_no, raw, children, hosts)
    if form == "block":
        return {host: NetworkPlace(block=name) for name, hosts in blocks.items() for host in hosts}
    return _tree_places(switches)


def _tree_places(
    switches: Mapping[str, tuple[int, str, list[str], list[str]]],
) -> dict[str, NetworkPlace]:
    parent: dict[str, str] = {}
    for name, (line_no, raw, children, _) in switches.items():
        for child in children:
            if child not in switches:
                raise TopologyFileError(line_no, raw, f"switch {child} is not defined")
            if child in parent:
                raise TopologyFileError(
                    line_no, raw, f"switch {child} is already under switch {parent[child]}"
                )
            if child == name:
                raise TopologyFileError(line_no, raw, f"switch {name} lists itself")
            parent[child] = name
    for name, (line_no, raw, _, _) in switches.items():
        seen, at = {name}, name
        while at in parent:
            at = parent[at]
            if at in seen:
                raise TopologyFileError(line_no, raw, f"switch {name} is in a loop of switches")
            seen.add(at)
    out: dict[str, NetworkPlace] = {}
    for leaf, (line_no, raw, _, hosts) in switches.items():
        if not hosts:
            continue
        path = [leaf]  # the leaf, then each switch above it (no loop: checked above)
        while path[-1] in parent:
            path.append(parent[path[-1]])
        spine = path[-1] if len(path) > 1 else None
        block = path[1] if len(path) > 2 else leaf
        for host in hosts:
            out[host] = NetworkPlace(block=block, leaf=leaf, spine=spine)
    return out


def place_of(
    hostname: str, labels: Mapping[str, str], file_places: Mapping[str, NetworkPlace] | None
) -> NetworkPlace | None:
    """A node's place: from its `topology.fleetd/block|leaf|spine` labels when it has any of them
    (labels win over the file, whole), else from the file by its hostname or its short name, else
    None."""
    labelled = NetworkPlace.from_labels(labels)
    if labelled is not None:
        return labelled
    if not file_places:
        return None
    found = file_places.get(hostname)
    if found is None and "." in hostname:
        found = file_places.get(hostname.split(".", 1)[0])
    return found
