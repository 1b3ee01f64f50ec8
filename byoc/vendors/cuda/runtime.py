"""What running the `cuda` vendor's regions needs (see byoc.backend.runtime): the region's shared
library (compiled by nvcc where the model is built, for the architecture named), its constants,
and a CUDA device of that architecture with cuBLAS and cuDNN where it runs.

The region's binary holds the library and the constants in their device dtype (an `.npz` without
pickles): `header` (JSON: the architecture, and the region's graph as the library was generated
from it, its constants in the library's order), `library`, and `c0`, `c1`, ....
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass

import numpy as np

from byoc.backend.engine import engine_context
from byoc.backend.runtime import VendorRuntime
from byoc.backend.settings import BUILD, PARTITION, VendorSettings, setting
from byoc.codegen_cuda.compile import compile_region
from byoc.codegen_cuda.engine import CUBLAS, CUDNN, CudaEngine, device_missing
from byoc.codegen_cuda.generate import region_source
from byoc.custom_formats.format import CustomFormat
from byoc.errors import CustomFormatError, OptionError


def _check_arch(text: str) -> None:
    if not re.fullmatch(r"sm_\d{2,3}", text):
        raise OptionError(f"arch={text!r}: expected a CUDA architecture, sm_<major><minor> (sm_90 for Hopper)")


DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class CudaSettings(VendorSettings):
    arch: str = setting("sm_90", "the GPU architecture regions are compiled for (sm_90: H100 and H200; sm_80: A100; sm_87: "
                        "Jetson Orin); a region runs on that architecture or a newer one", applies=(PARTITION, BUILD),
                        hardware=True)
    dtype: str = setting("float32", "what regions compute in: float32, or float16 or bfloat16 (each region cast to it inside, "
                         "float32 at its boundary)", choices=DTYPES)
    device: int = setting(0, "the CUDA device regions run on", applies=BUILD, minimum=0)

    def __post_init__(self) -> None:
        _check_arch(self.arch)

    def hardware(self) -> str:
        return self.arch

    @property
    def capability(self) -> int:
        return int(self.arch.removeprefix("sm_"))


def _serialize(graph, constants, settings: CudaSettings) -> bytes:
    where = f"region {graph['symbol']} (cuda)"
    library = compile_region(region_source(graph, settings.capability), settings.capability, where)
    names = list(graph["constants"])
    buffer = io.BytesIO()
    header = json.dumps({"arch": settings.arch, "constants": names, "graph": graph}).encode()
    np.savez(buffer, header=np.frombuffer(header, np.uint8), library=np.frombuffer(library, np.uint8),
             **{f"c{k}": np.asarray(constants[name]) for k, name in enumerate(names)})
    return buffer.getvalue()


def unpack(payload: bytes) -> tuple[dict, bytes, list[np.ndarray]]:
    """The region's header, library and constants."""
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
            header = json.loads(arrays["header"].tobytes())
            return header, arrays["library"].tobytes(), [arrays[f"c{k}"] for k in range(len(header["constants"]))]
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as error:
        raise CustomFormatError(f"the CUDA region is damaged: {error}") from error


def _deserialize(payload: bytes, settings: CudaSettings) -> CudaEngine:
    header, library, constants = unpack(payload)
    context = engine_context()
    where = f"region {context.symbol} (cuda, built for {header['arch']})" if context is not None else f"a CUDA region ({header['arch']})"
    return CudaEngine(library, constants, where, settings.device)


def _describe(payload: bytes, settings: CudaSettings) -> dict:
    header, library, constants = unpack(payload)
    return {"arch": header["arch"], "library_bytes": len(library), "constant_bytes": sum(c.nbytes for c in constants)}


CUDA_REGION = CustomFormat(name="cuda-region", version=1, serialize=_serialize, deserialize=_deserialize, describe=_describe,
                           device=device_missing, packages=(CUBLAS[0][0], CUDNN[0][0]))

RUNTIME = VendorRuntime(name="cuda", codegen=CUDA_REGION, settings=CudaSettings())
