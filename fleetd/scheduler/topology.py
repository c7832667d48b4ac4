"""Aligned GPU sets inside one node, from its links matrix (`NodeSnapshot.links`).

A set of GPUs is as good as its weakest pair. Pairs are ranked (lower is better):

    nvlink = nvswitch  <  pcie_switch  <  host_bridge  <  numa  <  system

NVSwitch counts as good as a direct NVLink pair: through the switch every GPU reaches every other
at full NVLink bandwidth, so for the all-to-all traffic of a collective a set of NVSwitch peers is
at least as good as a set of NVLink-bridged pairs; ranking them equal lets the packing score, not
the link name, choose between an NVSwitch box and an NVLink-pairs box. A class this module does
not know counts as `system` (the worst).

For `k` GPUs a node's *aligned* class is the best weakest-pair rank any `k` of its GPUs reach when
all are free (`Topology.best_full[k]`); a set is aligned when its weakest pair is that good. Among
the sets whose weakest pair is the best the free GPUs allow, `pick` takes the one that leaves the
most aligned sets free (counted for every size, each size's count relative to an empty node's),
so that a 1-GPU task takes the odd GPU of a broken pair rather than half of an intact one.

Everything is memoised per links matrix (one `Topology` per distinct matrix, which never changes
between refreshes) and per free mask: a node has at most a few hundred free masks and a decision
enumerates at most C(free, k) sets once per (matrix, free mask, k). Nodes with more than
`MAX_EXACT_GPUS` GPUs get a greedy set instead of an enumeration.
"""

from __future__ import annotations

import itertools

from fleetd.scheduler.model import LINK_CLASSES, SELF_LINK

# Rank of a pair's class; lower is better. nvlink and nvswitch share the best rank (see above).
LINK_RANK = {
    "nvlink": 0,
    "nvswitch": 0,
    "pcie_switch": 1,
    "host_bridge": 2,
    "numa": 3,
    "system": 4,
}
WORST_RANK = max(LINK_RANK.values())
MAX_EXACT_GPUS = 12  # above this, sets are grown greedily (2^n masks would be too many)


def valid_links(links, gpu_count: int) -> bool:
    """True when `links` is a square matrix over exactly `gpu_count` GPUs."""
    return (
        links is not None
        and gpu_count > 0
        and len(links) == gpu_count
        and all(len(row) == gpu_count for row in links)
    )


def _order(name: str) -> int:
    return LINK_CLASSES.index(name) if name in LINK_CLASSES else len(LINK_CLASSES)


def _bits(mask: int) -> list[int]:
    out, i = [], 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


