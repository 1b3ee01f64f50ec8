"""Code that stays on the host: TVM's legalizations, with faster kernels where TVM's generic CPU
ones cost more than onnxruntime would for the same op (see `kernels.HOST_LEGALIZATIONS`)."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(["HOST_LEGALIZATIONS", "host_pipeline"], "byoc.host.kernels"))

__all__ = ["HOST_LEGALIZATIONS", "host_pipeline"]
