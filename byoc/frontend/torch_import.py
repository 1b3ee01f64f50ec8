"""PyTorch modules imported directly, without an ONNX file: `torch.export`, then TVM's own
PyTorch frontend (`from_exported_program`), with what the ONNX path gives:

- every binding named after the module it comes from (`encoder.layer.0.attention.query.linear`),
  so reports and errors name the model's parts, as ONNX node names do;
- ops TVM cannot convert refused before conversion, all of them at once, each with its node;
- the same clean-up every backend shares.

Static shapes: the module is compiled for the shapes of `example_inputs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from byoc.errors import ModelLoadError, one_line
from byoc.frontend.naming import named_module


def _torch():
    try:
        import torch
    except ImportError:
        raise ModelLoadError("from_torch needs PyTorch: pip install 'byoc[torch]'") from None
    return torch


def _qualified_name(node) -> str:
    """The innermost module of `node` and the node's own name: `fc1.linear`."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    return f"{path}.{node.name}" if path else node.name


def _importer():
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    class NamingImporter(ExportedProgramImporter):
        """Records which FX node made each variable, and names the node in conversion errors."""

        def __init__(self) -> None:
            super().__init__()
            self.node_of_var: dict[int, str] = {}
            self.convert_map = {name: self._naming(name, convert) for name, convert in self.convert_map.items()}

        def _naming(self, op: str, convert):
            def converted(node, *args):
                name = _qualified_name(node)
                try:
                    result = convert(node, *args)
                except Exception as error:
                    raise ModelLoadError(f"cannot convert torch node {name!r} ({op}): {one_line(error)}") from error
                if isinstance(result, relax.Var):
                    self.node_of_var.setdefault(result.id_, name)
                return result

            return converted

    return NamingImporter()


def from_torch(module: Any, example_inputs: Sequence[Any] | Mapping[str, Any], clean: bool = True) -> tvm.IRModule:
    """Convert a `torch.nn.Module` (in eval mode) to a Relax module for the shapes of
    `example_inputs` (tensors by position, or by the names `forward` takes: a Hugging Face
    model's `input_ids`, `attention_mask`), weights bound as constants, then apply the graph
    clean-up every backend shares."""
    torch = _torch()
    label = type(module).__name__
    module.eval()
    try:
        with torch.no_grad():
            args, kwargs = ((), dict(example_inputs)) if isinstance(example_inputs, Mapping) else (tuple(example_inputs), None)
            program = torch.export.export(module, args, kwargs=kwargs).run_decompositions()
    except Exception as error:
        raise ModelLoadError(f"torch.export could not export {label}: {one_line(error)}") from error
    importer = _importer()
    refused = [(_qualified_name(node), node.target.__name__) for node in program.graph.nodes
               if node.op == "call_function" and node.target.__name__ not in importer.convert_map]
    if refused:
        listed = "; ".join(f"node {name!r} ({op})" for name, op in refused[:10])
        more = f"; and {len(refused) - 10} more" if len(refused) > 10 else ""
        raise ModelLoadError(f"{label} has ops TVM's PyTorch frontend cannot convert: {listed}{more}")
    return named_module(lambda: importer.from_exported_program(program, False, True, False, None), importer.node_of_var, label, clean)
