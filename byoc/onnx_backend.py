"""byoc as an ONNX backend: `onnx.backend.base.Backend`, bound to a list of vendors.

This is the interface that onnx's backend test suite (`onnx.backend.test.BackendTest`) and
other tools drive, the one onnxruntime implements. A model is imported, partitioned for the
vendors, built and run; the host takes whatever no vendor does.

    from byoc.onnx_backend import backend_for
    dnnl = backend_for("dnnl")
    outputs = dnnl.run_model(model, [x])
    rep = dnnl.prepare(model)          # compiled once per input specialisation, then reused
    outputs = rep.run([x])

byoc compiles for static shapes: a model with dynamic input dimensions, or whose inputs decide
the shapes of results (see `byoc.frontend.onnx.specialize`), is compiled when it first runs,
for the shapes and values it is run with, and again for each new specialisation. Inputs named
in `prepare(..., constant_inputs=[...])` are specialised on their values the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from byoc.flow import partition_for
from byoc.frontend import from_onnx, load_onnx_model
from byoc.frontend.onnx.graph_inputs import bind_inputs
from byoc.frontend.onnx.specialize import Specialization, arrange, has_dynamic_shape, runtime_inputs, shape_operands, specialize
from byoc.runtime_metadata.build import build
from byoc.runtime_metadata.model import CompiledModel

DEVICES = ("CPU",)


class ByocRep(BackendRep):
    """A prepared model: compiled for each specialisation it meets, then run. A `calibration`
    option (for vendors that quantize at compile time) gives model inputs as `run` takes them:
    by ONNX input name or by position."""

    def __init__(self, model: onnx.ModelProto, vendors: tuple[str, ...], options: Mapping[str, Any],
                 constant_inputs: Sequence[str] = (), strict: bool = False) -> None:
        self.model = model
        self.strict = strict
        self.vendors = vendors
        self.options = dict(options)
        self.constant_inputs = tuple(constant_inputs)
        self.output_names = [value.name for value in model.graph.output]
        self._compiled: dict[tuple, tuple[CompiledModel, list[str]]] = {}
        self._lock = threading.Lock()
        if not self.constant_inputs and not shape_operands(model) and not any(has_dynamic_shape(v) for v in runtime_inputs(model)):
            self._compile(Specialization({}, {}))

    def _compile(self, spec: Specialization) -> tuple[CompiledModel, list[str]]:
        key = spec.key()
        with self._lock:
            if key not in self._compiled:
                mod = from_onnx(self.model, shapes=spec.shapes, constants=spec.constants)
                fed = [v.name for v in bind_inputs(self.model, spec.constants).graph.input]
                options = dict(self.options)
                if options.get("calibration") is not None:
                    options["calibration"] = [self._positional(sample, fed) for sample in options["calibration"]]
                partitioned = partition_for(mod, list(self.vendors), **options) if self.vendors else mod
                self._compiled[key] = (build(partitioned, strict=self.strict), fed)
            return self._compiled[key]

    def _positional(self, sample: Sequence | Mapping, fed: list[str]) -> list[np.ndarray]:
        """A calibration sample given as the model's inputs are (by ONNX name or position),
        as the compiled model takes it."""
        named = arrange(self.model, sample)
        return [named[name] for name in fed]

    def compiled(self, inputs: Sequence | Mapping) -> CompiledModel:
        """The compiled model these inputs run on (compiling it if need be)."""
        return self._compile(specialize(self.model, arrange(self.model, inputs), self.constant_inputs))[0]

    def run(self, inputs: Sequence | Mapping | np.ndarray, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        named = arrange(self.model, inputs)
        compiled, fed = self._compile(specialize(self.model, named, self.constant_inputs))
        outputs = compiled.run(*(named[name] for name in fed))
        return namedtupledict("Outputs", self.output_names)(*outputs)


class ByocBackend(Backend):
    """The ONNX backend for `vendors` (class attribute; see `backend_for`). With no vendor the
    whole model runs on the host."""

    vendors: tuple[str, ...] = ()
    options: Mapping[str, Any] = {}
    strict: bool = False  # a region whose code generation or engine fails is an error, not a fall-back

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0] in DEVICES

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", constant_inputs: Sequence[str] = (), **kwargs: Any) -> ByocRep:
        """`constant_inputs` are bound to the values they are first run with (weights that a
        model feeds as inputs, say), like the inputs that decide shapes; other keyword
        arguments are partition options."""
        if not cls.supports_device(device):
            raise ValueError(f"byoc runs models on {', '.join(DEVICES)}, not {device!r}")
        return ByocRep(load_onnx_model(model), cls.vendors, {**cls.options, **kwargs}, constant_inputs, cls.strict)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node: it is wrapped in a model whose inputs take the given arrays."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        arrays = [np.asarray(a) for a in (inputs.values() if isinstance(inputs, Mapping) else inputs)]
        names = [name for name in node.input if name]
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                        for n, a in zip(names, arrays)]
        opset = kwargs.pop("opset_version", None)
        if outputs_info is not None:
            graph_outputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(d)), s)
                             for n, (d, s) in zip(node.output, outputs_info)]
        else:
            schema = onnx.defs.get_schema(node.op_type, opset or onnx.defs.onnx_opset_version(), node.domain)
            types = onnx.shape_inference.infer_node_outputs(schema, node, {v.name: v.type for v in graph_inputs})
            graph_outputs = [onnx.helper.make_value_info(n, types[n]) for n in node.output if n in types]
        graph = onnx.helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        imports = [onnx.helper.make_opsetid("", opset)] if opset else None
        model = onnx.helper.make_model(graph, opset_imports=imports) if imports else onnx.helper.make_model(graph)
        return cls.prepare(model, device, **kwargs).run(arrays)


def backend_for(vendors: str | Sequence[str] = (), strict: bool = False, **options: Any) -> type[ByocBackend]:
    """An ONNX backend class bound to `vendors` (priority order) and partition `options`; with
    `strict`, builds fail where a region would fall back to the host (see `byoc.build`)."""
    names = (vendors,) if isinstance(vendors, str) else tuple(vendors)
    label = "_".join(names) or "host"
    return type(f"ByocBackend_{label}", (ByocBackend,), {"vendors": names, "options": dict(options), "strict": strict})


prepare = ByocBackend.prepare
run_model = ByocBackend.run_model
run_node = ByocBackend.run_node
supports_device = ByocBackend.supports_device
