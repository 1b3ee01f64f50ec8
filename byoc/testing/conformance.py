"""onnx's node test cases, run through byoc's ONNX backend for a vendor.

The `onnx` package generates about 1,900 node test cases (one small model per op and
configuration, with inputs and expected outputs computed by onnx's reference implementation).
byoc runs the float32 ones (every floating-point tensor among the model's inputs and outputs is
float32, other tensors are integer or boolean) and the integer ones (int32, int64 and bool
tensors only), the integer arithmetic cases also at values past the int32 range. A case is *handled* when the ONNX frontend
imports each of its ops; the rest are refused up front with the reason, and a pass rate is
stated over the handled cases. Handled cases known to fail are listed with a reason in
`byoc.testing.onnx_expected`; a listed case that passes is reported as such.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from onnx.backend.test.case.test_case import TestCase
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner

from byoc.backend.registry import get_backend
from byoc.backend.tolerance import Tolerance
from byoc.compile_settings import Settings
from byoc.errors import DynamicShapeError, ModelLoadError, one_line
from byoc.flow import configure
from byoc.frontend import from_onnx, unsupported_ops
from byoc.frontend.onnx.data_dependent import cut_data_dependent
from byoc.frontend.onnx.specialize import arrange, specialize
from byoc.ir.tail import tail_of
from byoc.onnx_backend import backend_for
from byoc.partition import partition_graph, report
from byoc.testing.onnx_expected import EXPECTED_FAILURES, VENDOR_EXPECTED_FAILURES

_FLOAT = onnx.TensorProto.FLOAT
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
_OTHERS = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}

PASS, FAIL, EXPECTED, NOT_HANDLED, UNEXPECTED_PASS = "pass", "fail", "expected failure", "not handled", "unexpected pass"
NOT_TAKEN = "not taken"  # the vendor claims no op of the case: counted and shown, not a pass

# Node cases ask the vendor to take every op it claims, however small the region: a vendor that
# leaves MAC-less regions to the host would otherwise see almost no case, and its pass rate
# would be the host's. These override the vendor's own cost rules and the suite's options.
FORCED_OFFLOAD = {"fallback_without_macs": False, "min_ops_per_region": 1, "min_macs_per_region": 0}


def _tensors_only(model: onnx.ModelProto) -> bool:
    """Whether every input and output is a tensor (not a sequence, an optional or a map)."""
    return all(v.type.HasField("tensor_type") for v in [*model.graph.input, *model.graph.output])


def is_float32_case(model: onnx.ModelProto) -> bool:
    if not _tensors_only(model):
        return False
    values = [*model.graph.input, *model.graph.output]
    types = [v.type.tensor_type.elem_type for v in values]
    floats = [t for t in types if t in _FLOATS or t not in _OTHERS | {_FLOAT}]
    return bool(floats) and all(t == _FLOAT for t in floats) and all(t in _OTHERS | {_FLOAT} for t in types)


def is_integer_case(model: onnx.ModelProto) -> bool:
    """A case of int32, int64 and bool tensors only, with some int32 or int64 among them."""
    if not _tensors_only(model):
        return False
    types = {v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    return types <= _OTHERS and bool(types & {onnx.TensorProto.INT32, onnx.TensorProto.INT64})


@functools.cache
def _all_node_cases() -> tuple[TestCase, ...]:
    with np.errstate(all="ignore"):  # onnx computes some expected outputs with overflows on purpose
        return tuple(load_model_tests(kind="node"))


@functools.cache
def float32_node_cases() -> tuple[TestCase, ...]:
    """onnx's float32 node test cases, by name order."""
    return tuple(sorted((c for c in _all_node_cases() if is_float32_case(c.model)), key=lambda c: c.name))


@functools.cache
def integer_node_cases() -> tuple[TestCase, ...]:
    """onnx's node test cases on int32/int64 (and bool) tensors only, by name order: what
    catches a vendor that computes int64 in int32, with `edge_data_sets`."""
    return tuple(sorted((c for c in _all_node_cases() if is_integer_case(c.model)), key=lambda c: c.name))


