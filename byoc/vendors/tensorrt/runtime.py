"""What running the `tensorrt` vendor's regions needs (see byoc.backend.runtime): TensorRT engines
on a CUDA device. An engine is built from the region's ONNX (translated with byoc's IR, so with
TVM's compiler) and saved as a plan: an artifact with its plans embedded runs where only TVM's
runtime is installed, on a machine with the GPU and TensorRT release the plans were built for."""

from __future__ import annotations

from byoc.backend.runtime import VendorRuntime
from byoc.codegen_json.runtime import JsonRuntime
from byoc.vendors.tensorrt import engine
from byoc.vendors.tensorrt.engine import TensorRTSettings
from byoc.vendors.tensorrt.versions import format_version, resolve_version


def runtime(settings: TensorRTSettings) -> VendorRuntime:
    """The runtime of TensorRT `settings.tensorrt_version` (resolved: given, else the installed
    release, else the latest the data sheet knows)."""
    version, _ = resolve_version(settings.tensorrt_version)
    return VendorRuntime(
        name="tensorrt",
        codegen=JsonRuntime(build_engine=engine.build_engine, version=f"tensorrt-{format_version(version)}",
                            save_engine=engine.save_engine, load_engine=engine.load_engine, environment=engine.environment,
                            needs_compiler=True),
        settings=settings,
        unavailable=engine.unavailable,
    )


RUNTIME = runtime(TensorRTSettings())
