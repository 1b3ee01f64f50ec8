"""Accelerator-specific processing (paper section 3.2), applied inside regions: partial
quantization with calibration, layout transformation, casting to float16, int8 activations made
uint8, int8 kernels that would saturate computed in float32. One step takes the whole model,
before partitioning: `quantize_model`, for `precision="int8"`."""

from byoc.processing.cast import to_float16
from byoc.processing.layout import to_nhwc
from byoc.processing.passes import Float16Pass, Int8InFloat32Pass, LayoutPass, QuantizePass, RegionContext, RegionPass, UnsignedActivationsPass
from byoc.processing.quantize import CALIBRATION_ATTR, QuantizationConfig, RegionCalibration, quantize_graph

__all__ = [
    "CALIBRATION_ATTR",
    "Float16Pass",
    "Int8InFloat32Pass",
    "LayoutPass",
    "QuantizationConfig",
    "QuantizePass",
    "RegionCalibration",
    "RegionContext",
    "RegionPass",
    "UnsignedActivationsPass",
    "quantize_graph",
    "to_float16",
    "to_nhwc",
]
