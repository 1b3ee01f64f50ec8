"""Accelerator-specific processing as passes over a region's JSON graph, declared by a backend
(`Backend.processing`) and applied in order at code generation, before the graph is handed to
the backend's format. Only region graphs are touched: the host part never is."""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable
from typing import Any

from byoc.backend.region_pass import Constants, Graph, RegionContext, RegionPass
from byoc.backend.settings import VendorSettings
from byoc.errors import RequantizationWarning, SaturationWarning
from byoc.processing.adopt import adopt_model_quantization, holds_model_quantization, requantization
from byoc.processing.cast import to_float16
from byoc.processing.layout import to_nhwc
from byoc.processing.quantize import CALIBRATION_ATTR, REQUANTIZATION_ATTR, QuantizationConfig, RegionCalibration, quantize_graph
from byoc.processing.saturation import REQUIRES, Saturates, in_float32, saturating_kernels
from byoc.processing.unsigned import int8_activations_to_uint8
from byoc.timing import CPU_FEATURES

__all__ = ["Float16Pass", "Int8InFloat32Pass", "LayoutPass", "QuantizePass", "RegionContext", "RegionPass", "UnsignedActivationsPass", "apply_passes"]


class LayoutPass:
    name = "layout NHWC"

    def __call__(self, graph, constants, context):
        return to_nhwc(graph, constants)


class Float16Pass:
    name = "float16"

    def __call__(self, graph, constants, context):
        return to_float16(graph, constants)


class UnsignedActivationsPass:
    """A quantized model's int8 activations made uint8 where the region keeps them to itself (exact)."""

    name = "uint8 activations"

    def __call__(self, graph, constants, context):
        return int8_activations_to_uint8(graph, constants)


class Int8InFloat32Pass:
    """A quantized model's int8 kernels that would saturate without a CPU feature (`feature`, a
    name in byoc.timing.CPU_FEATURES) computed in float32 where this CPU lacks it, exactly
    (byoc.processing.saturation), with a warning that names them. Where it has the feature, the
    kernels stay int8 and the region's `info` records them under `REQUIRES`: loading the artifact
    on a CPU without the feature warns."""

    name = "int8 in float32 where it saturates"

    def __init__(self, saturates: Saturates, float_pattern: Callable[[str], str | None], keeps_int8: Callable[[Any], bool],
                 feature: str, option: str) -> None:
        # `keeps_int8(settings)`: whether the vendor's settings keep the int8 kernels as they are;
        # `option` is how a user says so, named in the warning
        self.saturates, self.float_pattern, self.keeps_int8 = saturates, float_pattern, keeps_int8
        self.feature, self.option = feature, option

    def __call__(self, graph, constants, context):
        if self.keeps_int8(context.settings):
            return graph, constants
        chosen = saturating_kernels(graph, constants, self.saturates)
        kept = list(chosen.values())
        if CPU_FEATURES[self.feature]():
            if kept:
                context.notes[REQUIRES] = {"feature": self.feature, "kernels": kept}
            return graph, constants
        graph, constants = in_float32(graph, constants, chosen, self.float_pattern)
        if kept:
            more = f" (and {len(kept) - 1} more)" if len(kept) > 1 else ""
            warnings.warn(f"byoc: region {context.symbol} ({context.backend}): {len(kept)} int8 kernel(s) computed in float32 "
                          f"from the model's own weights and scales, exactly but more slowly, because this CPU's int8 kernels "
                          f"would saturate them: {kept[0]}{more}. The build option {self.option}='int8' keeps the int8 kernels, "
                          "which is faster and may lose precision", SaturationWarning, stacklevel=2)
        return graph, constants


class QuantizePass:
    """Partial quantization with a configuration that may depend on the vendor's settings."""

    name = "int8 quantization"

    def __init__(self, config: QuantizationConfig | Callable[[VendorSettings], QuantizationConfig]) -> None:
        self.config = config

    def configure(self, settings: VendorSettings | None) -> QuantizationConfig:
        return self.config(settings) if callable(self.config) else self.config

    def __call__(self, graph, constants, context):
        config = self.configure(context.settings)
        if holds_model_quantization(graph):
            return self._model_quantization(graph, constants, context, config)
        text = context.attrs.get(CALIBRATION_ATTR)
        calibration = RegionCalibration.from_json(text) if text else None
        return quantize_graph(graph, constants, config, calibration)

    @staticmethod
    def _model_quantization(graph, constants, context, config: QuantizationConfig):
        """A quantized model's region, quantized from the model's own scales (byoc.processing.adopt);
        a warning with the error added where the device cannot hold them as they are."""
        region = adopt_model_quantization(graph, constants)
        quantized = quantize_graph(region.graph, region.constants, dataclasses.replace(config, calibration="static"), region.calibration)
        changes = requantization(region, config)
        if not changes.exact:
            form = "symmetric power-of-two scales" if config.power_of_two else "symmetric scales" if config.symmetric else "its scales"
            per = "per channel" if config.per_channel else "per tensor"
            measured = context.attrs.get(REQUANTIZATION_ATTR)
            if measured:
                found = json.loads(measured)
                error = f"it adds {found['relative_l2']:.2%} relative L2 to the region's outputs on {found['samples']} calibration sample(s)"
            else:
                error = "the error it adds is not measured: partition with calibration=[inputs, ...] to measure it"
            warnings.warn(
                f"byoc: region {context.symbol} ({context.backend}): the device needs {form} and weights {per}, so the model's "
                f"quantization is quantized again ({changes.activations} of {changes.activations_total} activation scales, "
                f"steps up to {changes.coarsest:.1f}x coarser; {changes.weights} of {changes.weights_total} weight tensors): "
                f"{error}. Build with strict=True to refuse instead", RequantizationWarning, stacklevel=2)
        return quantized


def apply_passes(processing, graph: Graph, constants: Constants, context: RegionContext) -> tuple[Graph, Constants]:
    from byoc.codegen_json.schema import validate_graph

    for step in processing:
        graph, constants = step(graph, constants, context)
        validate_graph(graph, f"region {context.symbol} ({context.backend}) after {step.name}")
    return graph, constants


def passes_before_quantization(processing: list[RegionPass]) -> list[RegionPass]:
    """The passes a calibration probe applies: quantization's ranges are taken on their output."""
    for position, step in enumerate(processing):
        if isinstance(step, QuantizePass):
            return processing[:position]
    return list(processing)


def default_calibration_method(processing: list[RegionPass], settings: VendorSettings | None) -> str:
    """The calibration method a backend's quantization asks for."""
    for step in processing:
        if isinstance(step, QuantizePass):
            return step.configure(settings).calibration_method
    return "minmax"


def needs_calibration(processing: list[RegionPass], settings: VendorSettings | None = None) -> bool:
    """Whether a backend's processing quantizes with scales from calibration at compile time."""
    return any(isinstance(step, QuantizePass) and step.configure(settings).calibration == "static" for step in processing)
