#!/usr/bin/env python3
"""On a real GPU host: does the agent's topology equal what `nvidia-smi topo -m` shows?

Runs `nvidia-smi topo -m`, reads the topology the way fleet-agent does (agent.devices through the
real pynvml), prints both and compares every GPU pair and every NIC nvidia-smi names:
NV<n> is nvlink or nvswitch with n links, PIX and PXB pcie_switch, PHB host_bridge, NODE numa,
SYS system. Exit 0 when they agree, 1 on a mismatch, 2 when there is nothing to compare (no
nvidia-smi, no NVML). Not run in CI; needs the repository and `pip install nvidia-ml-py click`.

    python3 scripts/gpu_topology_check.py
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.devices import DeviceManager  # noqa: E402 - after the repository is on the path
from fleetd.cli.topology import show_topology  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SMI_CLASSES = {
    "X": "self",
    "PIX": "pcie_switch",
    "PXB": "pcie_switch",
    "PHB": "host_bridge",
    "NODE": "numa",
    "SYS": "system",
}


def parse_smi(text):
    """{"gpus": {name: {column: code}}, "nics": {NICk: device name}} from `nvidia-smi topo -m`."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), None)
    if header is None:
        raise ValueError("no GPU0 column in nvidia-smi's output")
    columns = [c for c in header if re.fullmatch(r"(GPU|NIC)\d+", c)]
    rows: dict[str, dict[str, str]] = {}
    nics: dict[str, str] = {}
    for line in lines:
        cells = line.split()
        if cells and re.fullmatch(r"(GPU|NIC)\d+", cells[0]) and len(cells) > len(columns):
            rows[cells[0]] = dict(zip(columns, cells[1 : 1 + len(columns)]))
        found = re.fullmatch(r"\s*(NIC\d+):\s*(\S+)", line)
        if found:
            nics[found.group(1)] = found.group(2)
    return {"gpus": {k: v for k, v in rows.items() if k.startswith("GPU")}, "nics": nics}


def smi_class(code):
    """(class or "nvlink", NVLink count) of one nvidia-smi cell."""
    found = re.fullmatch(r"NV(\d+)", code)
    if found:
        return "nvlink", int(found.group(1))
    return SMI_CLASSES.get(code, code), 0


def compare(smi, topology, index_of):
    """The mismatches (lines) between nvidia-smi's matrix and the agent's topology; `index_of`: GPU
    uuid -> NVML index (nvidia-smi's GPU<index>)."""
    names = [f"GPU{index_of[uuid]}" for uuid in topology["gpus"]]
    out = []
    if sorted(names) != sorted(smi["gpus"]):
        return [f"GPUs differ: nvidia-smi {sorted(smi['gpus'])}, agent {sorted(names)}"]
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            want, count = smi_class(smi["gpus"][a][b])
            got, links = topology["links"][i][j], topology["nvlink_count"][i][j]
            agrees = (
                got in ("nvlink", "nvswitch") and links == count
                if want == "nvlink"
                else got == want
            )
            if not agrees:
                out.append(f"{a}-{b}: nvidia-smi {smi['gpus'][a][b]}, agent {got} ({links} links)")
    ours = {nic["name"]: nic for nic in topology.get("nics") or []}
    for column, name in sorted(smi["nics"].items()):
        nic = ours.get(name)
        if nic is None:
            out.append(f"{column} ({name}): nvidia-smi lists it, the agent does not")
            continue
        for i, a in enumerate(names):
            want, _ = smi_class(smi["gpus"][a].get(column, "?"))
            if nic["links"][i] != want:
                out.append(f"{a}-{column} ({name}): nvidia-smi {want}, agent {nic['links'][i]}")
    return out


def main():
    try:
        smi = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=120, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"nvidia-smi topo -m failed: {exc}")
        return 2
    print("== nvidia-smi topo -m\n" + smi)
    manager = DeviceManager("nvml", watch_xids=False)
    try:
        inventory = manager.discover()
    finally:
        manager.close()
    if inventory.reason or not inventory.devices:
        print(f"no GPUs through NVML: {inventory.reason or 'none found'}")
        return 2
    topology = inventory.topology
    print("== fleet-agent")
    if topology is None:
        print("the agent read no topology (see its log lines above)")
        return 1
    gpus = [{"uuid": d.gpu.uuid, "index": d.gpu.index} for d in inventory.devices]
    show_topology(topology, gpus)
    mismatches = compare(parse_smi(smi), topology, {g["uuid"]: g["index"] for g in gpus})
    print("\n== " + ("they agree" if not mismatches else f"{len(mismatches)} mismatch(es)"))
    for line in mismatches:
        print("  " + line)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
