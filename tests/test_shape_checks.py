"""Shapes a model cannot take are refused before anything runs, on every vendor and the host.

Each op whose validity depends on run-time sizes (Expand, MatMul's inner dimensions, Reshape's
element count) was compiled assuming they fit, and read past its input where they did not: an
Expand of 16x16 to 16x4096 returned a result made of whatever lay after the input. The compile
now records what each op needs of the model's dimensions, and a call that breaks it is a
`ShapeConstraintError` naming the node, as onnxruntime names it. Two dimensions an Add or a Concat
joins are compiled as one, where the build used to fail with TVM's internal error.

The guard-page test puts the input right before a page that cannot be read: any read past it
ends the process. It does, with the checks taken out.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.errors import ArtifactError, DimensionBoundWarning, InputError, ShapeConstraintError
from byoc.ir.dims import dims_of, dims_origin
from byoc.ir.shape_conditions import ShapeCheck, evaluate

from conftest import assert_fp32_close, onnxruntime_outputs

F = TensorProto.FLOAT


def _model(nodes, inputs, output_shape) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info("o", F, output_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _expand() -> onnx.ModelProto:
    return _model([helper.make_node("Shape", ["y"], ["s"]), helper.make_node("Expand", ["x", "s"], ["z"], name="the_expand"),
                   helper.make_node("Relu", ["z"], ["o"])], [("x", [2, "a"]), ("y", [2, "b"])], [2, "b"])


def _matmul() -> onnx.ModelProto:
    return _model([helper.make_node("MatMul", ["x", "y"], ["o"], name="the_matmul")], [("x", [3, "k"]), ("y", ["j", 6])], [3, 6])


def _reshape() -> onnx.ModelProto:
    return _model([helper.make_node("Shape", ["y"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["z"], name="the_reshape"),
                   helper.make_node("Relu", ["z"], ["o"])], [("x", ["a"]), ("y", ["b"])], ["b"])


# model, shapes that fit, shapes that do not, what the error says
CASES = {
    "expand": (_expand, [{"x": (2, 5), "y": (2, 5)}, {"x": (2, 1), "y": (2, 7)}], {"x": (2, 3), "y": (2, 5)},
               r"node 'the_expand' \(Expand\): each dimension of an operand must equal the result's or be 1; "
               r"here operand 0 dim 1 \(a\) is 3, the result's dim 1 \(b\) is 5"),
    "matmul": (_matmul, [{"x": (3, 4), "y": (4, 6)}], {"x": (3, 4), "y": (7, 6)},
               r"node 'the_matmul' \(MatMul\): its inner dimensions must be equal; here operand 0's last dim \(k\) is 4, "
               r"operand 1's second last dim \(j\) is 7"),
    "reshape": (_reshape, [{"x": (30,), "y": (30,)}], {"x": (30,), "y": (50,)},
                r"node 'the_reshape' \(Reshape\): the element count must not change; here the input's \(a\) is 30, "
                r"the target's \(b\) is 50"),
}


def _feeds(shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


@pytest.mark.parametrize("vendor", [None, "dnnl", "onnxruntime", "reference"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_shape_an_op_cannot_take_is_refused_naming_the_node(case, vendor):
    make, fitting, breaking, message = CASES[case]
    model = make()
    mod = byoc.from_onnx(model)
    compiled = byoc.build(mod if vendor is None else byoc.partition_for(mod, vendor))
    for index, shapes in enumerate(fitting):
        feeds = _feeds(shapes, index)
        assert_fp32_close(compiled.run(**feeds), onnxruntime_outputs(model, feeds))
    with pytest.raises(ShapeConstraintError, match=message):
        compiled.run(**_feeds(breaking))
    with pytest.raises(Exception, match="the_" + case):  # onnxruntime refuses the same node
        onnxruntime_outputs(model, _feeds(breaking))


def test_what_the_ranges_prove_is_not_checked():
    """An Expand from `a` to `b` where `a` can only be 1 needs nothing at run time."""
    mod = byoc.from_onnx(_expand(), dims={"a": (1, 1), "b": (1, 8)})
    assert byoc.build(mod).parts.shape_checks == []
    mod = byoc.from_onnx(_expand(), dims={"a": (1, 8), "b": (1, 8)})
    assert [check.node for check in byoc.build(mod).parts.shape_checks] == ["the_expand"]


@pytest.mark.parametrize("op", ["Add", "Concat"])
def test_dimensions_an_add_or_concat_joins_are_compiled_as_one(op):
    node = helper.make_node(op, ["x", "y"], ["z"], name="the_join", **({"axis": 1} if op == "Concat" else {}))
    model = _model([node, helper.make_node("Relu", ["z"], ["o"])], [("x", ["a", 4]), ("y", ["b", 4])], ["a", 8 if op == "Concat" else 4])
    with pytest.warns(DimensionBoundWarning, match=r"node 'the_join' \(relax\.(add|concat)\) broadcasts or joins dimensions 'a' and 'b'"):
        mod = byoc.from_onnx(model, dims={"a": (1, 16), "b": (2, 32)})
    assert {name: str(r) for name, r in dims_of(mod).items()} == {"a": "2..16"}
    assert "also 'b'" in dims_origin(mod)["a"]
    compiled = byoc.build(byoc.partition_for(mod, "dnnl"))
    assert "also 'b': node 'the_join'" in compiled.report().dims["a"]  # the compiled model's report says so too
    feeds = _feeds({"x": (5, 4), "y": (5, 4)})
    assert_fp32_close(compiled.run(**feeds), onnxruntime_outputs(model, feeds))
    with pytest.raises(InputError, match="dimension 'a' is 3 in input 'x' dim 0 but 5 in input 'y' dim 0"):
        compiled.run(**_feeds({"x": (3, 4), "y": (5, 4)}))


def test_the_checks_travel_with_the_artifact(tmp_path):
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_matmul()), "dnnl"))
    compiled.export(tmp_path / "m.byoc")
    loaded = byoc.load(tmp_path / "m.byoc")
    assert loaded.parts.shape_checks == compiled.parts.shape_checks
    with pytest.raises(ShapeConstraintError, match="the_matmul"):
        loaded.run(**_feeds({"x": (3, 4), "y": (7, 6)}))


def test_a_check_reading_a_dimension_the_model_lacks_is_refused(tmp_path):
    from byoc.runtime_metadata.artifact import _shape_checks

    manifest = {"dims": {"k": [1, 8, 8]}, "shape_checks": [
        {"node": "n", "op": "MatMul", "requires": "r", "condition": ["==", "k", "j"], "shown": []}]}
    with pytest.raises(ArtifactError, match=r"node 'n' reads dimension\(s\) \['j'\] the model does not have"):
        _shape_checks(manifest, "artifact 'x'")
    manifest["shape_checks"][0]["condition"] = ["import os", 1]
    with pytest.raises(ArtifactError, match="a shape check is malformed"):
        _shape_checks(manifest, "artifact 'x'")


def test_expressions_evaluate_as_tvm_writes_them():
    values = {"a": 7, "b": 2}
    assert evaluate(["//", "a", "b"], values) == 3 and evaluate(["%", ["-", 0, "a"], "b"], values) == 1
    assert evaluate(["/", ["-", 0, "a"], "b"], values) == -3  # TVM's Div truncates
    assert evaluate(["select", ["<", "a", "b"], "a", "b"], values) == 2
    assert evaluate(["and", ["==", ["min", "a", "b"], 2], ["!=", ["max", "a", 1], 1]], values) == 1
    check = ShapeCheck("n", "Op", "it needs a == b", ["==", "a", "b"], (("a", "a"), ("b", "b")))
    assert ShapeCheck.from_dict(check.to_dict()) == check and not check.holds(values)


_GUARDED = """
import ctypes, mmap, sys, warnings
import numpy as np
import onnx
import byoc
from byoc.errors import ShapeConstraintError
warnings.simplefilter("ignore")

