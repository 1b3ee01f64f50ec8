"""Quantization scales that lose every value they quantize.

onnxruntime's `quantize_static` calibrates each tensor's range from what the model computes. An
exported attention whose masked scores hold the lowest float (GPT-Neo's causal mask) gets a
range as wide as float32 itself, and a scale of inf: every value through that QuantizeLinear
comes back as NaN, in onnxruntime as in any runtime that follows the file. The file is valid
ONNX, so it imports, with a warning that names each such node and says what to do.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import numpy_helper

from byoc.errors import QuantizedModelWarning

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def warn_lost_scales(model: onnx.ModelProto) -> None:
    """Warn, naming the nodes, where a QuantizeLinear or DequantizeLinear has a constant scale
    that is infinite, NaN or zero."""
    constants = {t.name: t for t in model.graph.initializer}
    constants.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"})
    lost = []
    for node in model.graph.node:
        if node.op_type not in _QDQ or len(node.input) < 2 or node.input[1] not in constants:
            continue
        scale = numpy_helper.to_array(constants[node.input[1]]).astype(np.float64)
        bad = scale[~np.isfinite(scale) | (scale == 0)]
        if bad.size:
            lost.append(f"{node.name or node.output[0]!r} ({node.op_type}, scale {bad.flat[0]:g})")
    if lost:
        shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        warnings.warn(f"byoc: model {model.graph.name!r}: {shown}: a scale that is infinite, NaN or zero loses every "
                      "value it quantizes (NaN or inf after dequantizing, in onnxruntime too). A calibrated range that "
                      "takes in an attention mask's fill value does this: quantize the model again without that tensor "
                      "(onnxruntime's nodes_to_exclude).", QuantizedModelWarning, stacklevel=3)
