"""Hugging Face `transformers` architectures exported with `torch.onnx.export(dynamo=True)`, the
way users bring models: built from configs with seeded random weights (nothing is downloaded),
exported once and cached by content.

`names()` lists the architectures (the `SUITE` first), `path(name, size)` gives the cached ONNX
file (exporting it if needed), `export(name, size)` the loaded model and `sample_inputs(model)`
seeded inputs that fit it. Two sizes: `tiny` for tests and `base`, the architecture's base width
with 2 layers (so that exports and benchmarks fit a laptop); text takes 32 tokens (tiny) or 128
(base), images 64x64 or 224x224, Whisper's encoder 200 or 1,500 frames of 80 mel bins.
Needs the `torch` extra: `pip install 'byoc[torch]'`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import os
import pathlib
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from byoc.errors import ByocError, ModelLoadError, UnknownModelError, did_you_mean
from byoc.models import random_inputs
from byoc.models.graph_builder import INPUT_RANGE_KEY

__all__ = ["SUITE", "SIZES", "MissingExtraError", "available", "names", "export", "path", "sample_inputs"]

TORCH_VERSION = "2.13.0"  # the CPU build these machines install; any other pulls CUDA wheels
EXTRA_HINT = f"install byoc[torch]: pip install -e '.[torch]' (torch=={TORCH_VERSION}, transformers, onnxscript)"
SUITE = ("bert", "gpt2", "vit", "convnext", "whisper_encoder", "t5_encoder")
SIZES = ("tiny", "base")
# onnxruntime 1.32 reads IR versions up to 13; the exporter may write a newer one.
MAX_IR_VERSION = 10
# Dynamic exports trace with batch 2: torch.export specializes an example dimension of 1.
DYNAMIC_EXAMPLE_BATCH = 2
EXAMPLE_SHAPE_KEY = "byoc.example_shape:"
EXPORTER = "torch.onnx.export(dynamo=True)"


class MissingExtraError(ByocError):
    """The `torch` extra (torch, transformers, onnxscript) is not installed."""


SEQUENCE = {"tiny": 32, "base": 128}  # tokens of a text input


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    kind: str  # "tokens" (ids in [0, vocab)), "mask" (ones) or "float" (standard normal)
    dynamic: tuple[str, ...] = ("batch",)  # names of the leading axes that dynamic=True frees


@dataclass(frozen=True)
class Architecture:
    """One row of the table: a transformers config and model class, their arguments per size,
    and the model's inputs."""

    name: str
    config_class: str
    sizes: Mapping[str, Mapping[str, Any]]  # size -> the config's keyword arguments
    inputs: Callable[[Any, str], list[Input]]  # (config, size) -> the model's inputs, in order
    model_class: str
    model_arguments: Mapping[str, Any] = field(default_factory=dict)
    encoder: bool = False  # export model.get_encoder() (an encoder-decoder's encoder)
    attention: str | None = None  # config._attn_implementation, where the default does not export


def _text(config: Any, size: str) -> list[Input]:
    shape, axes = (1, SEQUENCE[size]), ("batch", "sequence")
    return [Input("input_ids", shape, "tokens", axes), Input("attention_mask", shape, "mask", axes)]


def _image(config: Any, size: str) -> list[Input]:
    return [Input("pixel_values", (1, config.num_channels, config.image_size, config.image_size), "float")]


def _audio(config: Any, size: str) -> list[Input]:
    # Whisper's encoder checks that the frames are exactly 2 x max_source_positions.
    return [Input("input_features", (1, config.num_mel_bins, 2 * config.max_source_positions), "float")]


SAMPLES = {"tiny": 4000, "base": 16000}  # raw audio: a quarter of a second, one second at 16 kHz


def _waveform(config: Any, size: str) -> list[Input]:
    return [Input("input_values", (1, SAMPLES[size]), "float")]


# Base sizes keep the architecture's base width and vocabulary with 2 layers: realistic kernels
# at a cost that fits 2 cores.
BERT = {
    "tiny": dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512),
    "base": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072),
}
VIT = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, image_size=64, patch_size=16),
    "base": dict(hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072, image_size=224, patch_size=16),
}
LLAMA = {
    "tiny": dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512, use_cache=False),
    "base": dict(vocab_size=32000, hidden_size=768, num_hidden_layers=2, num_attention_heads=12, num_key_value_heads=4,
                 intermediate_size=2048, use_cache=False),  # one vocabulary for the family (Qwen2's own is 152k)
}
# Whisper builds its decoder too, then only the encoder is exported: keep the decoder small, with
# its special tokens inside its vocabulary.
WHISPER_DECODER = dict(num_mel_bins=80, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=256, vocab_size=1000,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)

