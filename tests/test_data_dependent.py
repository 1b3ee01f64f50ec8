"""A model whose shapes depend on its data (a detector's post-processing) imports: the head is
compiled and partitioned, the tail from the first such node runs in onnxruntime after it, and
the report, the artifact and the model's outputs say so. The model here is a small detector
written as torchvision's SSD exports its post-processing: per class, the boxes over a score
threshold (NonZero, GatherND), the best k of them where k is how many passed (Shape, ReduceMin,
TopK), then NonMaxSuppression over them all."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.errors import ArtifactError
from byoc.frontend.onnx.data_dependent import cut_data_dependent
from byoc.ir.tail import tail_of
from byoc.testing.mutations import ArtifactFiles, mutants

from conftest import onnxruntime_outputs

CLASSES, BOXES = 3, 64


def _detector() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
            numpy_helper.from_array(rng.standard_normal((4 + CLASSES, 16, 1, 1)).astype(np.float32) * 0.3, "w2"),
            numpy_helper.from_array(np.array([1, 4 + CLASSES, BOXES], np.int64), "flat"),
            numpy_helper.from_array(np.array([0.85], np.float32), "threshold"),
            numpy_helper.from_array(np.array([24], np.int64), "most"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([40], np.int64), "per_class"),
            numpy_helper.from_array(np.array([0.5], np.float32), "iou")]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["f1"], pads=[1, 1, 1, 1], strides=[2, 2], name="stem"),
             helper.make_node("Relu", ["f1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["head"], name="head"),
             helper.make_node("Reshape", ["head", "flat"], ["flat_head"], name="flatten"),
             helper.make_node("Slice", ["flat_head", "s0", "s4", "axis1"], ["box_t"], name="boxes_slice"),
             helper.make_node("Slice", ["flat_head", "s4", "s_end", "axis1"], ["logits"], name="logits_slice"),
             helper.make_node("Transpose", ["box_t"], ["boxes"], perm=[0, 2, 1], name="boxes"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="scores")]
    init += [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s0", 0), ("s4", 4), ("s_end", 4 + CLASSES), ("axis1", 1))]
    kept = []
    for c in range(CLASSES):
        nodes += [
            helper.make_node("Gather", ["scores", f"c{c}"], [f"score{c}"], axis=1, name=f"class{c}"),
            helper.make_node("Greater", [f"score{c}", "threshold"], [f"over{c}"], name=f"over{c}"),
            helper.make_node("NonZero", [f"over{c}"], [f"where{c}"], name=f"nonzero{c}"),
            helper.make_node("Transpose", [f"where{c}"], [f"where_t{c}"], perm=[1, 0], name=f"where_t{c}"),
            helper.make_node("GatherND", [f"score{c}", f"where_t{c}"], [f"passed{c}"], name=f"passed{c}"),
            helper.make_node("Shape", [f"passed{c}"], [f"count{c}"], name=f"count{c}"),
            helper.make_node("Concat", ["most", f"count{c}"], [f"both{c}"], axis=0, name=f"both{c}"),
            helper.make_node("ReduceMin", [f"both{c}"], [f"k{c}"], keepdims=1, name=f"k{c}"),
            helper.make_node("TopK", [f"passed{c}", f"k{c}"], [f"best{c}", f"best_index{c}"], name=f"topk{c}"),
            helper.make_node("Unsqueeze", [f"best{c}", "zero"], [f"best_row{c}"], name=f"best_row{c}"),
        ]
        init.append(numpy_helper.from_array(np.array(c, np.int64), f"c{c}"))
        kept.append(f"best_row{c}")
    nodes += [helper.make_node("Concat", kept, ["best_all"], axis=1, name="best_all"),
              helper.make_node("NonMaxSuppression", ["boxes", "scores", "per_class", "iou", "threshold"], ["selected"],
                               name="nms")]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("selected", TensorProto.INT64, ["n", 3]),
                               helper.make_tensor_value_info("best_all", TensorProto.FLOAT, [1, "m"]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, CLASSES, BOXES])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)


def test_the_cut_starts_at_the_first_shape_the_data_decides():
    cut = cut_data_dependent(_detector())
    assert (cut.first, cut.why) == ("nonzero0", "NonZero makes a shape from its input's values")
    assert {n.op_type for n in cut.head.graph.node} >= {"Conv", "Sigmoid"} and "NonZero" not in {n.op_type for n in cut.head.graph.node}
    # The head's outputs, which the tail reads, have shapes known before the run.
    assert all(all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim) for v in cut.head.graph.output)
    assert cut_data_dependent(onnx.load(_static_copy())) is None


def _static_copy():
    import io

    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "static",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    return io.BytesIO(model.SerializeToString())


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_a_detector_runs_like_onnxruntime_with_its_tail_after_the_compiled_part(vendor, tmp_path):
    model = _detector()
    mod = byoc.from_onnx(model)
    assert tail_of(mod).first == "nonzero0"
    partitioned = byoc.partition_for(mod, vendor)
    report = byoc.report(partitioned)
    assert report.offload_ratio_macs == 1.0
    assert "in 1 region(s) of the compiled part" in str(report)
    assert "after it: " in str(report) and "node(s) from node 'nonzero0' on run in onnxruntime after the compiled model" in str(report)
    compiled = byoc.build(partitioned)
    assert [s.name for s in compiled.outputs] == ["selected", "best_all", "scores"]
    assert compiled.outputs[0].shape == ("n", 3)
    for seed in range(3):  # the number of boxes differs from image to image
        image = _image(seed)
        got, want = compiled.run(image=image), onnxruntime_outputs(model, {"image": image})
        assert [g.shape for g in got] == [w.shape for w in want]
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-5)
    profile = compiled.profile(image=_image(0), repeat=3)
    assert [row.part for row in profile.rows][-1] == "tail" and profile.rows[-1].execution_ms > 0
    compiled.export(tmp_path / "detector.byoc")
    loaded = byoc.load(tmp_path / "detector.byoc")
    assert "after it: " in str(loaded.report())
    assert loaded.inspect()["tail"]["first"] == "nonzero0"
    np.testing.assert_array_equal(loaded.run(image=_image(0))[0], onnxruntime_outputs(model, {"image": _image(0)})[0])


def test_a_damaged_tail_is_refused_at_load(tmp_path):
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_detector()), "onnxruntime"))
    compiled.export(tmp_path / "detector.byoc")
    files = ArtifactFiles(tmp_path / "detector.byoc")
    found = [m for m in mutants(files) if m.name.startswith("tail:")]
    assert len(found) == 3
    for mutant in found:
        mutated = files.copy()
        mutant.mutate(mutated)
        mutated.write(tmp_path / "mutant.byoc")
        with pytest.raises(ArtifactError, match="tail"):
            byoc.load(tmp_path / "mutant.byoc")
