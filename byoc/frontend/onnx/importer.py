"""Reading ONNX models into Relax with every binding named after the ONNX node it came from.

TVM's ONNX frontend names bindings `lv`, `lv1`, ..., which makes partition reports and error
messages useless to someone who knows the model by its node names. The importer below emits
each node's result under the node's name; bindings that TVM's normaliser creates while a node
is converted (a Conv with bias becomes conv2d + add, say) are then given the same name.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

from byoc.errors import ModelLoadError
from byoc.frontend.naming import named_module
from byoc.frontend.onnx.checker import check_model
from byoc.frontend.onnx.contrib_ops import standard_form
from byoc.frontend.onnx.converters import CONVERTERS
from byoc.frontend.onnx.data_dependent import cut_data_dependent
from byoc.frontend.onnx.evaluate_constants import fold_onnx_constants
from byoc.frontend.onnx.fold_affine import fold_batch_norms
from byoc.frontend.onnx.fold_dense_norm import fold_batch_norms_after_dense
from byoc.frontend.onnx.graph_inputs import bind_inputs
from byoc.frontend.onnx.index_operands import mark_shape_only
from byoc.frontend.onnx.input_shapes import static_input_shapes
from byoc.frontend.onnx.lost_scales import warn_lost_scales
from byoc.frontend.onnx.nbits import dequantized_weights
from byoc.frontend.onnx.node_names import named_nodes
from byoc.frontend.onnx.node_order import topologically_sorted
from byoc.frontend.onnx.qoperator import qdq_form
from byoc.frontend.onnx.support import expand, unsupported_ops
from byoc.ir.dim_bounds import narrowed_to_table_bounds
from byoc.ir.dims import with_dims
from byoc.ir.ignored_inputs import with_ignored_inputs
from byoc.ir.outputs import with_input_names, with_output_names
from byoc.ir.same_dims import unified_dims
from byoc.ir.shape_checks import with_shape_checks
from byoc.ir.tail import ModelTail, with_tail
from byoc.ir.types import tensor_types


class _NamingImporter(ONNXGraphImporter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.node_of_var: dict[int, str] = {}
        self.original_names: dict[str, str] = {}  # sanitized input name -> the file's
        # Shape values that Tile takes as its repeats: TVM refuses a shape value as any input of
        # Tile before converting it, so the value is handed over as a tensor, and byoc's Tile
        # reads the shape back (DeBERTa repeats its relative positions over the batch).
        self.tile_repeats: set[str] = set()  # names of the nodes whose first output is such a value
        self.shape_of_tensor: dict[int, relax.Expr] = {}  # tensor var -> the shape value it carries

    def from_onnx(self, graph, opset):
        repeats = {node.input[1] for node in graph.node if node.op_type == "Tile" and len(node.input) > 1}
        # Told apart by name in `_convert_operator` (every node has one: see node_names).
        self.tile_repeats = {node.name for node in graph.node if node.output and node.output[0] in repeats}
        return super().from_onnx(graph, opset)

    def _sanitize_name(self, name: str) -> str:
        with warnings.catch_warnings():  # "Renaming name ...": the compiled model keeps the file's names
            warnings.simplefilter("ignore")
            new_name = super()._sanitize_name(name)
        if new_name != name:
            self.original_names[new_name] = name
        return new_name

    def _tvm_converter(self, op_name: str, inputs, attrs):
        """TVM's converter for `op_name`, for byoc converters that build on it."""
        return ONNXGraphImporter._convert_operator(self, op_name, inputs, attrs, self.opset)

    def _convert_operator(self, op_name, inputs, attrs, opset):
        node_name = attrs.get("tvm_custom", {}).get("name") or op_name
        try:
            result = self._converted(op_name, inputs, attrs, opset)
        except Exception as error:
            result = self._in_float32(op_name, inputs, attrs, opset)
            if result is None:
                raise ModelLoadError(f"cannot convert ONNX node {node_name!r} ({op_name}): {error}") from error
        if node_name in self.tile_repeats and isinstance(getattr(result, "ty", None), relax.ShapeType):
            shape = result
            result = self.bb.emit(relax.op.shape_to_tensor(result), name_hint=node_name)
            self.shape_of_tensor[result.id_] = shape
        if isinstance(result, (relax.Call, relax.TupleGetItem)):
            result = self.bb.emit(result, name_hint=node_name)
        if isinstance(result, relax.Var) and not any(result.same_as(i) for i in inputs if i is not None):
            self.node_of_var.setdefault(result.id_, node_name)
        return result

    def _converted(self, op_name: str, inputs, attrs, opset) -> relax.Expr:
        """byoc's converter of `op_name` where it has one that takes the node, else TVM's."""
        if op_name == "Tile" and getattr(inputs[1], "id_", None) in self.shape_of_tensor:
            inputs = [inputs[0], self.shape_of_tensor[inputs[1].id_]]
        own = CONVERTERS.get(op_name)
        result = own(self.bb, inputs, attrs, opset, self._tvm_converter) if own is not None else None
        return result if result is not None else super()._convert_operator(op_name, inputs, attrs, opset)

    def _in_float32(self, op_name: str, inputs, attrs, opset) -> relax.Expr | None:
        """A float16 (or bfloat16) node whose converter failed, converted on its inputs cast to
        float32, its result cast back: TVM's converters of Elu, Selu, HardSigmoid and others write
        their constants in float32, which float16 operands refuse. None where that fails too."""
        kinds = {str(t.dtype) for i in inputs if i is not None for t in tensor_types(i.ty)} & {"float16", "bfloat16"}
        if len(kinds) != 1:
            return None
        half = kinds.pop()
        narrow = [i is not None and [str(t.dtype) for t in tensor_types(i.ty)] == [half] for i in inputs]
        wide = [self.bb.emit(relax.op.astype(i, "float32")) if n else i for i, n in zip(inputs, narrow)]
        try:
            result = self.bb.normalize(self._converted(op_name, wide, attrs, opset))
        except Exception:
            return None
        if [str(t.dtype) for t in tensor_types(result.ty)] != ["float32"]:
            return None
        return relax.op.astype(result, half)


