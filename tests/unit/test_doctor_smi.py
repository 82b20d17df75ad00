"""nvidia-smi output parsing (captured formats; nvidia-smi itself is not needed)."""

from __future__ import annotations

from mgpucli.doctor.smi import parse_cuda_version, parse_query, parse_topology

QUERY = """\
0, NVIDIA H100 80GB HBM3, GPU-5c1a2b3c-1111-2222-3333-444455556666, 00000000:18:00.0, 81559, 4, 0, Default, 550.54.15
1, NVIDIA H100 80GB HBM3, GPU-7d8e9f00-1111-2222-3333-444455556666, 00000000:2A:00.0, 81559, 61234, 97, Exclusive_Process, 550.54.15
2, NVIDIA GeForce RTX 3090, Ti, GPU-0000aaaa-1111-2222-3333-444455556666, 00000000:3B:00.0, 24576, [N/A], [Not Supported], Default, 550.54.15
"""  # noqa: E501

BANNER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""

TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\tPXB\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tSYS\t56-111\t1\t\tN/A\n"
    "NIC0\tPXB\tSYS\tSYS\t X \t\t\t\t\n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
)


def test_parse_query():
    gpus, driver = parse_query(QUERY)
    assert driver == "550.54.15"
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[1].memory_used_mib == 61234 and gpus[1].utilization_pct == 97
    assert gpus[1].compute_mode == "Exclusive_Process"
    assert gpus[2].name == "NVIDIA GeForce RTX 3090, Ti"  # a comma in the name
    assert gpus[2].uuid.startswith("GPU-0000aaaa")
    assert gpus[2].memory_used_mib is None and gpus[2].utilization_pct is None


def test_parse_query_ignores_noise():
    assert parse_query("No devices were found\n") == ((), None)


def test_parse_cuda_version():
    assert parse_cuda_version(BANNER) == "12.4"
    assert parse_cuda_version("CUDA Version                              : 12.8\n") == "12.8"
    assert parse_cuda_version("nothing here") is None


def test_parse_topology():
    links = parse_topology(TOPO)
    assert links[(0, 1)] == "NV18" and links[(1, 0)] == "NV18"
    assert links[(0, 2)] == "SYS" and links[(2, 1)] == "SYS"
    assert (0, 0) not in links
    assert len(links) == 6  # the NIC column and row are not GPU pairs


def test_parse_topology_spaces_only():
    text = "GPU0 GPU1 CPU Affinity NUMA Affinity\nGPU0 X PIX 0-31 0\nGPU1 PIX X 0-31 0\n"
    assert parse_topology(text) == {(0, 1): "PIX", (1, 0): "PIX"}
    assert parse_topology("") == {}
