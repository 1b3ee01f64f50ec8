"""Code that stays on the host: TVM's legalizations, with faster kernels where TVM's generic CPU
ones cost more than onnxruntime would for the same op (see `kernels.HOST_LEGALIZATIONS`)."""

from byoc.host.kernels import HOST_LEGALIZATIONS, host_pipeline

__all__ = ["HOST_LEGALIZATIONS", "host_pipeline"]
