"""Model frontends: ONNX and PyTorch to Relax with node names kept, and the shared graph clean-up."""

from byoc.frontend.cleanup import cleanup
from byoc.frontend.onnx.importer import from_onnx, load_onnx_model
from byoc.frontend.onnx.support import unsupported_ops
from byoc.frontend.torch import from_torch

__all__ = ["cleanup", "from_onnx", "from_torch", "load_onnx_model", "unsupported_ops"]
