"""PyTorch modules imported directly (`byoc.from_torch`): numerics against torch itself, the
module's qualified names in reports, ops TVM cannot convert refused by node, and a clear error
where torch is absent."""

import subprocess
import sys

import numpy as np
import pytest

import byoc
from byoc.errors import ModelLoadError
from byoc.models import exported
from byoc.partition.reasons import SHAPE_ONLY

from conftest import assert_fp32_close

needs_torch = pytest.mark.skipif(exported.available() is not None, reason=exported.available() or "")


def _mlp():
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            return torch.softmax(self.fc2(torch.nn.functional.gelu(self.fc1(x))), dim=-1)

    torch.manual_seed(0)
    return Mlp()


@needs_torch
@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_a_module_runs_like_torch_with_its_parts_named(vendor):
    import torch

    module, x = _mlp(), torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    partitioned = byoc.partition_for(byoc.from_torch(module, [x]), vendor)
    report = byoc.report(partitioned)
    assert report.offload_ratio_macs == 1.0
    assert any(name.startswith("fc1.") for region in report.regions for name in region.nodes)
    with torch.no_grad():
        assert_fp32_close(byoc.build(partitioned).run(x.numpy()), [module(x).numpy()])


def _bert():
    """The suite's tiny BERT as a transformers module, seeded, and its config."""
    import torch
    import transformers

    arch = exported.describe("bert")
    config = exported._config(arch, "tiny")
    torch.manual_seed(0)
    return getattr(transformers, arch.model_class)(config, **arch.model_arguments).eval(), config


@needs_torch
def test_a_transformers_model_imports_by_keyword_with_every_mac_offloaded():
    import torch

    model, config = _bert()
    ids = torch.randint(0, config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(1, 32, dtype=torch.int64)
    partitioned = byoc.partition_for(byoc.from_torch(model, {"input_ids": ids, "attention_mask": mask}), "dnnl")
    report = byoc.report(partitioned)
    assert report.offload_ratio_macs == 1.0
    assert [spec.name for spec in byoc.build(partitioned).outputs] == ["last_hidden_state", "pooler_output"]
    # What stays on the host is named after the module it belongs to, and says why.
    assert any(op.node.startswith("embeddings.") for op in report.host_ops) and all(op.reasons for op in report.host_ops)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    assert_fp32_close(byoc.build(partitioned).run(ids.numpy(), mask.numpy()),
                      [out.last_hidden_state.numpy(), out.pooler_output.numpy()])


@needs_torch
def test_inputs_that_are_not_tensors_are_taken_as_the_constants_they_are():
    """Hugging Face models are called with flags (`use_cache=False`, `output_hidden_states=None`):
    torch.export specialises on them, and the compiled model takes the tensors alone."""
    import torch

    class Flagged(torch.nn.Module):
        def forward(self, x, scale=1.0, squared=False, extra=None):
            return (x * x if squared else x) * scale

    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(3))
    by_name = byoc.from_torch(Flagged(), {"x": x, "scale": 2.0, "squared": True, "extra": None})
    by_position = byoc.from_torch(Flagged(), [x, 2.0, True])
    import transformers

    torch.manual_seed(0)
    llama = transformers.LlamaModel(transformers.LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                             intermediate_size=32, vocab_size=50)).eval()
    ids = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(4))
    with pytest.raises(ModelLoadError, match="DynamicCache.*; pass use_cache=False among the inputs"):
        byoc.from_torch(llama, {"input_ids": ids})
    assert [param.name for param in byoc.from_torch(llama, {"input_ids": ids, "use_cache": False})["main"].params] == ["input_ids"]
    for mod in (by_name, by_position):
        assert [param.name for param in mod["main"].params] == ["x"]
        assert_fp32_close(byoc.build(byoc.partition_for(mod, "dnnl")).run(x.numpy()), [(x * x * 2.0).numpy()])


