"""What running the `dnnl` vendor's regions needs (see byoc.backend.runtime): oneDNN's C library,
whose regions are C linked into the host library, and the vendor's settings."""

from byoc.backend.runtime import VendorRuntime
from byoc.codegen_c.onednn import library, onednn_library
from byoc.codegen_c.onednn.settings import OnednnSettings

RUNTIME = VendorRuntime(
    name="dnnl",
    codegen=onednn_library(),
    settings=OnednnSettings(),
    unavailable=lambda: None if library.installed() else f"oneDNN is not installed ({library.RUNTIME_PACKAGE}): pip install 'byoc[dnnl]'",
)
