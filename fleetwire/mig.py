"""MIG profile tables, defined once: which slices each GPU model offers and where they may sit.

A MIG-capable GPU has 7 compute slices and 8 memory slots. A profile (`1g.10gb`, `3g.40gb`,
...) takes `compute` compute slices and `size` consecutive memory slots, and may only start at
one of its `starts`, as NVIDIA's MIG user guide lists them ("Supported MIG Profiles", the
placements column `{starts}:size`). Two GPU instances on one GPU never share a memory slot,
and their compute slices add up to at most 7. fleetd's engine counts what fits with these
tables; the agent reports and (in dynamic mode) creates slices at the placements they allow.

The `+me` (media extension) and `+gfx` variants are left out: fleetd neither asks for nor
places them (a GPU that has one reports it under its own name, which no job can ask for).

A GPU model is matched from its NVML name and memory (`family_of`); an unknown model has no
MIG profiles at all.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from fleetwire.checks import is_int

COMPUTE_SLICES = 7  # compute slices of a whole MIG-capable GPU
MEMORY_SLOTS = 8  # memory slots of a whole MIG-capable GPU
GIB = 1024**3
# A profile name as NVIDIA writes it: <compute>g.<memory>gb, as `1g.10gb` or `7g.141gb`.
PROFILE_NAME = re.compile(r"^[1-7]g\.[0-9]{1,3}gb$")


@dataclasses.dataclass(frozen=True)
class Profile:
    """One MIG profile of one GPU family."""

    name: str
    compute: int  # compute slices out of COMPUTE_SLICES
    size: int  # memory slots out of MEMORY_SLOTS, taken from a start onwards
    memory_gb: int  # as in the name (the device reports a little less usable memory)
    starts: tuple[int, ...]  # memory slots where an instance may begin, lowest first

    @property
    def placements(self) -> tuple[tuple[int, int], ...]:
        """Every valid (start, size) of the profile."""
        return tuple((start, self.size) for start in self.starts)


def _table(names: dict[str, tuple[int, int, tuple[int, ...]]]) -> dict[str, Profile]:
    return {
        name: Profile(name, compute, size, int(name.split(".")[1][:-2]), starts)
        for name, (compute, size, starts) in names.items()
    }


# The placements are the same on every family (the memory per slot differs): 1g at any slot 0-6,
# the 1g with two slots and 2g at even slots, 3g at 0 or 4, 4g and 7g at 0 only.
_ONE = (1, 1, (0, 1, 2, 3, 4, 5, 6))
_ONE_DOUBLE = (1, 2, (0, 2, 4, 6))
_TWO = (2, 2, (0, 2, 4))
_THREE = (3, 4, (0, 4))
_FOUR = (4, 4, (0,))
_SEVEN = (7, 8, (0,))


def _family(one: str, double: str, half: str, whole: str) -> dict[str, Profile]:
    """A family whose 1g has `one` GB, 2g and the two-slot 1g `double`, 3g and 4g `half`."""
    return _table(
        {
            f"1g.{one}gb": _ONE,
            f"1g.{double}gb": _ONE_DOUBLE,
            f"2g.{double}gb": _TWO,
            f"3g.{half}gb": _THREE,
            f"4g.{half}gb": _FOUR,
            f"7g.{whole}gb": _SEVEN,
        },
    )


# Family -> profile name -> Profile. The A100 40GB's one-slot 1g is 1g.5gb and its two-slot 1g is
# 1g.10gb, the same memory as its 2g.10gb.
FAMILIES: dict[str, dict[str, Profile]] = {
    "A100-40GB": _family("5", "10", "20", "40"),
    "A100-80GB": _family("10", "20", "40", "80"),
    "H100-80GB": _family("10", "20", "40", "80"),
    "H100-94GB": _family("12", "24", "47", "94"),
    "H200-141GB": _family("18", "35", "71", "141"),
}
# Every profile name any family has: what a job's `resources.mig` may name.
PROFILE_NAMES = frozenset(name for family in FAMILIES.values() for name in family)

# (NVML name contains, smallest memory in GiB it must report, family); first match wins, so the
# larger memory of one chip comes first.
_MODELS = (
    ("H200", 130, "H200-141GB"),
    ("H100", 90, "H100-94GB"),
    ("H100", 70, "H100-80GB"),
    ("A100", 70, "A100-80GB"),
    ("A100", 35, "A100-40GB"),
)


def family_of(model: str, memory_total_bytes: int | None = None) -> str | None:
    """The MIG family of a GPU from its NVML name and total memory; None when it has no MIG.

    The name alone decides when it spells the memory ("A100-SXM4-80GB", "H100 80GB HBM3");
    otherwise the memory does ("NVIDIA H100 NVL" with 94 GB). An H100 PCIe of 80 GB and an H100
    SXM are one family: their profiles are the same.
    """
    upper = model.upper()
    spelled = re.search(r"(\d{2,3})\s*GB", upper)
    gib = (
        int(spelled.group(1))
        if spelled
        else (memory_total_bytes // GIB if memory_total_bytes else None)
    )
    if gib is None:
        return None
    for chip, least, family in _MODELS:
        if chip in upper and gib >= least:
            return family
    return None


def profiles_of(model: str, memory_total_bytes: int | None = None) -> dict[str, Profile]:
    """The profiles a GPU offers by name ({} for a model without MIG)."""
    family = family_of(model, memory_total_bytes)
    return FAMILIES[family] if family else {}


def profile_of(model: str, name: str, memory_total_bytes: int | None = None) -> Profile | None:
    """The named profile on this GPU model, or None when the model does not offer it."""
    return profiles_of(model, memory_total_bytes).get(name)


def gpu_fraction(name: str) -> float:
    """The share of a GPU a MIG device of this profile counts as in quotas and the usage ledger:
    its compute slices over the GPU's 7 (1g.10gb: 1/7; 7g.80gb: 1)."""
    return int(name.split("g.", 1)[0]) / COMPUTE_SLICES