_ARCHITECTURES = {a.name: a for a in [
    Architecture("bert", "BertConfig", BERT, _text, "BertModel"),
    Architecture("gpt2", "GPT2Config", {
        "tiny": dict(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_inner=512, bos_token_id=999, eos_token_id=999, use_cache=False),
        "base": dict(n_embd=768, n_layer=2, n_head=12, use_cache=False),
    }, _text, "GPT2Model"),
    Architecture("vit", "ViTConfig", VIT, _image, "ViTModel", {"add_pooling_layer": False}),
    Architecture("convnext", "ConvNextConfig", {
        "tiny": dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=64),
        "base": dict(hidden_sizes=[128, 256, 512, 1024], depths=[1, 1, 3, 1], image_size=224),  # ConvNeXt-B's widths
    }, _image, "ConvNextModel"),
    Architecture("whisper_encoder", "WhisperConfig", {  # 200 frames (2 s) and 1,500 frames (15 s)
        "tiny": dict(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=512, max_source_positions=100,
                     **WHISPER_DECODER),
        "base": dict(d_model=512, encoder_layers=2, encoder_attention_heads=8, encoder_ffn_dim=2048, max_source_positions=750,
                     **WHISPER_DECODER),
    }, _audio, "WhisperModel", encoder=True),
    Architecture("t5_encoder", "T5Config", {
        "tiny": dict(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4, use_cache=False),
        "base": dict(d_model=768, d_kv=64, d_ff=3072, num_layers=2, num_heads=12, use_cache=False),
    }, _text, "T5EncoderModel", attention="eager"),  # T5 SDPA exports have failed (a view on a non-contiguous stride)
    Architecture("distilbert", "DistilBertConfig", {
        "tiny": dict(vocab_size=1000, dim=128, n_layers=2, n_heads=4, hidden_dim=512),
        "base": dict(dim=768, n_layers=2, n_heads=12, hidden_dim=3072),
    }, _text, "DistilBertModel"),
    Architecture("roberta", "RobertaConfig", {"tiny": BERT["tiny"], "base": {**BERT["base"], "vocab_size": 50265}},
                 _text, "RobertaModel", {"add_pooling_layer": False}),
    Architecture("deit", "DeiTConfig", VIT, _image, "DeiTModel", {"add_pooling_layer": False}),
    Architecture("llama", "LlamaConfig", LLAMA, _text, "LlamaModel"),
    # The same family's variants: rotary embeddings and grouped-query attention throughout.
    Architecture("qwen2", "Qwen2Config", LLAMA, _text, "Qwen2Model"),
    Architecture("mistral", "MistralConfig", LLAMA, _text, "MistralModel"),
    Architecture("phi", "PhiConfig", {size: {k: v for k, v in c.items() if k != "num_key_value_heads"} for size, c in LLAMA.items()},
                 _text, "PhiModel"),
    # Windows padded to a multiple of their size, patch merging by strided slices.
    Architecture("swin", "SwinConfig", {
        "tiny": dict(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4),
        "base": dict(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 2], num_heads=[3, 6, 12], window_size=7),  # Swin-T's widths
    }, _image, "SwinModel"),
    # Instance normalisation between 1-D convolutions (its feature extractor), on raw audio.
    Architecture("wav2vec2", "Wav2Vec2Config", {
        "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32),
                     conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        "base": dict(hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072),
    }, _waveform, "Wav2Vec2Model"),
    # Multi-query attention: one head of keys and values for every head of queries, picked out
    # of the fused projection by index.
    Architecture("falcon", "FalconConfig", {
        "tiny": dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, use_cache=False,
                     bos_token_id=999, eos_token_id=999),
        "base": dict(vocab_size=32000, hidden_size=768, num_hidden_layers=2, num_attention_heads=12, use_cache=False,
                     bos_token_id=1, eos_token_id=2),
    }, _text, "FalconModel"),
    # Disentangled attention (DeBERTa-v3's configuration): relative-position keys and queries
    # per head, gathered by relative distance, and its padding mask filling the scores.
    Architecture("deberta", "DebertaV2Config", {
        size: {**BERT[size], "relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_buckets": 256,
               "max_relative_positions": -1, "norm_rel_ebd": "layer_norm", "share_att_key": True}
        for size in BERT
    }, _text, "DebertaV2Model"),
    # Local attention: a constant causal mask applied with `where` in every layer.
    Architecture("gpt_neo", "GPTNeoConfig", {
        "tiny": dict(vocab_size=1000, hidden_size=128, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                     window_size=16, max_position_embeddings=64, bos_token_id=999, eos_token_id=999, use_cache=False),
        "base": dict(hidden_size=768, num_layers=2, num_heads=12, attention_types=[[["global", "local"], 1]], use_cache=False),
    }, _text, "GPTNeoModel"),
]}


