"""float16 models, as `convert_float_to_float16` writes them for GPUs: computed in float32 where
the first backend takes no float16 (dnnl, the host), as onnxruntime's CPU provider does, so that
they run whole on the vendor instead of on the host's generic float16 kernels; handed to
onnxruntime as the file is. Each against onnxruntime running the same float16 file, within
float16's precision."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.float16 import convert_float_to_float16

import byoc
from byoc.frontend.float16 import float16_in_float32
from byoc.ir.types import op_name
from byoc.timing import onednn_has_avx512_core

B, S, H = 2, 8, 32
# float16 keeps 11 significant bits: results computed in float32 and rounded once differ from
# onnxruntime's, rounded after each node, by a few units of the last place.
FLOAT16_REL_L2 = 3e-3


def _weights(name, *shape, seed):
    return numpy_helper.from_array((np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32), name)


def _block() -> onnx.ModelProto:
    """A transformer layer's dense part as exporters write it: a dense layer, GPT-2's tanh GELU,
    a second dense layer, the residual add and a layer norm; beside it a padding mask made from
    an integer input (Cast to the float type, Where with float16's lowest) added to scores and a
    softmax. Two outputs."""
    c = lambda name, value: numpy_helper.from_array(np.array(value, np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Mul", ["hb", "half"], ["g0"]), helper.make_node("Pow", ["hb", "three"], ["g1"]),
        helper.make_node("Mul", ["g1", "coef"], ["g2"]), helper.make_node("Add", ["hb", "g2"], ["g3"]),
        helper.make_node("Mul", ["g3", "scale"], ["g4"]), helper.make_node("Tanh", ["g4"], ["g5"]),
        helper.make_node("Add", ["g5", "one"], ["g6"]), helper.make_node("Mul", ["g0", "g6"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["d"]), helper.make_node("Add", ["d", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["y", "wq"], ["q"]), helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "yt"], ["scores"]),
        helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.BOOL),
        helper.make_node("Where", ["keep", "zero", "lowest"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]), helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
    ]
    initializers = [_weights("w1", H, 4 * H, seed=1), _weights("b1", 4 * H, seed=2), _weights("w2", 4 * H, H, seed=3),
                    _weights("wq", H, H, seed=4), _weights("gamma", H, seed=5), _weights("beta", H, seed=6),
                    c("half", 0.5), c("three", 3.0), c("coef", 0.044715), c("scale", math.sqrt(2 / math.pi)), c("one", 1.0),
                    c("zero", 0.0), c("lowest", -65504.0)]
    graph = helper.make_graph(
        nodes, "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, H]), helper.make_tensor_value_info("mask", TensorProto.INT64, [B, 1, S])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, H]), helper.make_tensor_value_info("p", TensorProto.FLOAT, [B, S, S])],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inputs(dtype) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((B, 1, S), np.int64)
    mask[1, :, S // 2:] = 0
    return {"x": rng.standard_normal((B, S, H)).astype(dtype), "mask": mask}


def _rel_l2(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def _run(model, vendors, inputs):
    partitioned = byoc.partition_for(byoc.from_onnx(model), vendors)
    return byoc.report(partitioned), byoc.build(partitioned, strict=True).run(**inputs)


@pytest.fixture(scope="module", params=[False, True], ids=["float16 io", "float32 io"])
def float16_file(request):
    """The block in float16, its inputs and outputs float16 too, or kept float32 (keep_io_types)."""
    model = convert_float_to_float16(_block(), keep_io_types=request.param)
    inputs = _inputs(np.float32 if request.param else np.float16)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    return model, inputs, expected


def test_a_float16_model_runs_whole_on_dnnl_in_float32(float16_file):
    model, inputs, expected = float16_file
    report, outputs = _run(model, "dnnl", inputs)
    assert report.offload_ratio_macs == 1.0 and len(report.regions) == 1, report.to_table()
    assert report.float16_in_float32 > 0 and "float16 computed in float32" in report.to_table()
    # The constants of GPT-2's GELU as float16 stores them are still read as the GELU.
    assert any("gelu_tanh" in name for name in report.regions[0].patterns), report.regions[0].patterns
    assert not [h for h in report.host_ops if h.macs], report.to_table()
    for got, want in zip(outputs, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert _rel_l2(got, want) < FLOAT16_REL_L2


def test_the_onnxruntime_vendor_takes_the_float16_file_as_it_is(float16_file):
    model, inputs, expected = float16_file
    report, outputs = _run(model, "onnxruntime", inputs)
    assert report.float16_in_float32 == 0 and report.offload_ratio_macs == 1.0, report.to_table()
    for got, want in zip(outputs, expected):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_the_backend_of_highest_priority_decides(float16_file):
    model, inputs, _ = float16_file
    mod = byoc.from_onnx(model)
    assert byoc.report(byoc.partition_for(mod, ["dnnl", "onnxruntime"])).float16_in_float32 > 0
    assert byoc.report(byoc.partition_for(mod, "onnxruntime")).float16_in_float32 == 0


def test_what_a_float16_backend_leaves_to_the_host_computes_in_float32():
    """onnxruntime takes float16, and leaves a region without MACs to the host, whose generic
    kernels have no float16 acosh: the host computes it in float32."""
    graph = helper.make_graph([helper.make_node("Acosh", ["x"], ["y"])], "acosh",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.linspace(1, 4, 12, dtype=np.float16).reshape(3, 4)
    report, [got] = _run(model, "onnxruntime", {"x": x})
    assert not report.regions and report.float16_in_float32 == 1, report.to_table()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("condition", [True, False])
def test_control_flow_reads_float16_values_as_the_model_wrote_them(condition):
    """With an If, TVM's importer writes the model outside dataflow blocks (so on the host): its
    ops compute in float32 there too, and the If gets the product cast back to float16."""
    F16 = TensorProto.FLOAT16
    branch = lambda op, name: helper.make_graph([helper.make_node(op, ["y"], ["o"])], name, [],  # noqa: E731
                                                [helper.make_tensor_value_info("o", F16, [4, 8])])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]),
         helper.make_node("If", ["c"], ["z"], then_branch=branch("Relu", "then"), else_branch=branch("Neg", "else"))],
        "if", [helper.make_tensor_value_info("x", F16, [4, 16]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", F16, [4, 8])],
        [numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float16), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float16), "c": np.array(condition)}
    report, [got] = _run(model, "dnnl", inputs)
    assert report.float16_in_float32 > 0, report.to_table()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    assert got.dtype == np.float16 and _rel_l2(got, want) < FLOAT16_REL_L2


def test_a_float32_model_is_left_as_it_is():
    mod = byoc.from_onnx(_block())
    widened, count = float16_in_float32(mod)
    assert count == 0 and widened is mod


def test_float16_widening_keeps_the_interface_and_casts_each_input_once():
    mod = byoc.from_onnx(convert_float_to_float16(_block()))
    widened, count = float16_in_float32(mod)
    before, after = mod["main"], widened["main"]
    assert [str(p.ty) for p in before.params] == [str(p.ty) for p in after.params]
    assert str(before.ret_ty) == str(after.ret_ty)
    casts = [b for block in after.body.blocks for b in block.bindings
             if op_name(b.value) == "relax.astype" and b.value.args[0].same_as(after.params[0])]
    assert len(casts) == 1  # x is read by a matmul and the residual add, cast once
    # float16 is made only by the casts of the outputs.
    made = [b for block in after.body.blocks for b in block.bindings if "float16" in str(b.var.ty)]
    assert [op_name(b.value) for b in made] == ["relax.astype", "relax.astype", None] and count > 10


def test_a_converter_with_float32_constants_takes_float16_through_float32():
    """TVM's Elu converter writes its constants in float32: the node is converted in float32 and
    its result cast back."""
    node = helper.make_node("Elu", ["x"], ["y"], alpha=2.0)
    graph = helper.make_graph([node], "elu", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.linspace(-3, 3, 12, dtype=np.float16).reshape(3, 4)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    [got] = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl")).run(x=x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_torch_module_imports_as_its_float32_copy(dtype):
    torch = pytest.importorskip("torch", reason="from_torch needs the torch extra")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 16)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            pooled = torch.relu(self.conv(x)).mean((2, 3))
            return self.norm(torch.nn.functional.gelu(self.fc(pooled), approximate="tanh"))

    module = Block().to(getattr(torch, dtype)).eval()
    x = torch.randn(2, 3, 16, 16).to(getattr(torch, dtype))
    mod = byoc.from_torch(module, [x])
    assert str(mod["main"].params[0].ty.dtype) == dtype and str(mod["main"].ret_ty.dtype) == dtype
    partitioned = byoc.partition_for(mod, "dnnl")
    report = byoc.report(partitioned)
    assert report.offload_ratio_macs == 1.0 and len(report.regions) == 1, report.to_table()
    nodes = report.regions[0].nodes  # the module's names, without the float32 copy's
    assert "conv.convolution" in nodes and not any(n.startswith("float32_copy") for n in nodes), nodes
    if dtype == "float16":  # numpy has no bfloat16 to feed
        got = byoc.build(partitioned).run(x.numpy())[0]  # an exported program returns a tuple
        with torch.no_grad():
            want = Block.forward(module.float(), x.float()).numpy()
        assert got.dtype == np.float16 and _rel_l2(got, want) < FLOAT16_REL_L2


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_engine_checks_mark_float16_outputs_in_range():
    """The build-time check fills outputs with marks in their own dtype: no overflow in float16."""
    model = convert_float_to_float16(_block())
    byoc.build(byoc.partition_for(byoc.from_onnx(model), "onnxruntime"), engines="eager")


def test_a_float16_model_is_quantized_from_its_float32_computation():
    model = convert_float_to_float16(_block())
    samples = [_inputs(np.float16) for _ in range(2)]
    samples[1]["x"] = np.random.default_rng(7).standard_normal((B, S, H)).astype(np.float16)
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl", precision="int8", calibration=samples)
    report = byoc.report(partitioned)
    assert report.float16_in_float32 > 0 and report.offload_ratio_macs == 1.0, report.to_table()
    got = byoc.build(partitioned).run(**samples[0])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, samples[0])
    assert got[0].dtype == np.float16 and _rel_l2(got[0], want[0]) < 0.02  # the int8 bound of the float32 model


def test_dnnl_casts_the_inputs_and_outputs_where_onednn_converts_float16_by_a_jit_kernel(monkeypatch):
    """With AVX-512 the casts at the model's boundary are reorders in the dnnl region (1.4 ms for
    GPT-2's logits); below it oneDNN 3.2's reference reorder is slower than the host's kernel, so
    they stay on the host, saying why."""
    model = convert_float_to_float16(_block())
    mod = byoc.from_onnx(model)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    report = byoc.report(byoc.partition_for(mod, "dnnl"))
    on_host = {h.node: h.reasons for h in report.host_ops}
    casts = {name for name in on_host if name.endswith(("_float16", "_float32"))}  # the input's and the two outputs'
    assert len(casts) == 3 and all("need AVX-512" in on_host[c][0] for c in casts), report.to_table()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    if not onednn_has_avx512_core():
        pytest.skip("this CPU has no AVX-512: the casts stay on the host")
    partitioned = byoc.partition_for(mod, "dnnl")
    report = byoc.report(partitioned)
    assert casts <= set(report.regions[0].nodes), report.to_table()
    inputs = _inputs(np.float16)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    for got, expected in zip(byoc.build(partitioned, strict=True).run(**inputs), want):
        assert got.dtype == np.float16 and _rel_l2(got, expected) < FLOAT16_REL_L2


def _mlp(elem_type: int, width: int = 64) -> tuple[onnx.ModelProto, np.ndarray]:
    """A dense layer, bias, ReLU and a second dense layer in one float type, its weights exactly
    bfloat16 values in either, and an input of such values (as float32)."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    values = {name: (rng.standard_normal(shape) * 0.2).astype(ml_dtypes.bfloat16).astype(np.float32)
              for name, shape in (("w1", (width, width)), ("b1", (width,)), ("w2", (width, width)))}

    def stored(name: str) -> onnx.TensorProto:
        if elem_type == TensorProto.FLOAT:
            return numpy_helper.from_array(values[name], name)
        raw = values[name].astype(ml_dtypes.bfloat16).view(np.uint16).tobytes()
        return helper.make_tensor(name, elem_type, values[name].shape, raw, raw=True)

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", elem_type, [4, width])], [helper.make_tensor_value_info("y", elem_type, [4, width])],
        [stored(name) for name in values])
    x = rng.standard_normal((4, width)).astype(ml_dtypes.bfloat16).astype(np.float32)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), x


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_a_bfloat16_model_runs_whole_in_float32(vendor):
    """A bfloat16 file (onnxruntime's CPU provider has no bfloat16 Relu: it cannot run it) is
    computed in float32 on the vendor, every MAC offloaded, its input and output bfloat16: within
    bfloat16's precision (8 significant bits, rounded once) of the same model in float32."""
    import ml_dtypes

    model, x = _mlp(TensorProto.BFLOAT16)
    float32_model, _ = _mlp(TensorProto.FLOAT)
    partitioned = byoc.partition_for(byoc.from_onnx(model), vendor)
    report = byoc.report(partitioned)
    assert report.float16_in_float32 > 0 and report.offload_ratio_macs == 1.0, report.to_table()
    (got,) = byoc.build(partitioned).run(x=x.astype(ml_dtypes.bfloat16))
    assert got.dtype == ml_dtypes.bfloat16
    want = ort.InferenceSession(float32_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = got.astype(np.float32)
    assert np.linalg.norm(got - want) <= 4e-3 * np.linalg.norm(want), np.linalg.norm(got - want) / np.linalg.norm(want)