def guarded(rows, columns):
    # A float32 array whose last byte is the last before a page that cannot be read.
    nbytes = rows * columns * 4
    pages = -(-nbytes // mmap.PAGESIZE) + 1
    buffer = mmap.mmap(-1, pages * mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + (pages - 1) * mmap.PAGESIZE, mmap.PAGESIZE, 0) == 0
    array = np.frombuffer(buffer, np.float32, rows * columns, (pages - 1) * mmap.PAGESIZE - nbytes).reshape(rows, columns)
    return array, buffer

compiled = byoc.build(byoc.from_onnx(onnx.load(sys.argv[1])))
if sys.argv[2] == "unchecked":
    compiled.parts.shape_checks.clear()
x, kept = guarded(16, 16)
x[:] = 1
assert float(compiled.run(x=x, y=np.zeros((16, 16), np.float32))[0].sum()) == 256  # reads all of x, up to the guard
try:
    compiled.run(x=x, y=np.zeros((16, 4096), np.float32))
except ShapeConstraintError as error:
    print("refused:", error)
"""


@pytest.mark.parametrize("checks", ["checked", "unchecked"])
def test_no_read_past_an_input_with_a_guard_page_after_it(tmp_path, checks):
    model = _expand()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 16
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 16
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 16
    onnx.save(model, tmp_path / "expand.onnx")
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent(_GUARDED))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "expand.onnx"), checks], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parent)
    if checks == "checked":
        assert done.returncode == 0, done.stderr[-2000:]
        assert "refused: node 'the_expand' (Expand)" in done.stdout
    else:  # the guard works: without the checks, the host's Expand reads into the page after x
        assert done.returncode == -11, (done.returncode, done.stdout, done.stderr[-2000:])