def names() -> list[str]:
    return list(_ARCHITECTURES)


def describe(name: str) -> Architecture:
    try:
        return _ARCHITECTURES[name]
    except KeyError:
        raise UnknownModelError(f"unknown exported architecture {name!r}{did_you_mean(name, _ARCHITECTURES)}; "
                                f"known: {', '.join(_ARCHITECTURES)}") from None


def available() -> str | None:
    """None when the `torch` extra is installed, else what is missing and how to install it."""
    missing = []
    for module in ("torch", "transformers", "onnxscript"):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        return f"{', '.join(missing)} not installed; {EXTRA_HINT}"
    import torch

    if torch.__version__.split("+")[0] != TORCH_VERSION:
        return f"torch {torch.__version__} is installed, byoc's exported models need torch=={TORCH_VERSION}; {EXTRA_HINT}"
    return None


SPEC_PREFIX = "hf:"


def parse_spec(spec: str) -> tuple[str, str]:
    """`hf:NAME` or `hf:NAME:SIZE`, as `byoc bench` and `byoc matrix` take them, as (name, size);
    an unknown name or size, or a missing extra, is an error that says so."""
    name, _, size = spec[len(SPEC_PREFIX):].partition(":")
    describe(name)
    if (size or "tiny") not in SIZES:
        raise UnknownModelError(f"{spec}: unknown size {size!r}; sizes: {', '.join(SIZES)}")
    reason = available()
    if reason is not None:
        raise MissingExtraError(f"{spec}: {reason}")
    return name, size or "tiny"


def _require_extra() -> None:
    reason = available()
    if reason is not None:
        raise MissingExtraError(reason)


def _config(arch: Architecture, size: str) -> Any:
    import transformers

    config = getattr(transformers, arch.config_class)(**arch.sizes[size])
    if arch.attention is not None:
        config._attn_implementation = arch.attention
    return config


