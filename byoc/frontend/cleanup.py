"""The graph-level clean-up every backend shares, run once before partitioning."""

from __future__ import annotations

import tvm
from tvm import relax

from byoc.frontend.fold_constants import fold_constants_numpy, fold_constants_tvm
from byoc.frontend.int8_weights import keep_weights
from byoc.frontend.reshapes import fold_moves, fold_reshapes
from byoc.frontend.simplify import simplify


def cleanup(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold constants, decompose what inference does not need, drop dead code.

    Batch norms that follow a convolution were folded on the ONNX graph already; any other is
    decomposed into multiply/add here, so that no backend sees a training-style batch_norm tuple.
    A quantized model's weights stay int8 behind their dequantize (see byoc.frontend.int8_weights).
    """
    passes = tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            tvm.transform.module_pass(lambda mod, _ctx: fold_constants_numpy(mod), opt_level=0, name="FoldConstantsNumpy"),
            tvm.transform.module_pass(lambda mod, _ctx: fold_constants_tvm(mod), opt_level=0, name="FoldConstantsTVM"),
            tvm.transform.module_pass(lambda mod, _ctx: simplify(mod), opt_level=0, name="SimplifyExports"),
            relax.transform.CanonicalizeBindings(),
            tvm.transform.module_pass(lambda mod, _ctx: fold_reshapes(mod), opt_level=0, name="FoldReshapes"),
            tvm.transform.module_pass(lambda mod, _ctx: fold_moves(mod), opt_level=0, name="FoldMoves"),
            relax.transform.DeadCodeElimination(["main"]),
        ]
    )
    return keep_weights(passes)(mod)
