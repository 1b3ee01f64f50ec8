"""GPT-2 exported by torch's TorchScript exporter (`dynamo=False`), as older pipelines still write
it: built from a config with seeded weights, its hidden states the one output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest


def legacy_gpt2(tmp_path, layers: int, width: int, vocab: int, length: int, dynamic: bool = False) -> tuple[onnx.ModelProto, np.ndarray]:
    """The exported model and the token ids it was traced with; skips without torch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=2, vocab_size=vocab, n_positions=max(16, 4 * length),
                                     use_cache=False, bos_token_id=0, eos_token_id=0)

    class Hidden(torch.nn.Module):
        # The mask is given: without it transformers 5 looks for packed sequences with
        # aten::diff, which the legacy exporter cannot write.
        def __init__(self):
            super().__init__()
            self.gpt2 = transformers.GPT2Model(config)

        def forward(self, ids):
            return self.gpt2(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state

    path = str(tmp_path / "gpt2.onnx")
    ids = torch.randint(0, vocab, (1, length))
    axes = {"dynamic_axes": {"input_ids": {0: "batch", 1: "sequence"}}} if dynamic else {}
    with torch.no_grad():
        torch.onnx.export(Hidden().eval(), (ids,), path, input_names=["input_ids"], output_names=["hidden"], dynamo=False,
                          opset_version=17, **axes)
    return onnx.load(path), ids.numpy()


BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def legacy_bert(tmp_path, layers: int, width: int, heads: int, attention: str = "sdpa") -> onnx.ModelProto:
    """BERT exported by the TorchScript exporter with dynamic batch and sequence axes, its three
    inputs by name and its hidden states the one output; `attention="eager"` is the form
    onnxruntime's transformer optimizer fuses. Skips without torch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=2 * width, vocab_size=100, attn_implementation=attention)

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel(config)

        def forward(self, *inputs):
            return self.bert(**dict(zip(BERT_INPUTS, inputs))).last_hidden_state

    path = str(tmp_path / "bert.onnx")
    example = (torch.randint(0, 100, (1, 8)), torch.ones(1, 8, dtype=torch.int64), torch.zeros(1, 8, dtype=torch.int64))
    with torch.no_grad():
        torch.onnx.export(Hidden().eval(), example, path, input_names=BERT_INPUTS, output_names=["hidden"], dynamo=False,
                          opset_version=17, dynamic_axes={n: {0: "batch", 1: "sequence"} for n in BERT_INPUTS})
    return onnx.load(path)


def bert_inputs(batch: int, sequence: int, seed: int) -> dict[str, np.ndarray]:
    """Token ids, a mask whose last row is padded from half way, and segment ids of zeros."""
    feed = {"input_ids": np.random.default_rng(seed).integers(0, 100, (batch, sequence)),
            "attention_mask": np.ones((batch, sequence), np.int64), "token_type_ids": np.zeros((batch, sequence), np.int64)}
    feed["attention_mask"][-1, sequence // 2:] = 0
    return feed