def _cache_key(arch: Architecture, size: str, config: Any, dynamic: bool, seed: int, inputs: list[Input]) -> str:
    import onnxscript
    import torch
    import transformers

    fields = {
        "name": arch.name, "size": size, "attention": arch.attention, "config": config.to_dict(), "dynamic": dynamic, "seed": seed,
        "inputs": [(i.name, i.shape, i.kind, i.dynamic) for i in inputs], "torch": torch.__version__,
        "transformers": transformers.__version__, "exporter": EXPORTER, "onnxscript": onnxscript.__version__,
        "max_ir_version": MAX_IR_VERSION,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def cache_directory(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    if cache_dir is not None:
        return pathlib.Path(cache_dir)
    return pathlib.Path(os.environ.get("BYOC_EXPORT_CACHE_DIR") or pathlib.Path.home() / ".cache" / "byoc" / "exported")


def path(name: str, size: str = "tiny", dynamic: bool = False, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> pathlib.Path:
    """The cached ONNX file of architecture `name` at `size`, exported first if it is not there."""
    arch = describe(name)
    if size not in arch.sizes:
        raise UnknownModelError(f"unknown size {size!r} of {name}; sizes: {', '.join(arch.sizes)}")
    _require_extra()
    config = _config(arch, size)
    inputs = arch.inputs(config, size)
    directory = cache_directory(cache_dir)
    target = directory / f"{name}-{size}-{'dynamic' if dynamic else 'static'}-{_cache_key(arch, size, config, dynamic, seed, inputs)[:20]}.onnx"
    return cached(target, lambda: _export(arch, size, config, inputs, dynamic, seed))


def cached(target: pathlib.Path, make: Callable[[], onnx.ModelProto]) -> pathlib.Path:
    """`target`, made by `make` and saved first if it is not there."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        model = make()
        # Another process may export the same file at the same time: each writes its own temporary
        # file and os.replace makes either complete file the cached one.
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(handle)
        try:
            onnx.save(model, temporary)
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    return target


def export(name: str, size: str = "tiny", dynamic: bool = False, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> onnx.ModelProto:
    """Architecture `name` at `size` as an ONNX model (from the cache when it is there)."""
    return onnx.load(path(name, size, dynamic, cache_dir, seed))


def _example_shape(item: Input, dynamic: bool) -> tuple[int, ...]:
    return (DYNAMIC_EXAMPLE_BATCH, *item.shape[1:]) if dynamic else item.shape


def _export(arch: Architecture, size: str, config: Any, inputs: list[Input], dynamic: bool, seed: int) -> onnx.ModelProto:
    import torch
    import transformers

    label = f"exporting {arch.name} ({size}, {'dynamic' if dynamic else 'static'}) ..."
    print(label, end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    torch.manual_seed(seed)
    module = getattr(transformers, arch.model_class)(config, **arch.model_arguments)
    module = (module.get_encoder() if arch.encoder else module).eval()
    generator = torch.Generator().manual_seed(seed)
    examples = {}
    for item in inputs:
        shape = _example_shape(item, dynamic)
        if item.kind == "tokens":
            examples[item.name] = torch.randint(0, config.vocab_size, shape, generator=generator)
        elif item.kind == "mask":
            examples[item.name] = torch.ones(shape, dtype=torch.int64)
        else:
            examples[item.name] = torch.randn(shape, generator=generator)
    dynamic_shapes = None
    if dynamic:
        dims: dict[str, Any] = {}
        dynamic_shapes = {item.name: {axis: dims.setdefault(axis_name, torch.export.Dim(axis_name))
                                      for axis, axis_name in enumerate(item.dynamic)} for item in inputs}
    model = torch_export(module, (), f"{arch.name} ({size})", start, kwargs=examples, input_names=[i.name for i in inputs],
                         dynamic_shapes=dynamic_shapes)
    # Value ranges make byoc.models.sample_inputs fit too: ids in the vocabulary, masks all ones.
    metadata = {f"{INPUT_RANGE_KEY}{i.name}": f"0,{config.vocab_size}" if i.kind == "tokens" else "1,2"
                for i in inputs if i.kind in ("tokens", "mask")}
    metadata.update({f"{EXAMPLE_SHAPE_KEY}{i.name}": ",".join(map(str, i.shape)) for i in inputs})
    metadata["byoc.exported"] = f"{arch.name} ({size}, {'dynamic' if dynamic else 'static'}, seed {seed})"
    onnx.helper.set_model_props(model, metadata)
    return model


def torch_export(module: Any, args: tuple, what: str, start: float, **options: Any) -> onnx.ModelProto:
    """`torch.onnx.export(module, args, dynamo=True, **options)` quietly, as an ONNX model of an IR
    version onnxruntime reads; what the exporter said ends a failure's error (`what` names the
    model), and the time since `start` ends the progress line."""
    import torch

    said: list[str] = []
    try:
        with _quiet(said), torch.no_grad():
            program = torch.onnx.export(module, args, dynamo=True, verbose=False, **options)
            with tempfile.TemporaryDirectory() as tmp:  # the exporter writes files; weights may go beside them
                program.save(os.path.join(tmp, "model.onnx"))
                model = onnx.load(os.path.join(tmp, "model.onnx"))
    except Exception as error:
        print(" failed", file=sys.stderr, flush=True)
        tail = "\n".join("".join(said).strip().splitlines()[-20:])
        raise ModelLoadError(f"torch.onnx.export of {what} failed: {type(error).__name__}: {error}\n{tail}") from error
    print(f" {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


@contextlib.contextmanager
def _quiet(said: list[str]) -> Iterator[None]:
    """Silence the exporter (progress lines, warnings, logging, C++ chatter) and append what it
    said to `said`, for the error when it fails. Both file descriptors are redirected because
    torch logs through handlers made at import and its C++ parts write to the descriptors."""
    captured = tempfile.TemporaryFile(mode="w+b")
    text = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(captured.fileno(), 1)
        os.dup2(captured.fileno(), 2)
        with warnings.catch_warnings(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for descriptor in saved:
            os.close(descriptor)
        captured.seek(0)
        said.append(text.getvalue() + captured.read().decode(errors="replace"))
        captured.close()


def sample_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for an exported model: token ids in [0, vocab), attention masks of ones,
    standard normal floats; a dynamic model gets its example shapes."""
    props = {p.key: p.value for p in model.metadata_props}
    ranges = {k[len(INPUT_RANGE_KEY):]: tuple(int(v) for v in value.split(",")) for k, value in props.items() if k.startswith(INPUT_RANGE_KEY)}
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        example = props.get(f"{EXAMPLE_SHAPE_KEY}{value.name}")
        shape = [int(d) for d in example.split(",")] if example else [d.dim_value for d in value.type.tensor_type.shape.dim]
        specs.append((value.name, shape, onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name))
    return random_inputs(specs, seed, ranges)
