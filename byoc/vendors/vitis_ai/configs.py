"""DPU configurations and the throughput model of the simulator.

Parallelism per configuration from Xilinx's public DPU data (PG338, DPUCZDX8G): pixel
parallelism (PP), input channel parallelism (ICP) and output channel parallelism (OCP); the
peak is 2 x PP x ICP x OCP operations per cycle (B4096: 8 x 16 x 16 x 2). The clock is a stated
assumption of the model (300 MHz for the Zynq UltraScale+ configurations).

Throughput model (compute-bound; memory traffic is not modelled): a convolution takes
ceil(OW / PP) x OH x ceil(IC_per_group / ICP) x ceil(OC / OCP) x KH x KW cycles; a depthwise
convolution ceil(OW / PP) x OH x ceil(C / OCP) x KH x KW; pooling, element-wise and data-movement
instructions ceil(OW / PP) x OH x ceil(C / OCP) x (window size, or 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from byoc.errors import ByocError


@dataclass(frozen=True)
class DpuConfig:
    family: str
    arch: str
    pixel_parallelism: int
    input_channels: int
    output_channels: int
    clock_mhz: float
    depthwise: bool
    description: str

    @property
    def name(self) -> str:
        return f"{self.family}-{self.arch}"

    @property
    def peak_ops_per_cycle(self) -> int:
        return 2 * self.pixel_parallelism * self.input_channels * self.output_channels

    def conv_cycles(self, out_h: int, out_w: int, in_channels: int, out_channels: int, kernel: int, depthwise: bool = False) -> int:
        rows = math.ceil(out_w / self.pixel_parallelism) * out_h
        if depthwise:
            return rows * math.ceil(out_channels / self.output_channels) * kernel
        return rows * math.ceil(in_channels / self.input_channels) * math.ceil(out_channels / self.output_channels) * kernel

    def elementwise_cycles(self, out_h: int, out_w: int, channels: int, window: int = 1) -> int:
        return math.ceil(out_w / self.pixel_parallelism) * out_h * math.ceil(channels / self.output_channels) * window


_EDGE = {  # arch: (PP, ICP, OCP)
    "B512": (4, 8, 8),
    "B800": (4, 10, 10),
    "B1024": (8, 8, 8),
    "B1152": (4, 12, 12),
    "B1600": (8, 10, 10),
    "B2304": (8, 12, 12),
    "B3136": (8, 14, 14),
    "B4096": (8, 16, 16),
}
FAMILIES = {
    "DPUCZDX8G": ("Zynq UltraScale+ MPSoC (edge)", True, 300.0, _EDGE, "B4096"),
    # The Alveo HBM DPU has no depthwise engine; modelled with the B4096 array at 300 MHz.
    "DPUCAHX8H": ("Alveo U50/U280 (cloud, HBM)", False, 300.0, {"B4096": (8, 16, 16)}, "B4096"),
}


def dpu_config(dpu: str) -> DpuConfig:
    """A configuration by name: a family ("DPUCZDX8G", its default architecture) or
    family-architecture ("DPUCZDX8G-B1024")."""
    family, _, arch = dpu.partition("-")
    if family not in FAMILIES:
        raise ByocError(f"unknown DPU {dpu!r}; known DPUs: {', '.join(FAMILIES)}")
    description, depthwise, clock, archs, default = FAMILIES[family]
    arch = arch or default
    if arch not in archs:
        raise ByocError(f"{family} has no architecture {arch!r}; it has {', '.join(archs)}")
    pp, icp, ocp = archs[arch]
    return DpuConfig(family, arch, pp, icp, ocp, clock, depthwise, description)
