"""The build-time trial on edge values: a region of element-wise arithmetic, reductions and layout
ops run on the limits of each dtype, against TVM's own code for the same JSON graph.

Zeros and ones (the trial run of `engine_check`) show that an engine runs and writes; they hide
an engine that computes int64 in 32 bits ((2**40 + 7) * 7 gave 49 only on real data), or a
tanh written as (e^2x - 1) / (e^2x + 1) that is NaN past x = 44. Here each integer input holds
values past the int32 range and near its dtype's limits, each float32 input large and small
magnitudes (and NaN where every op of the region defines what NaN gives; where it sums, only
values whose sums do not depend on their order), and the engine's
outputs must equal TVM's (integers) or lie within the vendor's stated tolerance (floats), with
infinities and NaN where TVM has them.

Which regions: those whose every op has one defined result on any such value, so that a
difference is the engine's fault and neither side can fault (no index is read from the data, no
integer is divided by a value computed in the region, which could be 0, and no float is cast to
an integer, which is undefined past the integer's range). Matrix products, convolutions and
normalisations are left to the kit, which compares every op with onnxruntime on random data:
their results on edge values depend on the order of summation, and TVM's untuned code for them
would cost a build more time than the check is worth. A region of more than MAX_NODES ops is
left out for the same reason (the reference takes about 30 ms to build for a few ops).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from byoc.backend.arrays import aligned
from byoc.backend.tolerance import Tolerance
from byoc.codegen_json import tvm_engine
from byoc.codegen_json.references import value_spec
from byoc.errors import EngineError

MAX_NODES = 64

_LAYOUT = {"relax.reshape", "relax.permute_dims", "relax.concat", "relax.split", "relax.expand_dims", "relax.squeeze",
           "relax.flatten", "relax.broadcast_to", "relax.strided_slice", "relax.repeat", "relax.tile", "relax.flip",
           "relax.stack"}
# Ops whose result for NaN is NaN by IEEE 754 and in every implementation; selections and
# comparisons (max, clip, relu, where, equal) differ between implementations on NaN.
_NAN_DEFINED = _LAYOUT | {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.negative", "relax.abs",
                          "relax.exp", "relax.log", "relax.sqrt", "relax.rsqrt", "relax.tanh", "relax.sigmoid", "relax.erf",
                          "relax.sin", "relax.cos", "relax.floor", "relax.ceil", "relax.trunc", "relax.square", "relax.astype"}
_OVERFLOWING = {"relax.add", "relax.subtract", "relax.multiply", "relax.sum", "relax.square"}
# Runtimes sum integers through doubles (onnxruntime's ReduceSum of int64 is off by 12 past 2**53),
# so where the region's integers are summed they stay within a double's exact range.
_EXACT_IN_A_DOUBLE = 52
_INTEGER_DIVISION = {"relax.divide", "relax.floor_divide", "relax.mod", "relax.floor_mod"}
_DEFINED = _NAN_DEFINED | _INTEGER_DIVISION | {
    "relax.maximum", "relax.minimum", "relax.clip", "relax.nn.relu", "relax.sign", "relax.round", "relax.power",
    "relax.equal", "relax.not_equal", "relax.less", "relax.less_equal", "relax.greater", "relax.greater_equal",
    "relax.logical_and", "relax.logical_or", "relax.logical_not", "relax.logical_xor", "relax.bitwise_and",
    "relax.bitwise_or", "relax.bitwise_xor", "relax.bitwise_not", "relax.where", "relax.isnan", "relax.isinf",
    "relax.isfinite", "relax.sum", "relax.mean", "relax.max", "relax.min"}

# Sums whose value depends on their order: where large values cancel, or ordinary ones cancel
# exactly and leave a small one, the order decides what is left (0 or 1e-30, then -inf or -69
# after a log), and neither side is wrong.
_ORDERED_SUMS = {"relax.sum", "relax.mean"}
# Float32 values: ordinary ones, 1e30 (large, yet a sum of millions stays finite), 1e-30 and
# 3e-38 (small, the second next to the smallest normal number), and zero, a divisor IEEE defines.
_FLOAT32 = (1.5, -2.25, 7.0, 0.0, 1e30, -1e30, 1e-30, -3e-38, 65504.0, -0.5)
# Where the region sums: values whose sums are exact in any order (short binary fractions), and
# large ones of one sign, which absorb the rest whatever the order.
_FLOAT32_SUMMED = (1.5, -2.25, 7.0, 0.0, 1e30, 65504.0, -0.5)


def _integers(dtype: np.dtype, bits: int | None) -> list[int]:
    """Values near the dtype's limits and, for 64-bit ones, past the 32-bit range; never 0 or -1,
    so that no integer division faults (INT_MIN / -1 traps as division by zero does). Where the
    region's arithmetic could leave the dtype's range, whose result ONNX leaves undefined
    (onnxruntime sums int64 through doubles), values of at most `bits` bits instead (see
    _magnitude_bits), which are past the int32 range for int64 where the arithmetic allows it."""
    info = np.iinfo(dtype)
    signed = info.min < 0
    if bits is not None:
        top = 2 ** max(3, min(bits, info.bits - signed)) - 1
        return [3, 1, 7, top, top - 2] + ([-7, -top, -(top // 3)] if signed else [])
    values = [3, 1, 7, 12345 % int(info.max), int(info.max), int(info.max) - 2, int(info.max) // 2 + 5]
    if signed:
        values += [-7, int(info.min) + 1, -(int(info.max) // 3)]
    if info.bits == 64:
        values += [2**40 + 7, 2**31 + 5, 2**31 - 1] + ([-(2**33) - 5, -(2**31), 2**62 + 11] if signed else [])
    return values


def _magnitude_bits(graph: Mapping, constants: Mapping[str, np.ndarray]) -> int | None:
    """The most bits an integer input may have for no integer value of the graph to leave its
    dtype's range, or None where no op could (only selections, comparisons and layout).

    Each value's magnitude is bounded by 2 ** (a * b + c), b the inputs' bits: a sum of two adds a
    bit, a product adds the bounds, a reduction over n elements adds log2(n), and other ops keep
    the largest of their operands' (a constant: the bits of its largest element). Sums stay within
    a double's exact integers (_EXACT_IN_A_DOUBLE) as well. A product of int64 values gets 31-bit
    ones: it overflows an engine that multiplies in 32 bits, and not one that multiplies in 64."""
    def bound(ref: Mapping) -> tuple[int, int]:
        if "input" in ref:
            return (1, 0) if np.dtype(graph["inputs"][ref["input"]]["dtype"]).kind in "iu" else (0, 0)
        if "node" in ref:
            return bounds[ref["node"]]
        if "const" in ref and np.dtype(constants[ref["const"]].dtype).kind in "iu" and constants[ref["const"]].size:
            return 0, int(np.abs(constants[ref["const"]].astype(np.float64)).max()).bit_length()
        return (0, 0) if "const" in ref else max((bound(item) for item in ref.get("tuple", ())), default=(0, 0))

    bounds: list[tuple[int, int]] = []
    limits: list[tuple[int, int, int]] = []
    for node in graph["nodes"]:
        operands = [bound(arg) for arg in node["args"] if any(k in arg for k in ("input", "node", "const", "tuple"))] or [(0, 0)]
        a, c = max(x[0] for x in operands), max(x[1] for x in operands)
        dtype = np.dtype(node["outputs"][0]["dtype"])
        if node["op"] in _OVERFLOWING and dtype.kind in "iu":
            if node["op"] in ("relax.multiply", "relax.square"):
                a, c = (sum(x[0] for x in operands), sum(x[1] for x in operands)) if len(operands) == 2 else (2 * a, 2 * c)
            elif node["op"] == "relax.sum":
                c += _reduced(graph, node).bit_length()
            else:
                c += 1
            room = np.iinfo(dtype).bits - 2
            limits.append((a, c, min(room, _EXACT_IN_A_DOUBLE) if node["op"] == "relax.sum" else room))
        bounds.append((a, c))
    fitting = [(room - c) // a for a, c, room in limits if a]
    return min(fitting) if limits else None


def _reduced(graph: Mapping, node: Mapping) -> int:
    """How many elements a reduction adds into each of its outputs (a symbolic dimension: 2**16)."""
    shape = value_spec(graph, node["args"][0])["shape"]
    inputs = int(np.prod([d if isinstance(d, int) else 2**16 for d in shape], dtype=np.float64))
    outputs = int(np.prod([d if isinstance(d, int) else 2**16 for d in node["outputs"][0]["shape"]], dtype=np.float64))
    return max(1, inputs // max(1, outputs))


@dataclass(frozen=True)
class EdgePlan:
    """Which values a region's inputs may hold: NaN where every op defines what it gives, small
    and cancelling large floats where no op sums (see _ORDERED_SUMS)."""

    nan: bool
    sums: bool
    bits: int | None  # where integer arithmetic could leave its dtype's range: the inputs' most bits

    def values(self, dtype: np.dtype) -> list:
        if dtype == np.bool_:
            return [True, False]
        if dtype.kind in "iu":
            return _integers(dtype, self.bits)
        if dtype in (np.float32, np.float64):
            floats = list(_FLOAT32_SUMMED if self.sums else _FLOAT32)
        else:
            floats = [1.5, -2.25, 7.0, 0.0, -0.5, 100.0]
        return floats + [float("nan")] if self.nan else floats


def edge_input(shape: tuple[int, ...], dtype: np.dtype, seed: int, plan: EdgePlan) -> np.ndarray:
    """An array of `shape` holding the dtype's edge values in an order of its own (`seed`), so
    that two inputs meet each other's values in many pairs."""
    values = np.array(plan.values(np.dtype(dtype)), dtype=dtype)
    picks = np.random.default_rng(seed).integers(0, len(values), size=int(np.prod(shape, dtype=np.int64)))
    return aligned(values[picks].reshape(shape))


