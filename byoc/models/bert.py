"""A BERT-base-like encoder as ONNX exporters emit it: MatMul/Add projections, multi-head
attention through Reshape/Transpose/MatMul/Softmax, LayerNormalization, and GELU written out
with Erf.

With `dynamic`, the batch and sequence axes are named dimensions (`batch`, `sequence`), as an
export with dynamic axes writes them: reshapes keep those axes with 0, and the position
embeddings are sliced to the sequence length read off the input's shape."""

from __future__ import annotations

import math

import numpy as np
import onnx

from byoc.models.graph_builder import OnnxGraphBuilder


def _layer_norm(g: OnnxGraphBuilder, x: str, hidden: int) -> str:
    gamma = g.constant("gamma", g.rng.uniform(0.9, 1.1, hidden).astype(np.float32))
    beta = g.constant("beta", g.small((hidden,)))
    return g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)


def _gelu(g: OnnxGraphBuilder, x: str) -> str:
    with g.scope("gelu"):
        scaled = g.op("Div", [x, g.constant("sqrt2", np.array(math.sqrt(2.0), dtype=np.float32))])
        erf = g.op("Erf", [scaled])
        one_plus = g.op("Add", [erf, g.constant("one", np.array(1.0, dtype=np.float32))])
        half_x = g.op("Mul", [x, g.constant("half", np.array(0.5, dtype=np.float32))])
        return g.op("Mul", [half_x, one_plus])


def _heads(g: OnnxGraphBuilder, x: str, batch: int, seq: int, heads: int, head_dim: int, perm: list[int]) -> str:
    shape = g.shape_constant("shape", [batch, seq, heads, head_dim])  # 0, 0 when dynamic: the input's own
    return g.op("Transpose", [g.op("Reshape", [x, shape])], perm=perm)


def _encoder_layer(g: OnnxGraphBuilder, x: str, batch: int, seq: int, hidden: int, heads: int, intermediate: int) -> str:
    head_dim = hidden // heads
    with g.scope("attention"):
        with g.scope("query"):
            q = _heads(g, g.matmul(x, hidden, hidden), batch, seq, heads, head_dim, [0, 2, 1, 3])
        with g.scope("key"):
            k = _heads(g, g.matmul(x, hidden, hidden), batch, seq, heads, head_dim, [0, 2, 3, 1])
        with g.scope("value"):
            v = _heads(g, g.matmul(x, hidden, hidden), batch, seq, heads, head_dim, [0, 2, 1, 3])
        scores = g.op("MatMul", [q, k])
        scores = g.op("Div", [scores, g.constant("scale", np.array(math.sqrt(head_dim), dtype=np.float32))])
        probs = g.op("Softmax", [scores], axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, g.shape_constant("shape", [batch, seq, hidden])])
        with g.scope("output"):
            attended = g.op("Add", [g.matmul(context, hidden, hidden), x])
            x = _layer_norm(g, attended, hidden)
    with g.scope("ffn"):
        y = _gelu(g, g.matmul(x, hidden, intermediate))
        with g.scope("output"):
            y = g.op("Add", [g.matmul(y, intermediate, hidden), x])
            return _layer_norm(g, y, hidden)


def bert_encoder(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    intermediate: int = 3072,
    seq_len: int = 128,
    vocab: int = 30522,
    batch: int = 1,
    seed: int = 0,
    dynamic: bool = False,
) -> onnx.ModelProto:
    """The encoder for `batch` x `seq_len` tokens; with `dynamic`, for any batch and up to
    `seq_len` tokens (the position table's length)."""
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of the head count {heads}")
    g = OnnxGraphBuilder("bert_encoder", seed)
    ids = g.input("input_ids", ["batch", "sequence"] if dynamic else [batch, seq_len], dtype="int64", value_range=(0, vocab))
    with g.scope("embeddings"):
        words = g.op("Gather", [g.constant("word", g.small((vocab, hidden), 1.0)), ids], axis=0)
        positions = g.constant("position", g.small((seq_len, hidden), 0.5))
        if dynamic:
            length = g.op("Slice", [g.op("Shape", [ids]), g.shape_constant("start", [1]), g.shape_constant("end", [2])])
            positions = g.op("Slice", [positions, g.shape_constant("zero", [0]), length, g.shape_constant("axis", [0])])
        x = _layer_norm(g, g.op("Add", [words, positions]), hidden)
    if dynamic:
        batch = seq_len = 0  # Reshape's 0: the input's own size
    for index in range(layers):
        with g.scope(f"layer{index}"):
            x = _encoder_layer(g, x, batch, seq_len, hidden, heads, intermediate)
    g.output(x)
    return g.build()
