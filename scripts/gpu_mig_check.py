#!/usr/bin/env python3
"""On a real GPU host with MIG mode enabled: do the agent's MIG devices equal what
`nvidia-smi mig -lgi` lists, and does a GPU instance created through NVML show up and go?

Finds a GPU whose MIG mode is enabled (never enables or disables it: that takes a GPU reset),
reads its MIG devices the way fleet-agent does (agent.nvml and agent.devices through the real
pynvml: profile and placement start:size) and compares them with nvidia-smi's GPU instances
(those with a compute instance: one without has no MIG device). Then, unless --dry-run, when a
one-slot 1g profile fits in the free memory slots (fleetwire.mig.place), it creates one GPU
instance there with a compute instance through NVML, checks nvidia-smi and the agent list it at
that placement, destroys it (compute instance first) and checks it is gone; what it created is
destroyed even when a check fails or the run is interrupted.

Exit 0 when everything matched, 1 on a mismatch or a failed step (each is named), 2 when there is
nothing to check (no nvidia-smi, no NVML, no GPU with MIG mode enabled, not root without
--dry-run). Not run in CI; needs the repository, `pip install nvidia-ml-py`, and root to create.

    sudo python3 scripts/gpu_mig_check.py [--gpu INDEX] [--dry-run]
"""

import argparse
import dataclasses
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.devices import mig_devices  # noqa: E402 - after the repository is on the path
from agent.nvml import (  # noqa: E402
    DeviceError,
    Nvml,
    NvmlUnavailable,
    create_gpu_instance,
    destroy_gpu_instance,
    load_backend,
)
from fleetwire.mig import MigDevice, Profile, place, profiles_of  # noqa: E402

