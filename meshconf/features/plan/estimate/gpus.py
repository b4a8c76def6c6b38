"""GPUs by the name ``--gpu`` takes: memory, dense bf16 peak, the bandwidth of the links
inside a node (NVLink, or AMD's Infinity Fabric) and of the network, and how many GPUs a node
and an NVLink domain hold, each from the vendor's datasheet that the preset names.

Bandwidths are per GPU and per direction, in GB/s, as a config's ``bandwidth_gb_s``: a
datasheet's NVLink figure counts both directions (H100: 900 GB/s, so 450 each way). The peak
is the dense figure: datasheets print the one with 2:4 sparsity, twice as large. Memory is
the datasheet's capacity, which drivers report a little below (an H100 of 80 GB shows 79.6
GiB). The network is not part of a GPU: each preset takes one NIC per GPU as the vendor's
reference system for it has, which a cluster's own ``--inter-node-gb-s`` overrides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

#: One 400 Gb/s NIC per GPU (ConnectX-7, NDR InfiniBand or 400 GbE), in GB/s.
_NIC_400G = 50.0


@dataclass(frozen=True)
class Gpu:
    """A GPU as the estimate takes it, and where its figures come from."""

    name: str
    title: str
    memory_gib: float
    #: Dense bf16 tensor-core TFLOP/s.
    peak_tflops: float
    #: GB/s per GPU, each way, between GPUs of one node (or NVLink domain).
    scale_up_gb_s: float
    #: GB/s per GPU across nodes.
    network_gb_s: float
    gpus_per_node: int
    #: GPUs that share one NVLink domain, when it holds more than a node (GB200 NVL72: 72).
    nvlink_domain: int | None
    source: str

    @property
    def summary(self) -> str:
        return (
            f"{self.name}: {self.memory_gib:g} GiB, {self.peak_tflops:g} TFLOP/s dense bf16, "
            f"{self.scale_up_gb_s:g} GB/s inside a node, {self.network_gb_s:g} GB/s across"
        )


GPUS: Mapping[str, Gpu] = MappingProxyType(
    {
        gpu.name: gpu
        for gpu in (
            Gpu(
                "a100-80g",
                "NVIDIA A100 80GB SXM",
                80,
                312,
                300,
                25,
                8,
                None,
                "NVIDIA A100 Tensor Core GPU datasheet: 80 GB HBM2e, BF16 312 TFLOPS (624 "
                "with sparsity), NVLink 600 GB/s; DGX A100 datasheet: eight 200 Gb/s HDR "
                "InfiniBand ports for 8 GPUs",
            ),
            Gpu(
                "h100-sxm",
                "NVIDIA H100 SXM",
                80,
                989,
                450,
                _NIC_400G,
                8,
                None,
                "NVIDIA H100 Tensor Core GPU datasheet: 80 GB HBM3, BF16 1,979 TFLOPS with "
                "sparsity, NVLink 900 GB/s; DGX H100 datasheet: eight 400 Gb/s ConnectX-7 "
                "ports for 8 GPUs",
            ),
            Gpu(
                "h200",
                "NVIDIA H200 SXM",
                141,
                989,
                450,
                _NIC_400G,
                8,
                None,
                "NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e, BF16 1,979 TFLOPS with "
                "sparsity, NVLink 900 GB/s; DGX H200 datasheet: eight 400 Gb/s ConnectX-7 "
                "ports for 8 GPUs",
            ),
            Gpu(
                "h800",
                "NVIDIA H800 SXM",
                80,
                989,
                200,
                _NIC_400G,
                8,
                None,
                "NVIDIA H800 datasheet: 80 GB HBM3, BF16 1,979 TFLOPS with sparsity, NVLink "
                "400 GB/s; the network of DeepSeek-V3's H800 cluster, 50 GB/s InfiniBand per "
                "GPU (DeepSeek-V3 technical report, arXiv:2412.19437, section 3.2.2)",
            ),
            Gpu(
                "b200",
                "NVIDIA B200 (HGX B200)",
                180,
                2250,
                900,
                _NIC_400G,
                8,
                None,
                "NVIDIA HGX B200 datasheet: 1,440 GB HBM3e and FP16/BF16 36 PFLOPS with "
                "sparsity for 8 GPUs, NVLink 1.8 TB/s per GPU; DGX B200 datasheet: eight "
                "400 Gb/s ConnectX-7 ports for 8 GPUs",
            ),
            Gpu(
                "gb200",
                "NVIDIA GB200 NVL72",
                186,
                2500,
                900,
                _NIC_400G,
                4,
                72,
                "NVIDIA GB200 NVL72 datasheet: 72 GPUs in one NVLink domain, 13.4 TB HBM3e "
                "(186 GB a GPU), FP16/BF16 360 PFLOPS with sparsity, NVLink 1.8 TB/s per "
                "GPU, compute trays of 4 GPUs, each GPU with a 400 Gb/s ConnectX-7 NIC",
            ),
            Gpu(
                "mi300x",
                "AMD Instinct MI300X",
                192,
                1307.4,
                448,
                _NIC_400G,
                8,
                None,
                "AMD Instinct MI300X data sheet: 192 GB HBM3, peak BF16 1,307.4 TFLOPS "
                "(2,614.9 with sparsity), 7 Infinity Fabric links of 896 GB/s together; "
                "one 400 Gb/s NIC per GPU as in an 8-GPU MI300X platform",
            ),
            Gpu(
                "mi325x",
                "AMD Instinct MI325X",
                256,
                1307.4,
                448,
                _NIC_400G,
                8,
                None,
                "AMD Instinct MI325X data sheet: 256 GB HBM3E, peak BF16 1,307.4 TFLOPS "
                "(2,614.9 with sparsity), 7 Infinity Fabric links of 896 GB/s together; "
                "one 400 Gb/s NIC per GPU as in an 8-GPU MI325X platform",
            ),
        )
    }
)