class Topology:
    """One links matrix, with its aligned classes precomputed and its set choices memoised."""

    def __init__(self, links: tuple[tuple[str, ...], ...]):
        self.links = links
        self.n = n = len(links)
        self.rank = [
            [-1 if i == j else LINK_RANK.get(links[i][j], WORST_RANK) for j in range(n)]
            for i in range(n)
        ]
        self.full = (1 << n) - 1
        self.exact = n <= MAX_EXACT_GPUS
        self._weakest: dict[int, int] = {}
        self._best: dict[int, tuple[int, ...]] = {}
        self._value: dict[int, float] = {}
        self._gaps: dict[int, tuple[int, ...]] = {}
        self._pick: dict[tuple[int, int], int] = {}
        # best_full[k]: the aligned rank for k GPUs (index 0 and 1: -1, a lone GPU has no pair).
        self.best_full = self.best_ranks(self.full)
        self._full_counts = self._aligned_counts(self.full) if self.exact else None

    # ---- one set -------------------------------------------------------------------------

    def weakest(self, mask: int) -> int:
        """Rank of the set's weakest pair (-1 for fewer than two GPUs)."""
        found = self._weakest.get(mask)
        if found is None:
            idx = _bits(mask)
            rank = self.rank
            found = max(
                (rank[a][b] for a, b in itertools.combinations(idx, 2)),
                default=-1,
            )
            self._weakest[mask] = found
        return found

    def weakest_class(self, mask: int) -> str:
        """The class of the set's weakest pair (`self` for one GPU); of equally ranked classes,
        the later in LINK_CLASSES (nvswitch rather than nvlink)."""
        pairs = list(itertools.combinations(_bits(mask), 2))
        if not pairs:
            return SELF_LINK
        a, b = max(pairs, key=lambda p: (self.rank[p[0]][p[1]], _order(self.links[p[0]][p[1]])))
        return self.links[a][b]

    @staticmethod
    def class_of_rank(rank: int) -> str:
        """A class name for a rank (the first in LINK_CLASSES with it)."""
        return next(c for c in LINK_CLASSES if LINK_RANK[c] == rank)

    # ---- what a free mask still offers ---------------------------------------------------

    def best_ranks(self, mask: int) -> tuple[int, ...]:
        """For k = 0..popcount(mask): the best weakest-pair rank of any k GPUs of the mask."""
        found = self._best.get(mask)
        if found is not None:
            return found
        idx = _bits(mask)
        m = len(idx)
        if m <= 1:
            found = (-1,) * (m + 1)
        elif not self.exact:
            found = (-1, -1) + tuple(self.weakest(self._greedy(mask, k)) for k in range(2, m + 1))
        else:
            best = [WORST_RANK + 1] * (m + 1)
            best[0] = best[1] = -1
            best[m] = self.weakest(mask)
            for i in idx:  # every smaller set lies inside the mask less one of its GPUs
                sub = self.best_ranks(mask & ~(1 << i))
                for k in range(2, m):
                    if sub[k] < best[k]:
                        best[k] = sub[k]
            found = tuple(best)
        self._best[mask] = found
        return found

    def gap(self, mask: int, k: int) -> int:
        """How many ranks the best free k-set of the mask is worse than aligned (0: aligned)."""
        if k < 2:
            return 0
        best = self.best_ranks(mask)
        if k >= len(best):
            return WORST_RANK + 1
        return best[k] - self.best_full[k]

    def gaps(self, mask: int) -> tuple[int, ...]:
        """What a free mask offers, for grouping nodes: for each k >= 2 it has free GPUs for, how
        many ranks its best k-set misses aligned by. Nodes of different links with equal gaps
        score alike; each picks its own GPUs."""
        found = self._gaps.get(mask)
        if found is None:
            best = self.best_ranks(mask)
            found = self._gaps[mask] = tuple(
                best[k] - self.best_full[k] for k in range(2, len(best))
            )
        return found

    def _aligned_counts(self, mask: int) -> list[int]:
        """For each k: how many k-subsets of the mask are aligned."""
        counts = [0] * (self.n + 1)
        best = self.best_full
        sub = mask
        while sub:
            k = sub.bit_count()
            if k >= 2 and self.weakest(sub) <= best[k]:
                counts[k] += 1
            sub = (sub - 1) & mask
        return counts

    def value(self, mask: int) -> float:
        """How much aligned capacity a free mask keeps: per size k >= 2, its aligned k-sets as a
        share of an empty node's, summed; less a small term for how far its best sets are from
        aligned (so that among masks with no aligned set left, the better one still wins)."""
        found = self._value.get(mask)
        if found is None:
            best = self.best_ranks(mask)
            nearness = -0.001 * sum(b - self.best_full[k] for k, b in enumerate(best) if k >= 2)
            if self._full_counts is None:
                found = nearness
            else:
                counts = self._aligned_counts(mask)
                found = nearness + sum(
                    counts[k] / self._full_counts[k]
                    for k in range(2, self.n + 1)
                    if self._full_counts[k]
                )
            self._value[mask] = found
        return found

    # ---- choosing a set ------------------------------------------------------------------

    def pick(self, mask: int, k: int) -> int:
        """The k GPUs (a mask) of the free mask to give a task: weakest pair as good as the free
        GPUs allow, then the most aligned capacity left, then the lowest indices."""
        key = (mask, k)
        found = self._pick.get(key)
        if found is not None:
            return found
        idx = _bits(mask)
        if k >= len(idx):
            found = mask
        elif not self.exact:
            found = self._greedy(mask, k)
        else:
            target = self.best_ranks(mask)[k]
            found, best_value = 0, None
            for combo in itertools.combinations(idx, k):
                chosen = 0
                for i in combo:
                    chosen |= 1 << i
                if k >= 2 and self.weakest(chosen) != target:
                    continue
                v = self.value(mask & ~chosen)
                if best_value is None or v > best_value:
                    found, best_value = chosen, v
        self._pick[key] = found
        return found

    def _greedy(self, mask: int, k: int) -> int:
        """For large nodes: from each free GPU, add the GPU that keeps the weakest pair best
        (then the lowest index); the best of those sets."""
        idx = _bits(mask)
        best_set, best_rank = 0, None
        for seed in idx:
            chosen, members, worst = 1 << seed, [seed], -1
            while len(members) < k:
                nxt = min(
                    (i for i in idx if not chosen >> i & 1),
                    key=lambda i: (max(self.rank[i][j] for j in members), i),
                )
                worst = max(worst, max(self.rank[nxt][j] for j in members))
                chosen |= 1 << nxt
                members.append(nxt)
            if best_rank is None or worst < best_rank:
                best_set, best_rank = chosen, worst
        return best_set


def describe(topology: Topology, mask: int, free: int, k: int, required: bool) -> str:
    """Why a rank got these GPUs, in one line (for `job why` and simulate-schedule)."""
    chosen = ",".join(str(i) for i in _bits(mask))
    if k < 2:
        return f"GPU {chosen}: the one whose use leaves the most aligned GPU sets free"
    got = topology.weakest_class(mask)
    aligned = topology.class_of_rank(topology.best_full[k])
    if topology.weakest(mask) <= topology.best_full[k]:
        return f"GPUs {chosen}: {got}, the best link this node has for {k} GPUs (aligned)"
    mode = "required" if required else "preferred"
    return (
        f"GPUs {chosen}: {got}; this node's best for {k} GPUs is {aligned}, but no such set is "
        f"free (topology {mode})"
    )