def slot_mask(start: int, size: int) -> int:
    """The memory slots [start, start + size) as a bit mask."""
    return ((1 << size) - 1) << start


def place(
    profile: Profile, in_use: Iterable[tuple[int, int]], compute_in_use: int = 0
) -> int | None:
    """The lowest valid start where `profile` fits beside the (start, size) placements in use, or
    None when it fits nowhere (every start overlaps, or the compute slices are spent).

    `compute_in_use` is the compute slices the instances in use take; when it is not given only
    the memory slots decide, which is enough on every family above (a full set of memory slots
    never needs more than 7 compute slices).
    """
    if compute_in_use + profile.compute > COMPUTE_SLICES:
        return None
    used = 0
    for start, size in in_use:
        used |= slot_mask(start, size)
    for start in profile.starts:
        if not used & slot_mask(start, profile.size):
            return start
    return None


def valid_placement(profile: Profile, start: int, size: int) -> bool:
    """True when (start, size) is one of the profile's placements."""
    return size == profile.size and start in profile.starts


def layout_fits(model: str, profiles: Iterable[str], memory_total_bytes: int | None = None) -> bool:
    """True when the named profiles fit on one GPU of this model together (placed in the order
    given, largest first as mig-parted does: each at its lowest free start)."""
    table = profiles_of(model, memory_total_bytes)
    names = list(profiles)
    if any(name not in table for name in names):
        return False
    in_use: list[tuple[int, int]] = []
    compute = 0
    for profile in sorted((table[n] for n in names), key=lambda p: (-p.size, -p.compute)):
        start = place(profile, in_use, compute)
        if start is None:
            return False
        in_use.append((start, profile.size))
        compute += profile.compute
    return True


MAX_MIG_DEVICES = 7  # a GPU holds at most 7 GPU instances (one per compute slice)
MIG_UUID = re.compile(r"^MIG-[A-Za-z0-9/-]{1,124}$")


