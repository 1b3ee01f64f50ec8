"""The CPU vendors: the integration matrix of `byoc.testing` (a model of each zoo family
partitioned, built, exported, loaded in a fresh process and checked against onnxruntime within
the fp32 tolerance: 1e-4 of the output's scale), every zoo model's partition, and what each
vendor fuses."""


import numpy as np
import pytest

import byoc
import byoc.errors
from byoc import models as zoo
from byoc.errors import BuildError
from byoc.testing import vendor_suite

from conftest import assert_fp32_close, onnxruntime_outputs, small_model, small_module

CLASSIFIERS = ["mlp", "resnet18", "resnet50", "mobilenet_v2", "vgg19", "inception_v3"]

# The integration matrix of byoc.testing: zoo models through partition, build, numerics
# against onnxruntime within the vendor's tolerance, export and reload in a fresh process; and
# the onnx node cases of one op family each vendor takes. One model per architecture family
# (the larger classifiers run through every vendor in `make matrix`).
SUITE_MODELS = ["mlp", "resnet18", "mobilenet_v2", "bert_encoder", "ssd_detector"]
TestDnnl = vendor_suite("dnnl", models=SUITE_MODELS, node_pattern="^test_conv_with")
TestOnnxRuntime = vendor_suite("onnxruntime", models=SUITE_MODELS, node_pattern="^test_gemm_default")


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_every_mac_is_offloaded_and_classifiers_are_one_region(vendor):
    for name in zoo.names():
        report = byoc.report(byoc.partition_for(small_module(name), vendor))
        assert report.offload_ratio_macs == 1.0, (name, report.to_table())
        if name in CLASSIFIERS:
            assert report.offload_ratio_nodes == 1.0 and len(report.regions) == 1, (name, report.to_table())


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_detector_keeps_only_post_processing_on_the_host(vendor):
    report = byoc.report(byoc.partition_for(small_module("ssd_detector"), vendor))
    assert report.offload_ratio_macs == 1.0
    host = {op for h in report.host_ops for op in h.ops}
    assert "relax.vision.all_class_non_max_suppression" in host
    assert not host & {"relax.nn.conv2d", "relax.matmul"}


def test_dnnl_fuses_bias_residual_and_activation_into_convolutions():
    report = byoc.report(byoc.partition_for(small_module("resnet18"), "dnnl"))
    patterns = report.regions[0].patterns
    # 20 convolutions: 1 stem + 16 in blocks + 3 downsample shortcuts; the second conv of each
    # block takes the residual add and ReLU as post-ops.
    assert patterns == {"dnnl.conv2d_bias_act": 9, "dnnl.conv2d_bias_add_relu": 8, "dnnl.conv2d_bias": 3, "dnnl.dense_bias": 1}
    mobilenet = byoc.report(byoc.partition_for(small_module("mobilenet_v2"), "dnnl")).regions[0].patterns
    residual_blocks = mobilenet["dnnl.conv2d_bias_add"] + mobilenet["dnnl.conv2d_bias_add_swapped"]
    assert residual_blocks == 10 and mobilenet["dnnl.conv2d_bias_act"] == 35  # every ReLU6 fused too


def test_dnnl_bert_fuses_gelu_residuals_and_attention_scale_into_its_matrix_products():
    partitioned = byoc.partition_for(small_module("bert_encoder"), "dnnl")
    report = byoc.report(partitioned)
    # Two layers: per layer one MLP with GELU, two residual adds, one scaled attention product.
    patterns = report.regions[0].patterns
    assert (patterns["dnnl.dense_bias_gelu"], patterns["dnnl.dense_bias_add"], patterns["dnnl.matmul_divide"]) == (2, 4, 2)
    assert "dnnl.gelu" not in patterns
    assert report.regions[0].ops.count("relax.nn.layer_norm") == 5
    inputs = zoo.sample_inputs(small_model("bert_encoder"), seed=1)
    assert_fp32_close(byoc.build(partitioned).run(**inputs), onnxruntime_outputs(small_model("bert_encoder"), inputs))


def test_missing_onednn_names_the_packages():
    from byoc.codegen_c.onednn import library

    with pytest.raises(BuildError, match="pip install onednn-cpu-tbb onednn-devel-cpu-tbb tbb-devel intel-cmplr-lib-rt"):
        library._locate("onednn-that-is-not-installed", "libdnnl.so.3")


def test_onnxruntime_session_options_pass_through():
    partitioned = byoc.partition_for(small_module("mlp"), "onnxruntime")
    compiled = byoc.build(partitioned, backend_options={"onnxruntime": {"intra_op_num_threads": 1, "graph_optimization_level": "basic"}})
    compiled.create_engines()
    engine = compiled.regions["onnxruntime_0"].record.engine
    assert engine.session.get_session_options().intra_op_num_threads == 1
    # A misspelt option is the user's to fix: an error at build, not a fall-back to the host.
    with pytest.raises(byoc.errors.OptionError, match="vendor 'onnxruntime' has no build option 'threads'; it takes "
                                                      "allow_spinning, graph_optimization_level, intra_op_num_threads"):
        byoc.build(partitioned, backend_options={"onnxruntime": {"threads": 4}})


