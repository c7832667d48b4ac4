"""scripts/gpu_topology_check.py (run by hand on a real GPU host) reads `nvidia-smi topo -m` and
compares it with the agent's topology: checked here on nvidia-smi's output format."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_topology_check.py"
SPEC = importlib.util.spec_from_file_location("gpu_topology_check", SCRIPT)
assert SPEC is not None and SPEC.loader is not None
check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check)

SMI = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\tPIX\t0-55\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tNODE\t0-55\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tSYS\t56-111\t1\t\tN/A\n"
    "NIC0\tPIX\tNODE\tSYS\t X \n\n"
    "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
    "NIC Legend:\n\n  NIC0: mlx5_0\n"
)
UUIDS = ["GPU-a", "GPU-b", "GPU-c"]
AGENT = {
    "gpus": UUIDS,
    "links": [
        ["self", "nvswitch", "system"],
        ["nvswitch", "self", "system"],
        ["system", "system", "self"],
    ],
    "nvlink_count": [[0, 18, 0], [18, 0, 0], [0, 0, 0]],
    "nics": [
        {
            "name": "mlx5_0",
            "kind": "infiniband",
            "pci_bus_id": "0000:19:00.0",
            "links": ["pcie_switch", "numa", "system"],
        },
        {"name": "eno1", "kind": "ethernet", "pci_bus_id": "0000:03:00.0", "links": ["numa"] * 3},
    ],
}


def test_nvidia_smis_matrix_and_nic_legend_are_read():
    smi = check.parse_smi(SMI)
    assert smi["gpus"]["GPU0"] == {"GPU0": "X", "GPU1": "NV18", "GPU2": "SYS", "NIC0": "PIX"}
    assert sorted(smi["gpus"]) == ["GPU0", "GPU1", "GPU2"] and smi["nics"] == {"NIC0": "mlx5_0"}


def test_an_agent_topology_equal_to_nvidia_smis_has_no_mismatch():
    assert check.compare(check.parse_smi(SMI), AGENT, {u: i for i, u in enumerate(UUIDS)}) == []


def test_every_pair_or_nic_that_differs_is_named():
    other = dict(AGENT, nvlink_count=[[0, 12, 0], [12, 0, 0], [0, 0, 0]], nics=[])
    assert check.compare(check.parse_smi(SMI), other, {u: i for i, u in enumerate(UUIDS)}) == [
        "GPU0-GPU1: nvidia-smi NV18, agent nvswitch (12 links)",
        "GPU1-GPU0: nvidia-smi NV18, agent nvswitch (12 links)",
        "NIC0 (mlx5_0): nvidia-smi lists it, the agent does not",
    ]
