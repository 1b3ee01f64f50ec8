"""PyTorch modules imported directly, without an ONNX file: `torch.export`, then TVM's own
PyTorch frontend (`from_exported_program`), with what the ONNX path gives:

- every binding named after the module it comes from (`encoder.layer.0.attention.query.linear`),
  so reports and errors name the model's parts, as ONNX node names do;
- ops TVM cannot convert refused before conversion, all of them at once, each with its node;
- the same clean-up every backend shares.

A float16 or bfloat16 module is exported as its float32 copy that takes and returns its dtypes
(TVM's frontend multiplies in float32 whatever the operands' dtypes, and fails on a half
module's bias adds): byoc computes such a model in float32 on CPU backends anyway (see
byoc.frontend.float16), as PyTorch's own CPU kernels accumulate half products in float32.

Shapes: the module is compiled for the shapes of `example_inputs`, or, with `dynamic_shapes`
(torch.export's own form, `torch.export.Dim("batch", min=1, max=16)` per dynamic axis), for
every shape in the ranges those dimensions declare: the module's named dimensions are the
Dims' names, as `from_onnx(..., dims=)` gives a file's (see docs/shapes.md).
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from byoc.errors import ModelLoadError, one_line
from byoc.frontend.bounded_slices import bound_slices
from byoc.frontend.cleanup import cleanup
from byoc.frontend.naming import named_module
from byoc.ir.dims import DimRange, dim_range, with_dims
from byoc.ir.outputs import with_output_names
from byoc.ir.shape_checks import with_shape_checks


def _torch():
    try:
        import torch
    except ImportError:
        raise ModelLoadError("from_torch needs PyTorch: pip install 'byoc[torch]'") from None
    return torch


# The attribute that holds a half module's float32 copy in the module exported for it; names
# leave it out.
_WIDENED = "float32_copy"


def _qualified_name(node) -> str:
    """The innermost module of `node` and the node's own name: `fc1.linear`."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    path = "" if path == _WIDENED else path.removeprefix(f"{_WIDENED}.")
    return f"{path}.{node.name}" if path else node.name


def _in_float32(module: Any, torch: Any) -> Any:
    """`module` itself, or, where its weights are float16 or bfloat16, a module that computes
    with a float32 copy of them: it takes inputs of that dtype, and returns its results in it."""
    narrow = {t.dtype for t in (*module.parameters(), *module.buffers()) if t.dtype in (torch.float16, torch.bfloat16)}
    if not narrow:
        return module
    if len(narrow) > 1:
        raise ModelLoadError(f"{type(module).__name__} mixes float16 and bfloat16 weights; convert it to one of them")
    dtype = narrow.pop()
    pytree = torch.utils._pytree

    def forward(self, *args, **kwargs):
        wide = pytree.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == dtype else t, (args, kwargs))
        result = getattr(self, _WIDENED)(*wide[0], **wide[1])
        return pytree.tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t, result)

    # torch.export binds inputs (and dynamic_shapes) by the names the module's forward takes.
    signature = inspect.signature(module.forward)
    forward.__signature__ = signature.replace(parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                                          *signature.parameters.values()])
    wrapper = type(type(module).__name__, (torch.nn.Module,), {"forward": forward})()
    setattr(wrapper, _WIDENED, copy.deepcopy(module).float().eval())
    return wrapper


# Arithmetic whose Python int operand torch promotes to a float tensor's dtype (EdgeNeXt's
# `x // 2` on float positions); TVM's converters make the int a tensor of its own dtype and refuse
# the mix.
_PROMOTING = frozenset({"add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "maximum",
                        "minimum"})


def _promote_int_scalars(node: Any, op: str) -> None:
    """Make the Python int operands of a float result's arithmetic floats, as torch computes them."""
    value = node.meta.get("val") if hasattr(node, "meta") else None
    if op.split(".")[0] not in _PROMOTING or not getattr(getattr(value, "dtype", None), "is_floating_point", False):
        return
    if any(isinstance(arg, int) and not isinstance(arg, bool) for arg in node.args[:2]):
        node.args = tuple(float(arg) if i < 2 and isinstance(arg, int) and not isinstance(arg, bool) else arg
                          for i, arg in enumerate(node.args))


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
                _promote_int_scalars(node, op)
                try:
                    result = convert(node, *args)
                except Exception as error:
                    raise ModelLoadError(f"cannot convert torch node {name!r} ({op}): {one_line(error)}") from error
                if isinstance(result, relax.Var):
                    self.node_of_var.setdefault(result.id_, name)
                return result

            return converted

    return NamingImporter()