@dataclasses.dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU as the agent reports it (a GPU report's `mig_devices`): its uuid,
    memory, profile and placement. `profile` is None for a slice fleetd does not place (a `+me`
    variant, or a GPU instance the agent could not read); then start and size may be None too."""

    uuid: str
    memory_total_bytes: int | None = None
    profile: str | None = None
    start: int | None = None
    size: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: Any, where: str = "mig_device") -> MigDevice:
        """Read and check one MIG device; ValueError names what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object")
        uuid, memory, profile = (
            data.get("uuid"),
            data.get("memory_total_bytes"),
            data.get("profile"),
        )
        start, size = data.get("start"), data.get("size")
        if not isinstance(uuid, str) or not MIG_UUID.match(uuid):
            raise ValueError(f"{where}.uuid must be MIG-<uuid> (at most 128 characters)")
        if memory is not None and (not is_int(memory) or memory < 0):
            raise ValueError(f"{where}.memory_total_bytes must be a non-negative integer or null")
        if profile is not None and (
            not isinstance(profile, str) or not PROFILE_NAME.match(profile)
        ):
            raise ValueError(f"{where}.profile must be a profile name such as 1g.10gb, or null")
        if (start is None) != (size is None):
            raise ValueError(f"{where}.start and size must both be given or both be null")
        if start is not None and not (
            is_int(start)
            and is_int(size)
            and 0 <= start
            and 1 <= size
            and start + size <= MEMORY_SLOTS
        ):
            raise ValueError(
                f"{where}.start and size must lie within the {MEMORY_SLOTS} memory slots"
            )
        if profile is not None and start is None:
            raise ValueError(f"{where} with a profile must give its start and size")
        return cls(uuid, memory, profile, start, size)


def mig_devices_from_wire(data: Any, where: str = "mig_devices") -> tuple[MigDevice, ...]:
    """A GPU report's list of MIG devices, checked: at most 7, distinct uuids, no two sharing a
    memory slot."""
    if not isinstance(data, list) or len(data) > MAX_MIG_DEVICES:
        raise ValueError(f"{where} must be a list of at most {MAX_MIG_DEVICES} objects")
    devices = tuple(MigDevice.from_wire(item, f"{where}[{i}]") for i, item in enumerate(data))
    if len({d.uuid for d in devices}) != len(devices):
        raise ValueError(f"{where} uuids must be unique")
    used = 0
    for device in devices:
        if device.start is not None and device.size is not None:
            mask = slot_mask(device.start, device.size)
            if used & mask:
                raise ValueError(f"{where}: {device.uuid} overlaps another MIG device's slots")
            used |= mask
    return devices


def profile_at(
    model: str, compute: int, size: int, memory_total_bytes: int | None = None
) -> str | None:
    """The name of the profile of this GPU model that takes `compute` compute slices and `size`
    memory slots (what NVML says of a GPU instance), or None when the model has none such."""
    for profile in profiles_of(model, memory_total_bytes).values():
        if (profile.compute, profile.size) == (compute, size):
            return profile.name
    return None


# Dynamic MIG (fleet `mig.mode: dynamic`): fleetd tells a node the target layout of a GPU whose
# slices are all idle (a heartbeat answer's `mig_layouts`), the agent applies it and says how it
# went (the next heartbeat's `mig_events`), then reports the GPU's MIG devices anew.

MAX_MIG_LAYOUTS = 64  # GPUs of one node told a layout in one answer
MAX_MIG_EVENTS = 64  # results one heartbeat carries
PLAN_ID = re.compile(r"^[A-Za-z0-9:._-]{1,64}$")


@dataclasses.dataclass(frozen=True)
class MigInstance:
    """One GPU instance of a target layout: a profile at memory slots [start, start + size)."""

    profile: str
    start: int
    size: int

    def to_wire(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start, "size": self.size}

    @classmethod
    def from_wire(cls, data: Any, where: str) -> MigInstance:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object")
        profile, start, size = data.get("profile"), data.get("start"), data.get("size")
        if not isinstance(profile, str) or not PROFILE_NAME.match(profile):
            raise ValueError(f"{where}.profile must be a profile name such as 1g.10gb")
        if not (is_int(start) and is_int(size) and 0 <= start and 1 <= size):
            raise ValueError(f"{where}.start and size must be integers")
        if start + size > MEMORY_SLOTS:
            raise ValueError(f"{where} must lie within the {MEMORY_SLOTS} memory slots")
        return cls(profile, start, size)


@dataclasses.dataclass(frozen=True)
class MigLayout:
    """A GPU's target layout: destroy its (idle) MIG devices, then make these instances, each with
    one compute instance over all its slices. `plan` names this target; results carry it back."""

    gpu_uuid: str
    plan: str
    instances: tuple[MigInstance, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "gpu_uuid": self.gpu_uuid,
            "plan": self.plan,
            "instances": [i.to_wire() for i in self.instances],
        }

    @classmethod
    def from_wire(cls, data: Any, where: str = "mig_layout") -> MigLayout:
        """Read and check one target layout; ValueError names what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object")
        gpu_uuid, plan, instances = data.get("gpu_uuid"), data.get("plan"), data.get("instances")
        if not isinstance(gpu_uuid, str) or not 1 <= len(gpu_uuid) <= 128:
            raise ValueError(f"{where}.gpu_uuid must be a GPU uuid")
        if not isinstance(plan, str) or not PLAN_ID.match(plan):
            raise ValueError(f"{where}.plan must be a plan id")
        if not isinstance(instances, list) or not 1 <= len(instances) <= MAX_MIG_DEVICES:
            raise ValueError(f"{where}.instances must list 1 to {MAX_MIG_DEVICES} instances")
        parsed = tuple(
            MigInstance.from_wire(item, f"{where}.instances[{i}]")
            for i, item in enumerate(instances)
        )
        used = 0
        for instance in parsed:
            mask = slot_mask(instance.start, instance.size)
            if used & mask:
                raise ValueError(f"{where}: two instances share a memory slot")
            used |= mask
        return cls(gpu_uuid, plan, parsed)


@dataclasses.dataclass(frozen=True)
class MigEvent:
    """What came of a target layout on one GPU. `ok`: it now has the layout. Not ok: `busy` says
    the agent left the GPU as it was because a task it runs held a slice (nothing was destroyed);
    otherwise the GPU may be left part-way (fleetd blocks it)."""

    gpu_uuid: str
    plan: str
    ok: bool
    detail: str = ""
    busy: bool = False

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: Any, where: str = "mig_event") -> MigEvent:
        """Read and check one result; ValueError names what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object")
        gpu_uuid, plan, ok = data.get("gpu_uuid"), data.get("plan"), data.get("ok")
        detail, busy = data.get("detail", ""), data.get("busy", False)
        if not isinstance(gpu_uuid, str) or not 1 <= len(gpu_uuid) <= 128:
            raise ValueError(f"{where}.gpu_uuid must be a GPU uuid")
        if not isinstance(plan, str) or not PLAN_ID.match(plan):
            raise ValueError(f"{where}.plan must be a plan id")
        if not isinstance(ok, bool) or not isinstance(busy, bool):
            raise ValueError(f"{where}.ok and busy must be true or false")
        if not isinstance(detail, str):
            raise ValueError(f"{where}.detail must be text")
        return cls(gpu_uuid, plan, ok, detail[:1000], busy)


def mig_list_from_wire(data: Any, name: str, kind: Any, most: int) -> tuple[Any, ...]:
    """A list of MigLayout or MigEvent as the wire carries it (absent: none)."""
    if data is None:
        return ()
    if not isinstance(data, list) or len(data) > most:
        raise ValueError(f"{name} must be a list of at most {most} objects")
    return tuple(kind.from_wire(item, f"{name}[{i}]") for i, item in enumerate(data))