# onnx's model test cases that ship with the package: modules and operators exported from
# PyTorch (mostly opset 6), and small graphs written by hand (sequences, strings, gradients).
MODEL_KINDS = ("pytorch-converted", "pytorch-operator", "simple")


def _data_set(directory: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    def read(prefix: str) -> list[np.ndarray]:
        files = sorted(directory.glob(f"{prefix}_*.pb"), key=lambda f: int(f.stem.rsplit("_", 1)[1]))
        return [onnx.numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]

    return read("input"), read("output")


@functools.cache
def model_cases() -> tuple[TestCase, ...]:
    """onnx's model test cases of MODEL_KINDS whose inputs and outputs are tensors, each with its
    model and data sets loaded (onnx's loader leaves both on disk), by name order."""
    cases = []
    for kind in MODEL_KINDS:
        for case in load_model_tests(kind=kind):
            model = onnx.load(str(Path(case.model_dir) / "model.onnx"))
            if not _tensors_only(model):
                continue
            data_sets = [_data_set(d) for d in sorted(Path(case.model_dir).glob("test_data_set_*"))]
            cases.append(dataclasses.replace(case, model=model, data_sets=data_sets))
    return tuple(sorted(cases, key=lambda c: c.name))


def model_case(name: str) -> TestCase:
    for case in model_cases():
        if case.name == name:
            return case
    raise KeyError(f"no onnx model test case {name!r}")


@functools.cache
def other_type_node_cases() -> tuple[TestCase, ...]:
    """onnx's node test cases on tensors of other types (float16, bfloat16, float64, 8- and
    16-bit and unsigned integers, float8, strings), by name order: run apart from the float32
    and integer cases, whose pass rates vendors are compared by."""
    return tuple(sorted((c for c in _all_node_cases() if _tensors_only(c.model) and not is_float32_case(c.model)
                         and not is_integer_case(c.model)), key=lambda c: c.name))


def node_case(name: str) -> TestCase:
    for case in (*float32_node_cases(), *integer_node_cases(), *other_type_node_cases()):
        if case.name == name:
            return case
    raise KeyError(f"no node case {name!r}")


def select(pattern: str | None = None, ops: Sequence[str] | None = None, integers: bool = True) -> list[TestCase]:
    """Cases whose name matches `pattern` (a regular expression) and, if given, whose ops are
    all among `ops` (ONNX op types): the float32 cases and, unless `integers` is False, the
    integer ones."""
    chosen = []
    for case in (*float32_node_cases(), *(integer_node_cases() if integers else ())):
        if pattern and not re.search(pattern, case.name):
            continue
        if ops is not None and not {n.op_type for n in case.model.graph.node} <= set(ops):
            continue
        chosen.append(case)
    return chosen


def not_handled_reason(case: TestCase) -> str | None:
    """Why the frontend refuses the case's ops up front, or leaves some of them to onnxruntime
    (a tail whose shapes depend on the data: those ops are not byoc's), or None when it handles
    them all."""
    refused = unsupported_ops(case.model)
    if refused:
        return "; ".join(dict.fromkeys(f"{op}: {reason}" for _, op, reason in refused))
    return _tail_reason(case)


def _tail_reason(case: TestCase) -> str | None:
    try:
        if cut_data_dependent(case.model) is None:  # no shape depends on the data: nothing is left to onnxruntime
            return None
    except ValueError:  # a type onnx cannot infer: the import says what it makes of the case
        pass
    try:
        inputs = arrange(case.model, list(case.data_sets[0][0]))
        spec = specialize(case.model, inputs, ())
        tail = tail_of(from_onnx(case.model, shapes=spec.shapes, constants=spec.constants))
    except Exception:  # the run reports what the import raises
        return None
    return None if tail is None else f"its tail runs in onnxruntime: {tail.describe()}"


def expected_failure(case_name: str, vendor: str) -> str | None:
    return VENDOR_EXPECTED_FAILURES.get(vendor, {}).get(case_name) or EXPECTED_FAILURES.get(case_name)


@dataclass(frozen=True)
class CaseResult:
    case: str
    vendor: str
    status: str
    detail: str = ""


def _int8_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray], tolerance: Tolerance) -> None:
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape, f"shape {g.shape}, expected {w.shape}"
        if not np.issubdtype(w.dtype, np.floating):
            continue
        norm = float(np.linalg.norm(w.astype(np.float64)))
        error = float(np.linalg.norm(g.astype(np.float64) - w))
        bound = tolerance.relative_l2 or 0.0
        assert error <= bound * norm + 1e-6, f"relative L2 error {error / max(norm, 1e-12):.2%} over {bound:.0%}"


