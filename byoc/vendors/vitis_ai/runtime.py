"""What running the `vitis_ai` vendor's regions needs (see byoc.backend.runtime): the DPU program
format, whose engine is the DPU simulator, and the vendor's settings (the DPU a program is built
for, given at load as the one the machine has)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from byoc.backend.runtime import VendorRuntime
from byoc.backend.settings import BUILD, PARTITION, VendorSettings, setting
from byoc.custom_formats.format import CustomFormat
from byoc.errors import CustomFormatError
from byoc.vendors.vitis_ai import bitstream
from byoc.vendors.vitis_ai.configs import dpu_config
from byoc.vendors.vitis_ai.program import compile_program
from byoc.vendors.vitis_ai.simulator import DpuSimulator, estimate_cycles

DEFAULT_DPU = "DPUCZDX8G"


@dataclass(frozen=True)
class VitisAiSettings(VendorSettings):
    dpu: str = setting(DEFAULT_DPU, "the DPU configuration: a family (DPUCZDX8G, DPUCAHX8H) or family-architecture "
                       "(DPUCZDX8G-B1024); given at load, the one this machine has (a program built for another is refused)",
                       applies=(PARTITION, BUILD), hardware=True)
    single_region: bool = setting(False, "keep only the region with the most MACs, as the BYOC paper's integration does")

    def hardware(self) -> str:
        return dpu_config(self.dpu).name  # a family stands for its largest size


# ------------------------------------------------------------------ binary format
def _serialize(graph, constants, settings: VitisAiSettings) -> bytes:
    return bitstream.encode(compile_program(graph, constants, settings.hardware()))


def _deserialize(payload: bytes, options) -> DpuSimulator:
    try:
        return DpuSimulator(bitstream.decode(payload))
    except (struct.error, ValueError, IndexError) as error:
        raise CustomFormatError(f"the DPU program is damaged: {error}") from error


def _describe(payload: bytes, options) -> dict:
    program = bitstream.decode(payload)
    weights = sum(i.weights.nbytes for i in program.instructions if i.weights is not None)
    return {**estimate_cycles(program, dpu_config(program.target)), "instructions": len(program.instructions), "weight_bytes": weights}


DPU_PROGRAM = CustomFormat(name="dpu-program", version=1, serialize=_serialize, deserialize=_deserialize, describe=_describe)


RUNTIME = VendorRuntime(name="vitis_ai", codegen=DPU_PROGRAM, settings=VitisAiSettings())
