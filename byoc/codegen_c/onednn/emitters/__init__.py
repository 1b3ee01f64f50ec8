"""C emitters for oneDNN primitives: one per kernel kind, each a call sequence of the oneDNN C
API (v3). Primitives, and weights reordered into the layout the primitive chose, are created once
at initialisation; a call only sets data handles and executes.

One module per kind of op: `products` (convolutions, matrix products), `elementwise`
(element-wise, binary, selections, poolings, reductions), `normalization` (softmax, layer and RMS
norms, rotary embeddings), `movement` (concatenations, splits, slices, reshapes, transposes,
reorders); `shared` holds what they share (fused post-ops, the layout policy, kernels chosen when
they are made)."""

from byoc.codegen_c.onednn.emitters.elementwise import REDUCTIONS, binary, eltwise, pooling, reduction, resize, select
from byoc.codegen_c.onednn.emitters.movement import (
    broadcast_to,
    concat,
    pad,
    permute_dims,
    reorder,
    repeat,
    reshape,
    split,
    strided_slice,
    take,
)
from byoc.codegen_c.onednn.emitters.normalization import group_norm, layer_norm, rms_norm, rotary, softmax
from byoc.codegen_c.onednn.emitters.products import SIZED_PRODUCT_MACS, convolution, deconvolution, dynamic_convolution, dynamic_dense, matmul
from byoc.codegen_c.onednn.emitters.shared import GELU_FORMS, LOOP_BINARY, RESHAPES, SMALL_ROWS, VIEWS
from byoc.codegen_c.onednn.settings import LAYOUT_POLICIES

__all__ = [
    "GELU_FORMS", "LAYOUT_POLICIES", "LOOP_BINARY", "REDUCTIONS", "RESHAPES", "SIZED_PRODUCT_MACS", "SMALL_ROWS", "VIEWS", "binary",
    "broadcast_to", "concat", "convolution", "deconvolution", "dynamic_convolution", "dynamic_dense", "eltwise", "group_norm", "layer_norm", "matmul", "pad",
    "permute_dims", "pooling", "reduction", "reorder", "repeat", "reshape", "resize", "rms_norm", "rotary", "select", "softmax", "split", "strided_slice",
    "take",
]