# Operands that trained models hold as initializers (weights, biases, normalisation
# statistics), by op and position. Node cases feed them as inputs; accelerators that take only
# constant weights see them as constants when a case is run `as_weights`.
WEIGHT_OPERANDS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gemm": (1, 2),
    "MatMul": (1,),
    "BatchNormalization": (1, 2, 3, 4),
    "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "PRelu": (1,),
}


def weight_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that the model's nodes read as weights (see WEIGHT_OPERANDS)."""
    inputs = {v.name for v in model.graph.input}
    read = {n.input[i] for n in model.graph.node for i in WEIGHT_OPERANDS.get(n.op_type, ()) if i < len(n.input)}
    return [name for name in dict.fromkeys(v.name for v in model.graph.input) if name in read and name in inputs]


def _vendor_options(vendor: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    return {**(options or {}), **(FORCED_OFFLOAD if vendor else {})}


def _array(value: np.ndarray | onnx.TensorProto) -> np.ndarray:
    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def run_case(case: TestCase, vendor: str | None, options: dict[str, Any] | None = None, as_weights: bool = False) -> None:
    """Run `case` through the ONNX backend for `vendor` (None: the host alone), the vendor
    taking every op it claims (FORCED_OFFLOAD) and its regions built strictly (a region that
    fails does not fall back), and compare with onnx's expected outputs: with the case's own
    tolerance for float backends, with the vendor's stated bound for int8 and float16 ones.
    Integer inputs of arithmetic cases are also run at values past the int32 range
    (`edge_data_sets`). With `as_weights`, weight operands are constants, as in a trained
    model. Raises on any difference."""
    tolerance = get_backend(vendor).tolerance if vendor else Tolerance()
    options = _vendor_options(vendor, options)
    if vendor and tolerance.precision == "int8" and "calibration" not in options:
        options["calibration"] = [list(inputs) for inputs, _ in case.data_sets]
    constants = weight_inputs(case.model) if as_weights else []
    rep = backend_for([vendor] if vendor else [], strict=True, **options).prepare(case.model, constant_inputs=constants)
    for inputs, expected in [*case.data_sets, *edge_data_sets(case)]:
        # onnx keeps some cases' data as TensorProto (bfloat16, float8)
        inputs, expected = [_array(a) for a in inputs], [_array(a) for a in expected]
        got = list(rep.run(inputs))
        if tolerance.precision == "fp32":
            Runner.assert_similar_outputs(list(expected), got, case.rtol, case.atol)
        else:
            assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
            _int8_close(got, expected, tolerance)


# Ops whose integer operands may take any value: an integer case made only of these is also
# run at values past the int32 range (int64) and near it (int32), with onnx's reference
# evaluator giving the expected outputs. A vendor that claims int64 arithmetic and computes it
# in int32 passes onnx's own data sets (small values) and fails these.
ARITHMETIC_OPS = frozenset({"Add", "Sub", "Mul", "Neg", "Abs", "Max", "Min", "Sum", "Equal", "Less", "Greater",
                            "LessOrEqual", "GreaterOrEqual", "Sign", "Identity", "Where", "Relu"})
EDGE_MAGNITUDE = {np.dtype(np.int64): 3_000_000_000, np.dtype(np.int32): 40_000}  # products stay in range


def edge_data_sets(case: TestCase) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """One more data set for integer arithmetic cases: each int32/int64 input replaced by seeded
    values up to EDGE_MAGNITUDE in size (for int64, past what int32 holds), with the outputs
    onnx's reference evaluator computes. None for other cases."""
    if not case.data_sets or not {n.op_type for n in case.model.graph.node} <= ARITHMETIC_OPS:
        return []
    inputs = list(case.data_sets[0][0])
    if not any(np.asarray(a).dtype in EDGE_MAGNITUDE for a in inputs):
        return []
    rng = np.random.default_rng(len(case.name))
    edged = []
    for array in inputs:
        array = np.asarray(array)
        bound = EDGE_MAGNITUDE.get(array.dtype)
        edged.append(array if bound is None else rng.integers(-bound, bound, array.shape, dtype=array.dtype, endpoint=True))
    from onnx.reference import ReferenceEvaluator

    names = [v.name for v in case.model.graph.input]
    expected = ReferenceEvaluator(case.model).run(None, dict(zip(names, edged)))
    return [(edged, list(expected))]


def vendor_takes(case: TestCase, vendor: str, as_weights: bool = False, options: dict[str, Any] | None = None) -> bool:
    """Whether the vendor's partition of the case offloads anything, with the options the case
    runs with (FORCED_OFFLOAD and the suite's). Calibration does not change what a vendor
    takes, so the partition is made without it."""
    inputs = arrange(case.model, list(case.data_sets[0][0]))
    spec = specialize(case.model, inputs, weight_inputs(case.model) if as_weights else ())
    mod = from_onnx(case.model, shapes=spec.shapes, constants=spec.constants)
    settings = Settings.of(None, _vendor_options(vendor, options))
    return bool(report(partition_graph(mod, configure(vendor, settings), **settings.cost)).regions)


def check_case(case: TestCase, vendor: str | None, options: dict[str, Any] | None = None, as_weights: bool = False) -> CaseResult:
    """The status of `case` for `vendor`, against the expected-failure lists. A model the
    frontend refuses is not handled, whether its ops are refused up front or on import."""
    name = vendor or "host"
    reason = not_handled_reason(case)
    if reason is not None:
        return CaseResult(case.name, name, NOT_HANDLED, reason)
    if vendor is not None:
        try:
            if not vendor_takes(case, vendor, as_weights, options):
                return CaseResult(case.name, name, NOT_TAKEN, f"{vendor} claims no op of this case")
        except (ModelLoadError, DynamicShapeError) as error:
            return CaseResult(case.name, name, NOT_HANDLED, one_line(error))
    expected = expected_failure(case.name, name)
    try:
        run_case(case, vendor, options, as_weights)
    except Exception as error:  # the detail names the exception: an internal one is a finding
        detail = one_line(error)
        return CaseResult(case.name, name, EXPECTED if expected else FAIL, expected or detail)
    return CaseResult(case.name, name, UNEXPECTED_PASS if expected else PASS, expected or "")


@dataclass(frozen=True)
class PassRate:
    vendor: str
    total: int
    handled: int
    passed: int
    expected_failures: int
    failures: int
    not_taken: int = 0  # handled cases the vendor claims no op of (they ran nowhere but the host)

    @property
    def rate(self) -> float:
        """Passes over the cases the vendor took: handled, and with an op it claims."""
        taken = self.handled - self.not_taken
        return self.passed / taken if taken else 0.0

    @classmethod
    def of(cls, vendor: str, results: Sequence[CaseResult]) -> PassRate:
        counts = {status: sum(r.status == status for r in results) for status in (PASS, FAIL, EXPECTED, NOT_HANDLED, UNEXPECTED_PASS, NOT_TAKEN)}
        handled = len(results) - counts[NOT_HANDLED]
        return cls(vendor, len(results), handled, counts[PASS] + counts[UNEXPECTED_PASS], counts[EXPECTED], counts[FAIL], counts[NOT_TAKEN])

    def summary(self) -> str:
        taken = self.handled - self.not_taken
        return (f"{self.vendor}: {self.passed} of {taken} float32 and integer node cases it takes pass ({self.rate:.1%}); "
                f"{self.expected_failures} expected failure(s), {self.failures} other failure(s); "
                f"{self.not_taken} case(s) with no op it claims, {self.total - self.handled} not handled by the frontend, "
                f"of {self.total}")
