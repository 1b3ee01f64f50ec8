"""Models that are one region called with the model's inputs: run without the virtual machine.

When the host function only hands the model's inputs to one region and returns that region's
outputs (an ONNX file the onnxruntime vendor takes whole, an exported transformer or a CNN that
dnnl takes whole), the VM adds nothing but its call path: for each run, the VM's call, for an
engine a Python callback and DLPack views of every buffer, and the outputs read back through the
FFI: 20-30 us in all, 5-13% of a tiny model's 0.2-0.5 ms. `CompiledModel.run` then calls the
region directly on buffers it keeps (the same ones run after run, as the VM's are, so an engine
that binds them, like onnxruntime's, binds once): an engine through its runtime, a C region
through its function in the host library.

A model with dynamic dimensions takes the same path where it is one region (see
byoc.runtime_metadata.shapes), with symbolic shapes or generated per shape, and values of its
shape alone: its buffers are kept per shape, sized by the region's shapes at the dimensions the
inputs give, and those values come from the host's once-per-shape function.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import tvm
from tvm import relax

from byoc.codegen_json.symbolic_dims import is_symbolic, names_in
from byoc.runtime_metadata.artifact_types import DirectCall, RegionArtifact
from byoc.runtime_metadata.hoist_shape_values import shape_value_positions


def find_direct_call(mod: tvm.IRModule, regions: Mapping[str, RegionArtifact], region_symbol,
                     per_shape: Collection[str] = ()) -> DirectCall | None:
    """The direct call `mod`'s main function amounts to, or None when it does anything else
    (host ops, several regions, an input passed through). `regions` holds the artifact the host's
    call of each region symbol runs (a region with symbolic shapes: its one variant; a region
    generated per shape, named in `per_shape`: one of its variants, and the call names the
    region, whose variant for each shape is called)."""
    main = mod["main"]
    count = int(main.attrs["num_input"]) if main.attrs is not None and "num_input" in main.attrs else len(main.params)
    params = list(main.params[:count])
    # A model with dynamic dimensions: what depends on its shape alone is computed once per shape
    # (byoc.runtime_metadata.shape_values), and the region may read it.
    dims, computed, value_of = shape_value_positions(main)
    body = main.body
    if not isinstance(body, relax.SeqExpr):
        return None
    call: tuple[str, tuple[int, ...]] | None = None
    values: dict[relax.Var, object] = {}  # var -> "call" | output index | tuple of those

    def resolve(expr):
        if isinstance(expr, relax.Var):
            return values.get(expr)
        if isinstance(expr, relax.Tuple):
            items = tuple(resolve(field) for field in expr.fields)
            return None if any(item is None for item in items) else items
        if isinstance(expr, relax.TupleGetItem) and resolve(expr.tuple_value) == "call":
            return int(expr.index)
        return None

    for block in body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                return None
            value = binding.value
            if binding.var.id_ in computed:
                continue
            if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and call is None:
                symbol = region_symbol(value.op, mod[value.op])
                fed = [arg for arg in value.args if not (isinstance(arg, relax.Var) and arg.id_ in value_of)]
                if symbol not in regions or not all(any(arg.same_as(p) for p in params) for arg in fed):
                    return None
                positions = tuple(next(i for i, p in enumerate(params) if p.same_as(arg)) for arg in fed)
                computed_inputs = {position: value_of[arg.id_] for position, arg in enumerate(value.args)
                                   if isinstance(arg, relax.Var) and arg.id_ in value_of}
                call = (symbol, positions, computed_inputs)
                values[binding.var] = "call"
                continue
            resolved = resolve(value)
            if resolved is None:
                return None
            values[binding.var] = resolved
    if call is None:
        return None
    region = regions[call[0]]
    if call[0] not in per_shape and is_symbolic([d for spec in region.inputs for d in spec.shape]) and not _sized_by_inputs(region):
        return None
    result = resolve(body.body)
    if result == "call":  # the region's result returned as the model's: its outputs in order
        outputs = tuple(range(len(region.outputs)))
    elif isinstance(result, int):
        outputs = (result,)
    elif isinstance(result, tuple) and all(isinstance(item, int) for item in result):
        outputs = result
    else:
        return None
    symbol = call[0] if call[0] in per_shape else region.symbol
    return DirectCall(symbol, call[1], outputs, call[2], dims if call[2] else ())


def _sized_by_inputs(region: RegionArtifact) -> bool:
    """Whether every symbolic dimension of the region's outputs can be read off its inputs."""
    plain = {d for spec in region.inputs for d in spec.shape if isinstance(d, str) and d.isidentifier()}
    return all(names_in(d) <= plain for spec in [*region.inputs, *region.outputs] for d in spec.shape)
