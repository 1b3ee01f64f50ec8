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