SMI_TIMEOUT_S = 30
NVML_ONE_SLOT_1G = "1_SLICE"  # NVML_GPU_INSTANCE_PROFILE_1_SLICE: the 1g with one memory slot
# A row of `nvidia-smi mig -lgi`: GPU, MIG <profile name>, profile id, instance id, start:size.
LGI_ROW = re.compile(r"\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
# A row of `nvidia-smi mig -lci`: GPU, GPU instance id, MIG <name>, profile id, instance id, s:z.
LCI_ROW = re.compile(r"\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")


@dataclasses.dataclass(frozen=True)
class GpuInstance:
    """One row of `nvidia-smi mig -lgi`."""

    gpu: int
    profile: str  # as nvidia-smi names it, without "MIG ": 1g.10gb, 1g.10gb+me
    profile_id: int
    instance_id: int
    start: int
    size: int

    def __str__(self):
        return f"GPU instance {self.instance_id} ({self.profile} at {self.start}:{self.size})"


def _table_rows(text, row, empty):
    """The matches of `row` in one of nvidia-smi's MIG tables; [] when it says `empty`. ValueError
    for any other text (an error such as Insufficient Permissions, or a format not known here)."""
    rows = [found for line in text.splitlines() if (found := row.fullmatch(line.strip()))]
    if rows:
        return rows
    if any(e in text for e in empty):
        return []
    if any("Placement" in line and "Profile" in line for line in text.splitlines()):
        return []  # the table's header with no rows
    raise ValueError(f"not a list of MIG instances: {text.strip()[:300]!r}")


def parse_lgi(text):
    """The GPU instances `nvidia-smi mig -lgi` lists, every GPU's; [] for "No GPU instances
    found". ValueError when the text is not such a list."""
    return [
        GpuInstance(int(gpu), name, int(pid), int(iid), int(start), int(size))
        for gpu, name, pid, iid, start, size in (
            m.groups() for m in _table_rows(text, LGI_ROW, ("No GPU instances found",))
        )
    ]


def parse_lci(text):
    """{(GPU, GPU instance id)} of the GPU instances that have a compute instance, from
    `nvidia-smi mig -lci`. ValueError when the text is not such a list."""
    empty = ("No compute instances found", "No GPU instances found")
    return {(int(m.group(1)), int(m.group(2))) for m in _table_rows(text, LCI_ROW, empty)}


def compare(gis, devices, gpu, offered, with_ci=None):
    """The mismatches (lines) between nvidia-smi's GPU instances `gis` on GPU `gpu` and the agent's
    MIG devices of it (fleetwire.mig.MigDevice). They are matched by placement: each GPU instance
    must have a MIG device at its start:size with its profile name when the GPU offers that
    profile (`offered`: the names fleetwire.mig has for the model), else with none (a +me
    variant). `with_ci`: {(GPU, GPU instance id)} that have a compute instance (parse_lci); the
    others have no MIG device and are not looked for. Several MIG devices of one GPU instance
    (several compute instances) count once."""
    out = []
    agent: dict[tuple[int, int], set] = {}
    for device in devices:
        if device.start is None or device.size is None:
            out.append(f"agent: {device.uuid} has no placement (NVML did not say its GPU instance)")
            continue
        agent.setdefault((device.start, device.size), set()).add(device.profile)
    for gi in sorted(gis, key=lambda g: g.start):
        if gi.gpu != gpu or (with_ci is not None and (gi.gpu, gi.instance_id) not in with_ci):
            continue
        want = gi.profile if gi.profile in offered else None
        got = agent.pop((gi.start, gi.size), None)
        if got is None:
            out.append(f"{gi}: nvidia-smi lists it, the agent has no MIG device there")
        elif got != {want}:
            names = ", ".join(sorted(str(p) for p in got))
            out.append(f"{gi}: the agent names it {names}, expected {want}")
    for (start, size), profiles in sorted(agent.items()):
        names = ", ".join(sorted(str(p) for p in profiles))
        out.append(f"{start}:{size}: the agent has a MIG device ({names}), nvidia-smi no instance")
    return out


def free_one_slot_1g(gis, gpu, offered):
    """(profile, start) of the one-slot 1g profile at its lowest start free beside the GPU
    instances on GPU `gpu` (`offered`: name -> fleetwire.mig.Profile of the model), or None when
    the model has no such profile or it fits nowhere."""
    one = next((p for p in offered.values() if (p.compute, p.size) == (1, 1)), None)
    if one is None:
        return None
    mine = [gi for gi in gis if gi.gpu == gpu]
    compute = sum(_compute_slices(gi.profile) for gi in mine)
    start = place(one, [(gi.start, gi.size) for gi in mine], compute)
    return None if start is None else (one, start)


def _compute_slices(name):
    found = re.match(r"(\d)g\.", name)
    return int(found.group(1)) if found else 0


def check_listed(gis, gpu, instance_id, profile, start, size):
    """[] when nvidia-smi lists GPU instance `instance_id` on GPU `gpu` as `profile` at start:size,
    else the mismatch."""
    found = [gi for gi in gis if (gi.gpu, gi.instance_id) == (gpu, instance_id)]
    if not found:
        return [f"nvidia-smi does not list the GPU instance {instance_id} just created"]
    gi = found[0]
    if (gi.profile, gi.start, gi.size) != (profile, start, size):
        return [f"created {profile} at {start}:{size}, nvidia-smi lists {gi}"]
    return []


def check_gone(gis, gpu, instance_id, start, size):
    """[] when nvidia-smi lists neither GPU instance `instance_id` nor any instance at start:size
    on GPU `gpu` any more, else what is still there."""
    return [
        f"after destroying it nvidia-smi still lists {gi}"
        for gi in gis
        if gi.gpu == gpu and (gi.instance_id == instance_id or (gi.start, gi.size) == (start, size))
    ]


class SmiError(Exception):
    """nvidia-smi could not be run, or printed no list of MIG instances."""


def smi_mig(flag):
    """The text of `nvidia-smi mig <flag>` (stdout and stderr: it exits non-zero when the list is
    empty). Raises SmiError when it cannot be run."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "mig", flag], capture_output=True, text=True, timeout=SMI_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SmiError(f"nvidia-smi mig {flag} failed: {exc}") from None
    return done.stdout + done.stderr


def read_smi(show=True):
    """(GPU instances, {(GPU, GPU instance id)} with a compute instance or None when -lci could not
    be read) from nvidia-smi. Raises SmiError."""
    text = smi_mig("-lgi")
    if show:
        print("== nvidia-smi mig -lgi\n" + text.rstrip())
    try:
        gis = parse_lgi(text)
    except ValueError as exc:
        raise SmiError(f"nvidia-smi mig -lgi: {exc}") from None
    try:
        with_ci = parse_lci(smi_mig("-lci"))
    except (SmiError, ValueError) as exc:
        print(f"(nvidia-smi mig -lci unread, every GPU instance is looked for: {exc})")
        with_ci = None
    return gis, with_ci


def read_agent(nvml, handle, ident):
    """The agent's MIG devices of the GPU, read as fleet-agent reads them, printed."""
    readings = nvml.properties(handle)["mig_devices"]
    devices = mig_devices(ident, readings)
    print(f"== fleet-agent: {len(devices)} MIG device(s)")
    for reading in readings:
        print(
            f"  {reading.get('uuid')}: NVML compute slices {reading.get('compute')}, "
            f"placement {reading.get('start')}:{reading.get('size')}"
        )
    for device in devices:
        print(f"  -> {device.uuid}: {device.profile} at {device.start}:{device.size}")
    return devices


def compare_now(nvml, handle, ident, gpu, offered, step, known):
    """Read nvidia-smi and the agent again and compare them: (the mismatches not in `known`, those
    found before, named by `step`; the GPU instances)."""
    gis, with_ci = read_smi()
    devices = read_agent(nvml, handle, ident)
    found = compare(gis, devices, gpu, offered, with_ci)
    return [f"{step}: {line}" for line in found if line not in known], gis


def find_gpu(nvml, wanted):
    """(index, handle, identity) of GPU `wanted`, or of the first GPU whose MIG mode is enabled;
    None (why printed) when there is none."""
    count = nvml.count()
    indices = range(count) if wanted is None else [wanted]
    if wanted is not None and not 0 <= wanted < count:
        print(f"no GPU {wanted}: NVML sees {count} GPU(s)")
        return None
    modes = []
    for index in indices:
        try:
            handle = nvml.handle(index)
            ident = nvml.identity(handle)
        except DeviceError as exc:
            modes.append(f"GPU {index} unreadable ({exc})")
            continue
        mode = nvml.properties(handle)["mig_mode"]
        if mode == "enabled":
            return index, handle, ident
        modes.append(f"GPU {index} {ident['name']}: MIG mode {mode or 'not supported'}")
    print("no GPU with MIG mode enabled (this check never enables it: that takes a GPU reset)")
    for line in modes:
        print("  " + line)
    return None


def exercise(nvml, handle, ident, gpu, offered, known, profile: Profile, start):
    """Create a GPU instance of `profile` at `start` through NVML, check nvidia-smi and the agent
    list it, destroy it and check it is gone: the problems found (lines; `known`: the mismatches
    found before, not repeated). What was created is destroyed whatever happens."""
    problems: list[str] = []
    created = None
    destroyed = False
    print(f"\n== creating a {profile.name} GPU instance at {start}:{profile.size} through NVML")
    try:
        created = create_gpu_instance(nvml, handle, NVML_ONE_SLOT_1G, start, profile.size)
        print(f"created GPU instance {created.id} with a compute instance")
        out, gis = compare_now(nvml, handle, ident, gpu, offered, "with it", known)
        problems += out
        problems += check_listed(gis, gpu, created.id, profile.name, start, profile.size)
    except DeviceError as exc:
        problems.append(f"creating a {profile.name} GPU instance at {start} failed: {exc}")
    except SmiError as exc:
        problems.append(f"with it: {exc}")
    finally:
        if created is not None:
            try:
                destroy_gpu_instance(nvml, created)
                destroyed = True
                print(f"\n== destroyed GPU instance {created.id} (its compute instance first)")
            except DeviceError as exc:
                problems.append(
                    f"could not destroy GPU instance {created.id}: {exc}; remove it with "
                    f"`nvidia-smi mig -i {gpu} -gi {created.id} -dci` then `-dgi`"
                )
    if destroyed and created is not None:
        try:
            out, gis = compare_now(nvml, handle, ident, gpu, offered, "after destroying it", known)
            problems += out + check_gone(gis, gpu, created.id, start, profile.size)
        except SmiError as exc:
            problems.append(f"after destroying it: {exc}")
    return problems


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, metavar="INDEX", help="the GPU to check (NVML index)")
    parser.add_argument(
        "--dry-run", action="store_true", help="compare only: create no GPU instance"
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not args.dry_run and os.geteuid() != 0:
        print("creating a GPU instance needs root: run as root, or with --dry-run to compare only")
        return 2
    try:
        smi_mig("-lgi")
    except SmiError as exc:
        print(exc)
        return 2
    try:
        nvml = Nvml(load_backend("nvml"))
        nvml.open()
    except NvmlUnavailable as exc:
        print(f"no GPUs through NVML: {exc}")
        return 2
    try:
        found = find_gpu(nvml, args.gpu)
        if found is None:
            return 2
        gpu, handle, ident = found
        offered = profiles_of(ident["name"], ident["memory_total_bytes"])
        print(f"GPU {gpu}: {ident['name']}, MIG mode enabled, profiles {sorted(offered) or 'none'}")
        try:
            gis, with_ci = read_smi()
        except SmiError as exc:
            print(exc)
            return 2
        devices: tuple[MigDevice, ...] = read_agent(nvml, handle, ident)
        problems = compare(gis, devices, gpu, offered, with_ci)
        if args.dry_run:
            print("\n(--dry-run: nothing created)")
        else:
            choice = free_one_slot_1g(gis, gpu, offered)
            if choice is None:
                print(f"\nno one-slot 1g profile fits in GPU {gpu}'s free memory: nothing created")
            else:
                problems += exercise(nvml, handle, ident, gpu, offered, list(problems), *choice)
    finally:
        nvml.close()
    print("\n== " + ("everything matched" if not problems else f"{len(problems)} mismatch(es)"))
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
