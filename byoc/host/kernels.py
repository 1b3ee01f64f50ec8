"""Legalizations for the host that replace TVM's default where its CPU kernel is measured slow.

Each entry maps a Relax op to a function with `LegalizeOps`' signature; it handles the cases it
was measured on and hands every other case to TVM's own legalization, so that the host's meaning
never changes, only its speed.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, te, tirx, topi
from tvm.relax.block_builder import BlockBuilder

from byoc.host.half import float_to_half, half_to_float
from byoc.host.indices import check_indices
from byoc.host.nms import all_class_nms_onnx
from byoc.ir.types import constant_array, is_tensor_constant, shape_dims

Legalization = Callable[[BlockBuilder, relax.Call], relax.Expr]


def _tvm_default(op_name: str) -> Legalization:
    return tvm.ir.Op.get(op_name).get_attr("FLegalize")


def _all_class_non_max_suppression(bb: BlockBuilder, call: relax.Call) -> relax.Expr:
    boxes, scores, max_boxes, iou_threshold, score_threshold = call.args
    per_class = constant_array(max_boxes).reshape(-1) if is_tensor_constant(max_boxes) else None
    thresholds_given = all(isinstance(t.ty, relax.TensorType) for t in (iou_threshold, score_threshold))
    if (call.attrs.output_format != "onnx" or per_class is None or per_class.size != 1 or per_class[0] <= 0
            or not thresholds_given or scores.ty.dtype != "float32"):
        return _tvm_default("relax.vision.all_class_non_max_suppression")(bb, call)
    per_class = int(per_class[0])
    result = bb.call_te(all_class_nms_onnx, boxes, scores, per_class, iou_threshold, score_threshold)
    rows = bb.emit(relax.TupleGetItem(result, 0))
    count = bb.emit(relax.TupleGetItem(result, 1))
    # ONNX's output has as many rows as boxes were selected: slice the padded rows to `count`.
    begin = bb.call_te(lambda: te.compute((2,), lambda i: tirx.const(0, "int64"), name="begin"))
    strides = bb.call_te(lambda: te.compute((2,), lambda i: tirx.const(1, "int64"), name="strides"))
    end = bb.call_te(
        lambda n: te.compute((2,), lambda i: tirx.if_then_else(i == 0, n[0], tirx.const(3, "int64")), name="end"), count
    )
    trimmed = bb.emit(relax.op.dynamic_strided_slice(rows, begin, end, strides))
    return relax.Tuple([trimmed, count])


def _erf(bb: BlockBuilder, call: relax.Call) -> relax.Expr:
    """float32 erf as TVM's rational approximation (`topi.fast_erf`, the one its GELU uses),
    which LLVM vectorizes: TVM's default calls libm per element. Measured on 1x128x3072 (one BERT
    layer's GELU, left on the host between the int8 kernels of a quantized BERT): 7.8 ms by default,
    0.44 ms this way, at most 4e-7 from the exact erf (whose values lie in [-1, 1])."""
    if call.args[0].ty.dtype != "float32":
        return _tvm_default("relax.erf")(bb, call)
    return bb.call_te(topi.fast_erf, call.args[0])


def _astype(bb: BlockBuilder, call: relax.Call) -> relax.Expr:
    """float32 to float16 and back in integer arithmetic LLVM vectorizes (see `half`): TVM's
    default calls a library function per element on a CPU without F16C, which the host library
    must run on. Measured on 128 x 50257 float32 (a GPT-2's logits) to float16: 36 ms by
    default."""
    source, target = str(call.args[0].ty.dtype), str(call.attrs.dtype)
    if (source, target) == ("float32", "float16"):
        return bb.call_te(float_to_half, call.args[0])
    if (source, target) == ("float16", "float32"):
        return bb.call_te(half_to_float, call.args[0])
    return _tvm_default("relax.astype")(bb, call)


def _broadcast_to(bb: BlockBuilder, call: relax.Call) -> relax.Expr:
    """An Expand whose input has a dimension that may be 1 or the target's at run time (`a` to
    `b`, which ONNX allows either way): each such dimension's index is 0 where it is 1. TVM's
    kernel assumes it equals the target's, and read past the input where it was 1 (a 2x1
    expanded to 2x7 gave one right column and six of whatever followed). What the two cannot be
    (other sizes) the run refuses before this (see byoc.ir.shape_checks)."""
    data = call.args[0]
    source, target = shape_dims(data.ty), shape_dims(call.ty)
    if source is None or target is None:
        return _tvm_default("relax.broadcast_to")(bb, call)
    offset = len(target) - len(source)
    analyzer = tvm.sym.Analyzer()
    either = [i for i, dim in enumerate(source)
              if not isinstance(dim, tirx.IntImm) and not analyzer.can_prove_equal(dim, target[offset + i])]
    if not either:
        return _tvm_default("relax.broadcast_to")(bb, call)

    def expand(x: te.Tensor) -> te.Tensor:
        def element(*index):
            return x(*[tirx.if_then_else(x.shape[i] == 1, tirx.const(0, index[offset + i].ty.dtype), index[offset + i])
                       if i in either else (tirx.const(0, index[offset + i].ty.dtype) if _is_one(x.shape[i]) else index[offset + i])
                       for i in range(len(source))])
        return te.compute(target, element, name="expand")

    return bb.call_te(expand, data)


def _is_one(dim) -> bool:
    return isinstance(dim, tirx.IntImm) and int(dim.value) == 1


HOST_LEGALIZATIONS: dict[str, Legalization] = {
    "relax.broadcast_to": _broadcast_to,
    "relax.vision.all_class_non_max_suppression": _all_class_non_max_suppression,
    "relax.erf": _erf,
    "relax.astype": _astype,
}


def host_pipeline() -> tvm.transform.Pass:
    """TVM's default build pipeline for `relax.build`, with index operands checked (see
    `indices`) and byoc's kernels legalized first.

    The dispatch passes that TVM runs before legalizing run first here too; the default
    pipeline's own LegalizeOps then finds nothing left. (Not TVM's CPU pipeline with fusion:
    `relax.build` avoids it on CPUs, and its FoldConstant turns the run-time `zeros` that
    stand in for empty constants back into constants the VM cannot load.)
    """
    return tvm.transform.Sequential([
        check_indices,
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        relax.transform.LegalizeOps(HOST_LEGALIZATIONS),
        relax.get_pipeline("default"),
    ])
