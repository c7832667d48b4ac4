"""Where a gang's ranks go across the network: the fewest blocks, then the fewest leaves, then the
fewest spines (issue 50).

The engine lists every node that can take one rank of a gang, best first (its policy's score,
then the least busy, then snapshot order: the order in which it would place rank after rank), with
each node's `NetworkPlace`; `choose_nodes` picks the ones the gang takes. Pure and cheap: one pass
over the candidates to group them by block and leaf, then a sort of the groups.

- Blocks that can hold every rank: the one whose nodes span the fewest leaves wins, then the one
  with the fewest candidates (best fit: a block with more room stays whole for a larger gang), then
  the one whose k-th best node is best.
- Within a block, leaves are taken largest first, the last one the smallest that holds what is
  left (the fewest leaves, best fit); within a leaf, its best nodes.
- No block can hold it: with `same_block` required the gang waits (`NetworkMiss`); preferred, the
  fewest blocks the same way, within one spine when a spine can hold the gang with that few.

A node without a known place counts as a block of its own (its own leaf); a node with a leaf but
no block is in the leaf's block; one with a block but no leaf is in one leaf with the block's other
leafless nodes (nothing finer is known of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetd.scheduler.model import NetworkPlace

_NEVER = 1 << 30  # groups needed when the groups cannot hold the gang at all
_UNKNOWN = "\0"  # prefixes the block key of a node with no known place: a block of its own


@dataclass(frozen=True)
class GangPick:
    """The candidates a gang takes (indices into the candidate list, best first) and why."""

    picks: tuple[int, ...]
    blocks: tuple[str, ...]  # the known blocks it spans, in rank order
    note: str


@dataclass(frozen=True)
class NetworkMiss:
    """No block can hold the gang and it requires one: the largest room any block has."""

    best_block: str | None
    best_count: int
    counts: dict[str, int]  # block -> candidates in it (known blocks only)


def network_key(place: NetworkPlace | None, node_id: str) -> tuple[str, str | None, str | None]:
    """(the block a node counts in, its leaf, its spine), as `choose_nodes` takes them (see the
    module's docstring for the block of a node without a known place)."""
    if place is not None:
        block = place.block or place.leaf
        if block:
            return block, place.leaf, place.spine
    return _UNKNOWN + node_id, None, None


def _known(block: str) -> bool:
    return not block.startswith(_UNKNOWN)


def _take(groups: Sequence[Sequence[int]], k: int) -> list[tuple[int, int]]:
    """(group index, how many of its first members) covering k with the fewest groups: largest
    first, the last one the smallest that holds the rest; ties to the group with the better first
    member. The groups together hold at least k."""
    order = sorted(range(len(groups)), key=lambda g: (-len(groups[g]), groups[g][0]))
    out: list[tuple[int, int]] = []
    left = k
    for at, g in enumerate(order):
        if len(groups[g]) >= left:
            # the smallest group from here on that holds what is left (best fit)
            fits = [h for h in order[at:] if len(groups[h]) >= left]
            last = min(fits, key=lambda h: (len(groups[h]), groups[h][0]))
            out.append((last, left))
            return out
        out.append((g, len(groups[g])))
        left -= len(groups[g])
    raise ValueError("the groups hold fewer than k")


def _needed(sizes: list[int], k: int) -> int:
    """How many of these groups (largest first) it takes to hold k (_NEVER when they cannot)."""
    total = 0
    for n, size in enumerate(sorted(sizes, reverse=True), 1):
        total += size
        if total >= k:
            return n
    return _NEVER


def choose_nodes(
    nets: Sequence[tuple[str, str | None, str | None]], k: int, required: bool
) -> GangPick | NetworkMiss | None:
    """The k candidates a gang takes, given each one's `network_key`, best first; NetworkMiss when
    it requires one block and none holds it; None when there are fewer than k candidates."""
    if len(nets) < k:
        return None
    blocks: dict[str, list[int]] = {}
    for i, net in enumerate(nets):
        members = blocks.get(net[0])
        if members is None:
            blocks[net[0]] = [i]
        else:
            members.append(i)
    holding = [b for b, members in blocks.items() if len(members) >= k]
    if holding:
        leaves = {b: _leaves(blocks[b], nets) for b in holding}
        best = min(
            holding,
            key=lambda b: (
                _needed([len(m) for m in leaves[b].values()], k),
                len(blocks[b]),
                blocks[b][k - 1],
            ),
        )
        inside = _in_block(leaves[best], k)
        return GangPick(tuple(sorted(inside)), (best,), _note_one(best, inside, nets, k))
    if required:
        known = {b: len(m) for b, m in blocks.items() if _known(b)}
        top = max(known, key=lambda b: (known[b], -blocks[b][0]), default=None)
        return NetworkMiss(top, known.get(top, 0) if top else 0, known)
    names = list(blocks)
    fewest = _needed([len(blocks[b]) for b in names], k)
    by_spine: dict[str, list[str]] = {}
    for b in names:
        spine = nets[blocks[b][0]][2]
        if spine is not None:
            by_spine.setdefault(spine, []).append(b)
    within = [s for s, bs in by_spine.items() if _needed([len(blocks[b]) for b in bs], k) == fewest]
    if within:
        spine = min(
            within,
            key=lambda s: (sum(len(blocks[b]) for b in by_spine[s]), blocks[by_spine[s][0]][0]),
        )
        names = by_spine[spine]
    chosen = _take([blocks[b] for b in names], k)
    picks: list[int] = []
    spanned: list[str] = []
    for g, count in chosen:
        block = names[g]
        spanned.append(block)
        if count == len(blocks[block]):
            picks += blocks[block]
        else:
            picks += _in_block(_leaves(blocks[block], nets), count)
    known_blocks = [b for b in spanned if _known(b)]
    unknown = len(spanned) - len(known_blocks)
    note = (
        f"no block holds all {k} ranks; spread over {len(spanned)} block(s), the fewest that can"
        + (f": {', '.join(known_blocks)}" if known_blocks else "")
        + (f" and {unknown} node(s) with no known place" if unknown and known_blocks else "")
    )
    return GangPick(tuple(sorted(picks)), tuple(known_blocks), note)


def _leaves(members: list[int], nets) -> dict[str | None, list[int]]:
    """A block's candidates by leaf (None: those without one), best first in each."""
    out: dict[str | None, list[int]] = {}
    for i in members:
        out.setdefault(nets[i][1], []).append(i)
    return out


def _in_block(leaves: dict[str | None, list[int]], k: int) -> list[int]:
    names = list(leaves)
    return [
        i for g, count in _take([leaves[n] for n in names], k) for i in leaves[names[g]][:count]
    ]


def _note_one(block: str, picks: list[int], nets, k: int) -> str:
    if not _known(block):
        return ""
    used = sorted({nets[i][1] for i in picks if nets[i][1]})
    fewest = f" on {len(used)} leaf switch(es) ({', '.join(used)})" if used else ""
    return f"all {k} ranks in block {block}{fewest}: the fewest blocks and leaves that hold them"


def miss_reason(miss: NetworkMiss, k: int) -> str:
    """A waiting gang's reason when it requires one block and none holds it."""
    if miss.best_block is None:
        return (
            f"the gang requires one network block of {k} nodes (network.same_block required) "
            "and no node that fits a rank has a known place (topology.fleetd/block label or its "
            "fleet's network_topology)"
        )
    return (
        f"the gang requires one network block of {k} nodes (network.same_block required); the "
        f"most any block has free for a rank now is {miss.best_count} ({miss.best_block})"
    )