def test_unsupported_ops_stay_on_the_host_with_the_limit_they_break():
    report = byoc.report(byoc.partition_for(small_module("bert_encoder"), "dnnl"))
    # dnnl takes a gather with one constant index only; token ids are a tensor of int64
    assert report.host_reasons()["embeddings/Gather"] == ["dnnl: input 1 has dtype int64; supported: float32"]


def test_dnnl_primitive_that_cannot_be_created_names_region_node_and_op_and_falls_back():
    """A oneDNN primitive descriptor that the library refuses (here: a pooling stride of 0,
    which a broken emitter asks for) fails a strict build naming region, node and op; a build
    that is not strict falls back to the host."""
    import dataclasses

    from tvm import relax
    from tvm.relax import op as R

    from byoc.codegen_c.onednn import emitters
    from byoc.vendors.dnnl import dnnl

    def zero_stride_pooling(call):
        node = {**call.nodes[0], "attrs": {**call.nodes[0]["attrs"], "strides": [0, 0]}}
        return emitters.pooling(dataclasses.replace(call, nodes=[node], arg_buffers=call.arg_buffers))

    library = dataclasses.replace(dnnl.codegen, emitters={**dnnl.codegen.emitters, "relax.nn.max_pool2d": zero_stride_pooling})
    broken = dataclasses.replace(dnnl, name="dnnl_broken", codegen=library, patterns=[], op_rules=dict(dnnl.op_rules))
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            pooled = builder.emit(R.nn.max_pool2d(builder.emit(R.nn.relu(x), "act"), (2, 2), strides=(2, 2)), "pool")
            out = builder.emit_output(pooled)
        builder.emit_func_output(out)
    from graphs import registered

    with registered(broken):
        partitioned = byoc.partition_for(builder.get(), "dnnl_broken", fallback_without_macs=False)
        failure = "region dnnl_broken_0 \\(dnnl_broken\\): initialisation failed: .*node pool \\(relax.nn.max_pool2d\\): primitive descriptor"
        with pytest.raises(byoc.errors.EngineError, match=failure):
            byoc.build(partitioned, strict=True)
        # Without strict, the region falls back and the host code is compiled again without it.
        with pytest.warns(UserWarning, match=f"{failure}.*falls back to the host: its 2 op\\(s\\) from node 'act' on"):
            compiled = byoc.build(partitioned)
    assert compiled.artifacts == [] and list(compiled.build_fallbacks) == ["dnnl_broken_0"]
    sample = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype("float32")
    np.testing.assert_allclose(compiled.run(sample)[0], byoc.build(builder.get()).run(sample)[0])


_NO_REFERENCE_KERNELS = r"""
import numpy as np, onnxruntime as ort, byoc
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(0)
w = {"w1": rng.standard_normal((24, 3, 3, 3)) * 0.3, "s": rng.standard_normal((1, 24, 1, 1)),
     "wg": rng.standard_normal((24, 6, 1, 1)) * 0.3, "w2": rng.standard_normal((8, 24, 1, 1)) * 0.3}
nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Sub", ["r1", "s"], ["b"]),  # per-channel broadcast over a blocked layout
         helper.make_node("Conv", ["b", "wg"], ["g"], group=4),  # grouped, 6 channels per group
         helper.make_node("Add", ["g", "r1"], ["a"]),  # residual: operands from two layouts
         helper.make_node("Relu", ["a"], ["r2"]), helper.make_node("Conv", ["r2", "w2"], ["y"])]
graph = helper.make_graph(nodes, "layouts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 28, 28])],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def check(model, inputs, whole=True):
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"), strict=True)
    assert compiled.report().offload_ratio_nodes == 1.0 or not whole
    got = compiled.run(**inputs)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


check(model, {"x": rng.standard_normal((1, 3, 28, 28)).astype(np.float32)})
# MobileNetV2: depthwise convolutions, then 1x1 convolutions with residual adds; with AVX-512 a
# followed NCHW input and a residual in another layout sent them to the reference code.
mobilenet = byoc.models.get("mobilenet_v2", small=True)
check(mobilenet, byoc.models.sample_inputs(mobilenet, seed=0))
# A region that starts inside a residual block (as measured placement cuts them): the residual
# is a region input in plain NCHW, the convolution's result NHWC; oneDNN's reference code took
# 133 ms for a ResNet-50 block that runs in 2.
# Also with a depthwise convolution before it, where layouts follow their producer (blocked).
residual = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "skip"], ["a"]),
     helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Conv", ["r", "wd"], ["d"], pads=[1, 1, 1, 1], group=64),
     helper.make_node("Conv", ["d", "wp"], ["p"]), helper.make_node("Add", ["p", "skip"], ["y"])], "residual_input",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64, 14, 14]) for n in ("x", "skip")],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 14, 14])],
    [numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)
     for name, shape in (("w", (64, 64, 3, 3)), ("wd", (64, 1, 3, 3)), ("wp", (64, 64, 1, 1)))])
check(helper.make_model(residual, opset_imports=[helper.make_opsetid("", 13)]),
      {n: rng.standard_normal((1, 64, 14, 14)).astype(np.float32) for n in ("x", "skip")})
# BERT: GELU, residual adds and the attention scale as post-ops of matrix products.
bert = byoc.models.get("bert_encoder", small=True)
check(bert, byoc.models.sample_inputs(bert, seed=0), whole=False)  # the embedding gather stays on the host
print("RAN")
"""


