"""Accelerator-specific processing (paper section 3.2), applied inside regions: partial
quantization with calibration, layout transformation, casting to float16, int8 activations made
uint8, int8 kernels that would saturate computed in float32. One step takes the whole model,
before partitioning: `quantize_model`, for `precision="int8"`."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "to_float16": "byoc.processing.cast",
    "to_nhwc": "byoc.processing.layout",
    **dict.fromkeys(["Float16Pass", "Int8InFloat32Pass", "LayoutPass", "QuantizePass", "RegionContext", "RegionPass",
                     "UnsignedActivationsPass"], "byoc.processing.passes"),
    **dict.fromkeys(["CALIBRATION_ATTR", "QuantizationConfig", "RegionCalibration", "quantize_graph"], "byoc.processing.quantize"),
})

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