@needs_torch
def test_dynamic_shapes_give_one_model_for_every_shape_in_range():
    import torch

    model, config = _bert()
    ids, mask = torch.randint(0, config.vocab_size, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    batch, sequence = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("sequence", min=1, max=64)
    axes = {0: batch, 1: sequence}
    mod = byoc.from_torch(model, {"input_ids": ids, "attention_mask": mask},
                          dynamic_shapes={"input_ids": axes, "attention_mask": axes})
    assert str(mod["main"].params[0].ty.shape) == "R.shape([batch, sequence])"  # named after the Dims
    partitioned = byoc.partition_for(mod, "dnnl")
    assert len(byoc.report(partitioned).regions) == 1 and byoc.report(partitioned).offload_ratio_macs == 1.0
    # onnxruntime takes the module's symbolic shapes: one session for every shape. The padding
    # mask (an advanced index, `&` of booleans, `any` written in int8) is in it: the host keeps
    # only what depends on the shape alone.
    on_onnxruntime = byoc.partition_for(mod, "onnxruntime")
    report = byoc.report(on_onnxruntime)
    assert len(report.regions) == 1 and all(op.reasons == [SHAPE_ONLY] for op in report.host_ops), report.to_table()
    on_onnxruntime = byoc.build(on_onnxruntime)
    regions = on_onnxruntime.inspect()["shape_specialised"]
    assert regions and all(region["symbolic"] for region in regions.values()), regions
    on_dnnl = byoc.build(partitioned)
    for compiled, shape in [(on_dnnl, (1, 5)), (on_dnnl, (3, 40)), (on_onnxruntime, (1, 5)), (on_onnxruntime, (4, 64))]:
        ids = torch.randint(0, config.vocab_size, shape, generator=torch.Generator().manual_seed(sum(shape)))
        mask = torch.ones(shape, dtype=torch.int64)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask)
        assert_fp32_close(compiled.run(ids.numpy(), mask.numpy()), [out.last_hidden_state.numpy(), out.pooler_output.numpy()])
    unbounded = {0: torch.export.Dim("batch", min=1), 1: sequence}
    with pytest.raises(ModelLoadError, match=r"dimension 'batch' needs a maximum: torch.export.Dim\('batch', max=...\)"):
        byoc.from_torch(model, {"input_ids": ids, "attention_mask": mask},
                        dynamic_shapes={"input_ids": unbounded, "attention_mask": unbounded})


@needs_torch
@pytest.mark.parametrize("name", exported.SUITE)
def test_the_suite_through_from_torch_offloads_as_through_onnx(name):
    """The same module, imported directly and through its torch.onnx export: one dnnl region
    with every MAC either way, and torch's own numbers."""
    import torch
    import transformers

    arch = exported.describe(name)
    config = exported._config(arch, "tiny")
    torch.manual_seed(0)
    model = getattr(transformers, arch.model_class)(config, **arch.model_arguments).eval()
    model = model.get_encoder() if arch.encoder else model
    inputs = exported.sample_inputs(exported.export(name))
    via_onnx = byoc.report(byoc.partition_for(byoc.from_onnx(exported.export(name)), "dnnl"))
    partitioned = byoc.partition_for(byoc.from_torch(model, {k: torch.from_numpy(v) for k, v in inputs.items()}), "dnnl")
    direct = byoc.report(partitioned)
    assert len(direct.regions) == len(via_onnx.regions) == 1, str(direct)
    assert direct.offload_ratio_macs == via_onnx.offload_ratio_macs == 1.0
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(v) for k, v in inputs.items()})[0].numpy()
    assert_fp32_close(byoc.build(partitioned).run(**inputs)[:1], [want])


@needs_torch
def test_ops_tvm_cannot_convert_are_refused_by_node():
    import torch

    class Running(torch.nn.Module):
        def forward(self, x):
            return torch.cummax(x, dim=1)[0] + torch.kthvalue(x, 2, dim=1, keepdim=True)[0]

    with pytest.raises(ModelLoadError, match=r"Running has ops TVM's PyTorch frontend cannot convert: "
                                             r"node 'cummax' \(cummax.default\); node 'kthvalue' \(kthvalue.default\)"):
        byoc.from_torch(Running(), [torch.randn(2, 8)])
    with pytest.raises(ModelLoadError, match="torch.export could not export Running"):
        byoc.from_torch(Running(), [np.zeros((2, 8))])  # not a tensor


@needs_torch
def test_a_float_tensors_arithmetic_with_an_int_is_promoted_as_torch_does():
    """EdgeNeXt's `x // 2` on float positions: TVM's converters refused a float32 tensor with an
    int32 constant."""
    import torch

    class Positions(torch.nn.Module):
        def forward(self, x):
            return torch.div(x, 2, rounding_mode="floor") + torch.remainder(x, 3) + x // 4 - 1 + torch.pow(x, 2)

    x = torch.randn(2, 8) * 10
    assert_fp32_close(byoc.build(byoc.from_torch(Positions(), [x])).run(x.numpy()), [Positions()(x).numpy()])


@needs_torch
def test_shapes_that_depend_on_the_data_point_to_the_onnx_path():
    import torch

    class TopPositive(torch.nn.Module):
        def forward(self, x):
            return torch.topk(x.flatten(), int((x > 0).sum())).values

    with pytest.raises(ModelLoadError, match="GuardOnDataDependentSymNode.*its shapes depend on its data, which torch.export cannot "
                                             "trace: export it with torch.onnx.export and import the file with byoc.from_onnx"):
        byoc.from_torch(TopPositive(), [torch.randn(4, 4)])


def test_without_torch_the_error_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\nimport byoc\n"
            "try:\n    byoc.from_torch(object(), [])\nexcept byoc.errors.ModelLoadError as error:\n    print(error)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "from_torch needs PyTorch: pip install 'byoc[torch]'" in done.stdout