def load_onnx_model(source: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """Read and check an ONNX model, naming the file and the cause on failure."""
    if isinstance(source, onnx.ModelProto):
        model, label = source, f"model {source.graph.name!r}"
    else:
        label = f"ONNX file {os.fspath(source)!r}"
        try:
            model = onnx.load(os.fspath(source))
        except FileNotFoundError:
            raise ModelLoadError(f"cannot read {label}: no such file") from None
        except Exception as error:  # protobuf raises DecodeError and friends
            raise ModelLoadError(f"cannot read {label}: not a valid ONNX model ({error})") from error
    # Before the check: onnxruntime writes SimplifiedLayerNormalization in the ONNX domain, and
    # its float16 converter writes graphs out of order.
    model = named_nodes(dequantized_weights(standard_form(topologically_sorted(model))))
    try:
        check_model(model)
    except onnx.checker.ValidationError as error:
        first_line = str(error).strip().splitlines()[0]
        raise ModelLoadError(f"{label} is malformed: {first_line}") from error
    if not model.graph.node:
        raise ModelLoadError(f"{label} has no nodes")
    return model


def from_onnx(
    source: str | os.PathLike | onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None = None,
    clean: bool = True,
    constants: Mapping[str, object] | None = None,
    dims: Mapping[str, object] | None = None,
) -> tvm.IRModule:
    """Convert an ONNX model (a path or a ModelProto) to a Relax module with weights bound as
    constants, then apply the graph clean-up every backend shares.

    `shapes` fixes the shapes of inputs with dynamic dimensions. `dims` instead keeps named
    dynamic dimensions (the file's `dim_param`s) symbolic, each with the range of values the
    compiled model will take: `dims={"batch": (1, 16), "sequence": (1, 512)}` (a third value,
    `(low, opt, high)`, is the shape partitioning decides for; by default the highest).
    `constants` binds inputs to fixed values (and overrides initializers), which makes them
    constants of the model. Inputs that have an initializer are constants; inputs that no node
    reads are dropped (the compiled model takes a value for them by name and ignores it).
    """
    loaded = load_onnx_model(source)
    model = qdq_form(bind_inputs(loaded, constants))
    kept = {value.name for value in model.graph.input} | {init.name for init in loaded.graph.initializer} | set(constants or ())
    ignored = [value.name for value in loaded.graph.input if value.name not in kept]
    warn_lost_scales(model)
    input_shapes, ranges = static_input_shapes(model, shapes or {}, dims)
    refused = unsupported_ops(model)
    if refused:
        listed = "; ".join(f"node {name!r} ({op}): {why}" for name, op, why in refused[:10])
        more = f"; and {len(refused) - 10} more" if len(refused) > 10 else ""
        raise ModelLoadError(f"model {model.graph.name!r} has ops the ONNX frontend cannot import: {listed}{more}")
    model = expand(model)
    model = mark_shape_only(fold_batch_norms_after_dense(fold_batch_norms(fold_onnx_constants(model, input_shapes))))
    label = f"model {model.graph.name!r}"
    try:
        mod, tail = _converted(model, input_shapes, ranges, clean, label), None
    except ModelLoadError as error:
        mod, tail = _head_and_tail(model, input_shapes, ranges, clean, label, error)
    mod = with_ignored_inputs(with_shape_checks(narrowed_to_table_bounds(unified_dims(mod, label), label)), ignored)
    return with_tail(mod, tail) if tail is not None else mod


def _converted(model: onnx.ModelProto, input_shapes: Mapping[str, list], ranges: Mapping, clean: bool, label: str) -> tvm.IRModule:
    """`model` through TVM's importer with byoc's converters, its bindings named after the
    model's nodes, its outputs and inputs after the model's."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    variables = {name: tvm.tirx.Var(name, "int64") for name in ranges}
    relax_shapes = {name: [variables[d] if isinstance(d, str) else d for d in dims] for name, dims in input_shapes.items()}
    importer = _NamingImporter(relax_shapes, "float32", keep_params_in_input=False, sanitize=True)
    _declare_input_dtypes(importer, model)
    mod = named_module(lambda: with_dims(importer.from_onnx(model.graph, opset), ranges), importer.node_of_var, label, clean)
    return with_input_names(with_output_names(with_dims(mod, ranges), [value.name for value in model.graph.output]), importer.original_names)


def _head_and_tail(model: onnx.ModelProto, input_shapes: Mapping[str, list], ranges: Mapping, clean: bool, label: str,
                   error: ModelLoadError) -> tuple[tvm.IRModule, ModelTail]:
    """A model TVM's importer refused whole, where its shapes come to depend on its data: its head
    converted, and its tail to run in onnxruntime (see byoc.frontend.onnx.data_dependent). Where
    no shape depends on the data, the importer's error stands."""
    try:
        cut = cut_data_dependent(model)
    except ValueError:  # a tensor whose type onnx cannot infer: the importer's error says more
        cut = None
    if cut is None:
        raise error
    why = f"{cut.why}, and every shape after it depends on the data (TVM's importer refused the whole model: {error})"
    tail = ModelTail(cut.tail.SerializeToString(), cut.first, why, cut.nodes, tuple(v.name for v in cut.tail.graph.input),
                     tuple(v.name for v in cut.tail.graph.output))
    try:
        return _converted(cut.head, input_shapes, ranges, clean, label), tail
    except ModelLoadError:
        raise error from None  # the head fails too: the whole model's error names the first cause


def _declare_input_dtypes(importer: ONNXGraphImporter, model: onnx.ModelProto) -> None:
    importer._dtype = {
        value.name: onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name for value in model.graph.input
    }