def edge_plan(graph: Mapping, constants: Mapping[str, np.ndarray]) -> EdgePlan | None:
    """The values the graph's inputs may hold in the edge trial, or None where it does not apply."""
    nodes = graph["nodes"]
    if not nodes or len(nodes) > MAX_NODES or any(node["op"] not in _DEFINED for node in nodes):
        return None
    for node in nodes:
        args = [value_spec(graph, arg) if any(k in arg for k in ("input", "node", "const")) else None for arg in node["args"]]
        dtypes = [np.dtype(spec["dtype"]) for spec in args if spec is not None]
        if node["op"] in _INTEGER_DIVISION and dtypes and dtypes[0].kind in "iu" and "input" not in node["args"][1]:
            return None  # a divisor computed here could be 0
        if node["op"] == "relax.astype" and dtypes[0].kind == "f" and np.dtype(node["outputs"][0]["dtype"]).kind in "iub":
            return None
        if node["op"] in ("relax.power", "relax.mean") and dtypes[0].kind in "iu":
            return None  # an integer power overflows at once; an integer mean rounds as each runtime likes
    ops = {node["op"] for node in nodes}
    return EdgePlan(nan=ops <= _NAN_DEFINED, sums=bool(ops & _ORDERED_SUMS), bits=_magnitude_bits(graph, constants))


