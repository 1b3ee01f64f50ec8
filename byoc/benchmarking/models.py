"""What a `--models` entry names: a zoo model, `hf:NAME[:SIZE]` (a `transformers` architecture
exported with torch.onnx, see `byoc.models.exported`) or the path of an ONNX file with static
input shapes; loaded with seeded sample inputs."""

from __future__ import annotations

import os

DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "vgg19", "bert_encoder", "ssd_detector"]


def _is_path(spec: str) -> bool:
    return spec.endswith(".onnx") or os.sep in spec or os.path.exists(spec)


def _require_static_inputs(spec: str, model) -> None:
    from byoc.errors import DynamicShapeError

    initializers = {init.name for init in model.graph.initializer}
    dynamic = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in initializers and (not value.type.tensor_type.HasField("shape") or any(d.dim_value <= 0 for d in dims)):
            dynamic.append(f"{value.name} [{', '.join(str(d.dim_value) if d.dim_value > 0 else d.dim_param or '?' for d in dims)}]")
    if dynamic:
        raise DynamicShapeError(
            f"{spec}: input(s) with dynamic dimensions: {'; '.join(dynamic)}. byoc bench times static shapes: export the model "
            "with static shapes, or fix each dimension first, e.g. python -m onnxruntime.tools.make_dynamic_shape_fixed "
            "--dim_param batch --dim_value 1 in.onnx out.onnx")


def check_model(spec: str) -> None:
    """Raise the error `load_model(spec)` would, without building or exporting anything."""
    import onnx

    import byoc.models
    from byoc.errors import ModelLoadError

    if spec.startswith("hf:"):
        from byoc.models import exported

        exported.parse_spec(spec)
    elif _is_path(spec):
        if not os.path.isfile(spec):
            raise ModelLoadError(f"{spec}: no such ONNX file")
        _require_static_inputs(spec, onnx.load(spec, load_external_data=False))
    else:
        byoc.models.describe(spec)


def load_model(spec: str):
    """The ONNX model a `--models` entry names, and its seeded sample inputs."""
    import onnx

    import byoc.models

    if spec.startswith("hf:"):
        from byoc.models import exported

        model = exported.export(*exported.parse_spec(spec))
    elif _is_path(spec):
        model = onnx.load(spec)
        _require_static_inputs(spec, model)
    else:
        model = byoc.models.get(spec)
    return model, byoc.models.sample_inputs(model)


def model_label(spec: str) -> str:
    return os.path.basename(spec) if not spec.startswith("hf:") and _is_path(spec) else spec


def zoo_reference(name: str, threads: int):
    """A model (zoo name, `hf:NAME[:SIZE]` or ONNX path), its seeded inputs, an onnxruntime
    session on `threads` threads, the session's outputs, and the model imported to Relax."""
    import onnxruntime as ort

    import byoc
    from byoc.errors import InputError, one_line

    model, inputs = load_model(name)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    try:
        expected = session.run(None, inputs)
    except Exception as error:  # onnxruntime's own failure, on the file as it is
        raise InputError(f"onnxruntime cannot run {model_label(name)} on seeded random inputs "
                         f"({', '.join(f'{k} {v.shape} {v.dtype}' for k, v in inputs.items())}): {one_line(error)}") from error
    return model, inputs, session, expected, byoc.from_onnx(model)