def test_dnnl_never_runs_onednn_reference_kernels():
    """Per-channel broadcasts over a blocked layout, a grouped convolution with a residual add,
    an add of two differently laid out operands, and MobileNetV2's 1x1 convolutions with a
    residual add all have JIT kernels in oneDNN only in some layouts; byoc picks those (oneDNN's
    reference code ran DenseNet 15x, ShuffleNet 300x and MobileNetV2 35x slower). DNNL_VERBOSE
    names the implementation of every primitive that runs."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DNNL_VERBOSE": "1"}
    run = subprocess.run([sys.executable, "-c", _NO_REFERENCE_KERNELS], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and "RAN" in run.stdout, run.stderr[-3000:]
    executed = [line for line in run.stdout.splitlines() if line.startswith("onednn_verbose,") and ",exec," in line]
    assert executed, "DNNL_VERBOSE printed no primitive executions"
    assert not [line for line in executed if ",ref:" in line], "\n".join(line for line in executed if ",ref:" in line)
    fused = [line for line in executed if ",matmul," in line and "attr-post-ops:" in line]
    for post_op in ("eltwise_gelu_erf", "binary_add", "binary_div"):
        assert any(post_op in line for line in fused), f"no matmul ran with a {post_op} post-op"
    assert not [line for line in executed if ",eltwise," in line and "gelu" in line], "GELU ran as its own primitive"


_THREAD_LIMIT = r"""
import numpy as np, byoc
model = byoc.models.get("mlp", small=True)
compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
compiled.run(**byoc.models.sample_inputs(model))
import ctypes
tbb = ctypes.CDLL("libtbb.so.12")  # the copy libdnnl loaded: the same soname resolves to it
parallelism = tbb._ZN3tbb6detail2r127global_control_active_valueEi
parallelism.restype = ctypes.c_size_t
print("LIMIT", parallelism(0))  # global_control::max_allowed_parallelism
"""


@pytest.mark.parametrize("variable", ["BYOC_NUM_THREADS", "OMP_NUM_THREADS"])
def test_dnnl_threads_follow_the_environment(variable):
    """oneDNN's TBB runtime takes every core unless limited; the limit comes from the environment
    and holds for the regions of the process."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("BYOC_NUM_THREADS", "OMP_NUM_THREADS")}
    run = subprocess.run([sys.executable, "-c", _THREAD_LIMIT], capture_output=True, text=True, env={**env, variable: "1"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "LIMIT 1" in run.stdout


def test_dnnl_thread_count_that_is_not_a_number_is_an_error():
    from byoc.codegen_c.onednn import threads

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BYOC_NUM_THREADS", "two")
        with pytest.raises(BuildError, match="BYOC_NUM_THREADS='two': expected a whole number"):
            threads.requested()


def test_a_second_vendor_binds_onednn_emitters_on_a_library_of_its_own():
    """oneDNN's emitters (byoc.codegen_c.onednn) serve any C vendor whose kernels are oneDNN
    primitives: one that takes dense layers alone binds the matmul emitter on a library object
    of its own, runs the MLP's layers as onnxruntime does, and leaves dnnl's table as it was."""
    from byoc.annotate import fused_pattern
    from byoc.codegen_c.onednn import emitters, onednn_library
    from byoc.vendors.dnnl import dnnl

    from graphs import registered

    before = dict(dnnl.codegen.emitters)
    backend = byoc.Backend(name="onednn_dense", codegen=onednn_library(), limits=byoc.Limits(dtypes=("float32",), constant_weights=True))
    backend.pattern("dense_bias_relu", *fused_pattern("relax.matmul", bias=True, activation="relax.nn.relu", constant_weight=True),
                    emit=emitters.matmul)
    backend.supports("relax.matmul", emit=emitters.matmul)
    assert set(backend.codegen.emitters) == {"dense_bias_relu", "relax.matmul"}
    with registered(backend):
        model = small_model("mlp")
        partitioned = byoc.partition_for(small_module("mlp"), "onednn_dense")
        report = byoc.report(partitioned)
        assert report.offload_ratio_macs == 1.0 and {r.backend for r in report.regions} == {"onednn_dense"}, report.to_table()
        inputs = zoo.sample_inputs(model, seed=3)
        assert_fp32_close(byoc.build(partitioned).run(**inputs), onnxruntime_outputs(model, inputs))
    assert dnnl.codegen.emitters == before