def from_torch(module: Any, example_inputs: Sequence[Any] | Mapping[str, Any], clean: bool = True,
               dynamic_shapes: Any = None) -> tvm.IRModule:
    """Convert a `torch.nn.Module` (in eval mode) to a Relax module for the shapes of
    `example_inputs` (tensors by position, or by the names `forward` takes: a Hugging Face
    model's `input_ids`, `attention_mask`), weights bound as constants, then apply the graph
    clean-up every backend shares.

    `dynamic_shapes` is torch.export's: for each input, {axis: torch.export.Dim(name, min=,
    max=)}. Each Dim needs a `max`; the module is then compiled for every shape in range, its
    dimensions named after the Dims."""
    torch = _torch()
    label = type(module).__name__
    module.eval()
    try:
        with torch.no_grad():
            args, kwargs = ((), dict(example_inputs)) if isinstance(example_inputs, Mapping) else (tuple(example_inputs), None)
            program = torch.export.export(_in_float32(module, torch), args, kwargs=kwargs,
                                          dynamic_shapes=dynamic_shapes).run_decompositions()
    except Exception as error:
        # A transformers model built with its default config returns its key/value cache,
        # which torch.export cannot flatten.
        hint = "; pass use_cache=False among the inputs" if "cache_utils" in str(error) else ""
        if "DataDependent" in type(error).__name__ or "data-dependent" in str(error):
            # A detector's box count, a k computed from the data: torch.export's limit, not the model's.
            hint = ("; its shapes depend on its data, which torch.export cannot trace: export it with torch.onnx.export and "
                    "import the file with byoc.from_onnx")
        raise ModelLoadError(f"torch.export could not export {label}: {one_line(error)}{hint}") from error
    _drop_constant_inputs(program, label, torch)
    renames, ranges = _dimensions(program, dynamic_shapes, label) if dynamic_shapes is not None else ({}, {})
    importer = _importer()
    refused = [(_qualified_name(node), node.target.__name__) for node in program.graph.nodes
               if node.op == "call_function" and node.target.__name__ not in importer.convert_map]
    if refused:
        listed = "; ".join(f"node {name!r} ({op})" for name, op in refused[:10])
        more = f"; and {len(refused) - 10} more" if len(refused) > 10 else ""
        raise ModelLoadError(f"{label} has ops TVM's PyTorch frontend cannot convert: {listed}{more}")

    mod = named_module(lambda: importer.from_exported_program(program, False, True, False, None), importer.node_of_var, label,
                       clean=False)
    if ranges:  # torch's symbols renamed after the Dims, and the shape arithmetic their ranges settle
        mod["main"] = mod["main"].bind_symbolic_vars({old: tvm.tirx.Var(new, "int64") for old, new in renames.items()})
        mod = with_dims(bound_slices(mod, ranges), ranges)
    mod = with_output_names(mod, _output_names(program, torch))
    return with_shape_checks(with_dims(cleanup(mod), ranges) if clean else mod)


def _output_names(program: Any, torch: Any) -> list[str]:
    """The module's names for its outputs, as its result holds them (a transformers model's
    `last_hidden_state`, `pooler_output`; `logits.0` for a tuple in a dict); a plain tensor or
    tuple has none."""
    pytree = torch.utils._pytree
    spec = program.call_spec.out_spec
    leaves = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))[0]
    names = [".".join(key or index for key, index in re.findall(r"\['([^']*)'\]|\[(\d+)\]", pytree.keystr(path)))
             for path, _ in leaves]
    return names if any(not name.isdigit() for name in names) else []


def _drop_constant_inputs(program: Any, label: str, torch: Any) -> None:
    """Drop the inputs that are not tensors (`use_cache=False`, `output_hidden_states=None`, as
    Hugging Face models are called): torch.export specialises the graph on their values and keeps
    them as placeholders nothing reads, which TVM's frontend cannot convert."""
    user_input = torch.export.graph_signature.InputKind.USER_INPUT
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    kept = []
    for spec in program.graph_signature.input_specs:
        node = placeholders.get(spec.arg.name)
        if spec.kind is not user_input or node is None or isinstance(node.meta.get("val"), torch.Tensor):
            kept.append(spec)
        elif node.users:
            raise ModelLoadError(f"{label}: input {spec.arg.name!r} is {node.meta.get('val')!r}, not a tensor, and the graph reads it;"
                                 " pass it as a tensor")
        else:
            program.graph.erase_node(node)
    program.graph_signature.input_specs[:] = kept


def _dims_of_spec(spec: Any) -> list[tuple[Any, int, Any]]:
    """(input key, axis, Dim) for every Dim in a dynamic_shapes spec: a dict by input name, or
    a tuple by position, of {axis: Dim} (or a list of Dim-or-None per axis)."""
    found = []
    entries = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
    for key, axes in entries:
        if axes is None:
            continue
        pairs = axes.items() if isinstance(axes, Mapping) else enumerate(axes)
        for axis, dim in pairs:
            if dim is not None and hasattr(dim, "__name__") and not isinstance(dim, int):
                found.append((key, int(axis), dim))
    return found


def _dimensions(program, spec: Any, label: str) -> tuple[dict[str, str], dict[str, DimRange]]:
    """torch's symbols (`s77`) renamed to the Dims' names, and each name's range."""
    import torch

    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"
                    and node.name in set(program.graph_signature.user_inputs)]
    by_name = {node.name: node for node in placeholders}
    renames: dict[str, str] = {}
    ranges: dict[str, DimRange] = {}
    for key, axis, dim in _dims_of_spec(spec):
        node = by_name.get(key) if isinstance(key, str) else (placeholders[key] if key < len(placeholders) else None)
        value = node.meta.get("val") if node is not None else None
        if value is None or axis >= value.dim():
            raise ModelLoadError(f"{label}: dynamic_shapes names axis {axis} of input {key!r}, which the module does not have")
        size = value.shape[axis]
        if not isinstance(size, torch.SymInt):
            raise ModelLoadError(f"{label}: torch.export made axis {axis} of input {key!r} ({dim.__name__}) static "
                                 f"({int(size)}): the module does not allow it to vary")
        name, high = dim.__name__, getattr(dim, "max", None)
        if high is None or high >= 2**62:
            raise ModelLoadError(f"{label}: dimension {name!r} needs a maximum: torch.export.Dim({name!r}, max=...)")
        try:
            ranges[name] = dim_range(name, (max(int(getattr(dim, "min", 1) or 1), 1), int(high)))
        except ValueError as error:
            raise ModelLoadError(f"{label}: {error}") from None
        renames[str(size.node.expr)] = name
    return renames, ranges
