"""A causal language model's decoding step with its key/value cache, exported by
`torch.onnx.export(dynamo=True)` as text-generation files are shipped (optimum's and
transformers.js's `decoder_model` layout): what a generation loop calls once per token.

Inputs `input_ids` [batch, sequence] (the new tokens), `attention_mask` [batch, total] (past and
new), and `past_key_values.<layer>.key` / `.value` [batch, kv_heads, past, head_size]; outputs
`logits` [batch, sequence, vocab] and `present.<layer>.key` / `.value` [batch, kv_heads, total,
head_size], which the next step takes as its past. `total` is `past + sequence`. The past holds at
least one position: torch.export specializes an example dimension of 0 or 1, and byoc compiles
positive dimensions (a first step feeds one masked position, mask 0). Architectures: the GPT-2
and Llama families of `byoc.models.exported`, with their sizes, seeded random weights and
eager attention (the SDPA path's `is_causal` does not export with a symbolic length).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import time
from typing import Any

import numpy as np
import onnx

from byoc.errors import UnknownModelError, did_you_mean
from byoc.models import exported

# name -> the language-model class of the architecture in `byoc.models.exported`
FAMILIES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
EXAMPLE = {"batch": 2, "sequence": 3, "past": 8}  # example sizes above 1, so that torch.export keeps them symbolic


def _config(name: str, size: str) -> Any:
    if name not in FAMILIES:
        raise UnknownModelError(f"no decoding step for {name!r}{did_you_mean(name, FAMILIES)}; known: {', '.join(FAMILIES)}")
    config = exported._config(exported.describe(name), size)
    config.use_cache = True
    config._attn_implementation = "eager"
    return config


def cache_shape(config: Any, batch: int, length: int) -> tuple[int, int, int, int]:
    """The shape of one layer's cached keys (or values) for `length` positions."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return batch, heads, length, config.hidden_size // config.num_attention_heads


def path(name: str = "gpt2", size: str = "tiny", cache_dir: str | os.PathLike | None = None, seed: int = 0) -> pathlib.Path:
    """The cached ONNX file of `name`'s decoding step at `size`, exported first if it is not there."""
    exported._require_extra()
    config = _config(name, size)
    import torch
    import transformers

    key = hashlib.sha256(json.dumps({"name": name, "size": size, "config": config.to_dict(), "seed": seed, "torch": torch.__version__,
                                     "transformers": transformers.__version__, "exporter": exported.EXPORTER},
                                    sort_keys=True, default=str).encode()).hexdigest()[:20]
    target = exported.cache_directory(cache_dir) / f"{name}-{size}-decoder-step-{key}.onnx"
    return exported.cached(target, lambda: _export(name, size, config, seed))


def export(name: str = "gpt2", size: str = "tiny", cache_dir: str | os.PathLike | None = None, seed: int = 0) -> onnx.ModelProto:
    return onnx.load(path(name, size, cache_dir, seed))


def _export(name: str, size: str, config: Any, seed: int) -> onnx.ModelProto:
    import torch
    import transformers

    layers = config.num_hidden_layers
    cache_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]

    class Step(torch.nn.Module):
        """The language model called with its cache as flat tensors, returning the new cache flat."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, past):
            cache = transformers.DynamicCache()
            for layer in range(layers):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            present = out.past_key_values
            return (out.logits, *[t for layer in present.layers for t in (layer.keys, layer.values)])

    print(f"exporting the {name} decoding step ({size}) ...", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[name])(config).eval()
    generator = torch.Generator().manual_seed(seed)
    batch, sequence, past = EXAMPLE["batch"], EXAMPLE["sequence"], EXAMPLE["past"]
    examples = (torch.randint(0, config.vocab_size, (batch, sequence), generator=generator),
                torch.ones(batch, past + sequence, dtype=torch.int64),
                tuple(torch.randn(cache_shape(config, batch, past), generator=generator) for _ in cache_names))
    dims = {axis: torch.export.Dim(axis) for axis in ("batch", "sequence", "past", "total")}
    dynamic_shapes = ({0: dims["batch"], 1: dims["sequence"]}, {0: dims["batch"], 1: dims["total"]},
                      tuple({0: dims["batch"], 2: dims["past"]} for _ in cache_names))
    outputs = ["logits", *[n.replace("past_key_values", "present") for n in cache_names]]
    result = exported.torch_export(Step(model), examples, f"the {name} decoding step ({size})", start,
                                   input_names=["input_ids", "attention_mask", *cache_names], output_names=outputs,
                                   dynamic_shapes=dynamic_shapes)
    onnx.helper.set_model_props(result, {"byoc.exported": f"{name} decoding step ({size}, seed {seed})",
                                         f"{exported.INPUT_RANGE_KEY}input_ids": f"0,{config.vocab_size}"})
    return result


def step_inputs(model: onnx.ModelProto, batch: int, sequence: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of one step: `sequence` new token ids after `past` cached positions, every
    position attended to."""
    rng = np.random.default_rng(seed)
    vocab = int(next(p.value for p in model.metadata_props if p.key == f"{exported.INPUT_RANGE_KEY}input_ids").split(",")[1])
    feeds = {"input_ids": rng.integers(0, vocab, (batch, sequence)).astype(np.int64),
             "attention_mask": np.ones((batch, past + sequence), np.int64)}
    for value in model.graph.input[2:]:
        heads, head_size = (d.dim_value for d in value.type.tensor_type.shape.dim[1::2])
        feeds[value.name] = rng.standard_normal((batch, heads, past, head_size)).astype(np.float32)
    return feeds