def _described(dtypes: Sequence[np.dtype], plan: EdgePlan) -> str:
    kinds = []
    if any(d.kind in "iu" for d in dtypes):
        wide = any(d.itemsize == 8 for d in dtypes if d.kind in "iu")
        if plan.bits is not None:
            kinds.append(f"integers of up to {plan.bits} bits" + (", past the int32 range" if wide and plan.bits > 31 else ""))
        else:
            kinds.append("integer limits" + (" and values past the int32 range" if wide else ""))
    if any(d.kind == "f" for d in dtypes):
        kinds.append(("large floats" if plan.sums else "large and small floats") + (" and NaN" if plan.nan else ""))
    return f"edge values ({'; '.join(kinds) or 'true and false'})"


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _difference(got: np.ndarray, want: np.ndarray, tolerance: Tolerance, exact: bool) -> str | None:
    """How `got` differs from TVM's `want` beyond what the vendor states, or None."""
    if want.dtype.kind != "f":
        if not exact:
            return None
        differ = got != want
        if not differ.any():
            return None
        at = _first(differ)
        return f"{int(differ.sum())} of {want.size} values differ, e.g. {got[at]} where TVM gives {want[at]} at {list(at)}"
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    finite = np.isfinite(got) & np.isfinite(want)
    special = ~same & ~finite
    if special.any():
        at = _first(special)
        return (f"{int(special.sum())} of {want.size} values are infinite or NaN where TVM's are not, or the reverse, "
                f"e.g. {got[at]} where TVM gives {want[at]} at {list(at)}")
    return tolerance.elementwise_violation(got[finite], want[finite])


def check_edge_values(engine, graph_text: bytes, constants: Mapping[str, np.ndarray], input_shapes: Sequence[tuple[int, ...]],
                      output_shapes: Sequence[tuple[int, ...]], tolerance: Tolerance, where: str) -> None:
    """Raise an EngineError naming `where` when the engine, run on edge values, differs from
    TVM's code for the region (see the module's docstring); nothing when the trial does not
    apply or TVM cannot build or run the region itself."""
    graph = json.loads(graph_text)
    plan = edge_plan(graph, constants)
    if plan is None:
        return
    specs = graph["inputs"]
    inputs = [edge_input(shape, np.dtype(spec["dtype"]), seed, plan) for seed, (spec, shape) in enumerate(zip(specs, input_shapes))]
    outputs = [aligned(np.empty(shape, np.dtype(value_spec(graph, ref)["dtype"]))) for ref, shape in zip(graph["outputs"], output_shapes)]
    expected = [np.empty_like(out) for out in outputs]
    try:
        tvm_engine.build_engine(graph, constants, tvm_engine.DEFAULT_SETTINGS).run(inputs, expected)
    except Exception:  # TVM's own code cannot judge the engine here; the kit still compares it with onnxruntime
        return
    described = _described([np.dtype(spec["dtype"]) for spec in specs], plan)
    try:
        engine.run(inputs, outputs)
    except Exception as error:
        raise EngineError(f"{where}: the engine failed a trial run on {described}: {type(error).__name__}: {error}") from error
    bounded = tolerance.rtol is not None or tolerance.atol is not None
    exact = bounded or all(np.dtype(spec["dtype"]).kind != "f" for spec in specs)  # a reduced precision may flip a comparison
    for index, (got, want) in enumerate(zip(outputs, expected)):
        difference = _difference(got, want, tolerance, exact) if bounded or want.dtype.kind != "f" else None
        if difference:
            raise EngineError(f"{where}: on {described}, the engine's output {index} {tuple(want.shape)} differs from TVM's code "
                              f"for the region: {difference}")
