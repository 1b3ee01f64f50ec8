"""A small C vendor for tests: plain C loops as its kernel library (no external dependency).

It covers what the MLP and ResNet-18 need, so that the C code generator can be tested end to
end on zoo models.
"""

from __future__ import annotations

import byoc
from byoc.annotate import fused_pattern
from byoc.codegen_c import CLibrary, KernelCode


def _strides(shape):
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return list(reversed(strides))


def _broadcast_strides(shape, out_shape):
    """Element strides of `shape` broadcast to `out_shape` (0 along broadcast dimensions)."""
    padded = [1] * (len(out_shape) - len(shape)) + list(shape)
    strides = _strides(padded)
    return [0 if d == 1 and o != 1 else s for d, s, o in zip(padded, strides, out_shape)]


def _array(name, values):
    return f"static const int64_t {name}[{max(1, len(values))}] = {{{', '.join(str(v) for v in values) or '0'}}};"


_BINARY = {"relax.add": "+", "relax.subtract": "-", "relax.multiply": "*", "relax.divide": "/"}


def binary(call):
    node = call.nodes[0]
    a, b, out = call.arg(node, 0), call.arg(node, 1), call.outputs[0]
    k = call.name
    state = "\n".join([_array(f"{k}_shape", out.shape), _array(f"{k}_sa", _broadcast_strides(a.shape, out.shape)),
                       _array(f"{k}_sb", _broadcast_strides(b.shape, out.shape))])
    run = f"""
for (int64_t i = 0; i < {out.size}; ++i) {{
  int64_t rest = i, ia = 0, ib = 0;
  for (int d = {len(out.shape) - 1}; d >= 0; --d) {{
    int64_t index = rest % {k}_shape[d];
    rest /= {k}_shape[d];
    ia += index * {k}_sa[d];
    ib += index * {k}_sb[d];
  }}
  {out.name}[i] = {a.name}[ia] {_BINARY[node['op']]} {b.name}[ib];
}}"""
    return KernelCode(state=state, run=run)


def relu(call):
    x, out = call.arg(call.nodes[0], 0), call.outputs[0]
    return KernelCode(run=f"for (int64_t i = 0; i < {out.size}; ++i) {out.name}[i] = {x.name}[i] > 0.0f ? {x.name}[i] : 0.0f;")


def copy(call):
    x, out = call.arg(call.nodes[0], 0), call.outputs[0]
    return KernelCode(run=f"memcpy({out.name}, {x.name}, {out.size * 4});")


def matmul(call):
    node = call.nodes[0]
    a, b, out = call.arg(node, 0), call.arg(node, 1), call.outputs[0]
    if len(b.shape) != 2:
        raise ValueError(f"{call.where()}: matmul needs a 2-D right operand")
    k, n = b.shape
    m = a.size // k
    return KernelCode(run=f"""
for (int64_t i = 0; i < {m}; ++i)
  for (int64_t j = 0; j < {n}; ++j) {{
    float sum = 0.0f;
    for (int64_t p = 0; p < {k}; ++p) sum += {a.name}[i * {k} + p] * {b.name}[p * {n} + j];
    {out.name}[i * {n} + j] = sum;
  }}""")


def conv2d(call):
    conv = call.node("relax.nn.conv2d")
    x, w, out = call.arg(conv, 0), call.arg(conv, 1), call.outputs[0]
    attrs = conv["attrs"]
    n, cin, h, wd = x.shape
    cout, cpg, kh, kw = w.shape
    _, _, oh, ow = out.shape
    groups, (sh, sw), (dh, dw), (pt, pl) = attrs["groups"], attrs["strides"], attrs["dilation"], attrs["padding"][:2]
    bias = call.arg(call.node("relax.add"), 1).name if call.pattern in ("conv2d_bias", "conv2d_bias_relu") else None
    init = f"{bias}[oc]" if bias else "0.0f"
    result = "sum > 0.0f ? sum : 0.0f" if call.pattern == "conv2d_bias_relu" else "sum"
    return KernelCode(run=f"""
for (int64_t b = 0; b < {n}; ++b)
  for (int64_t oc = 0; oc < {cout}; ++oc)
    for (int64_t oy = 0; oy < {oh}; ++oy)
      for (int64_t ox = 0; ox < {ow}; ++ox) {{
        float sum = {init};
        int64_t g = oc / {cout // groups};
        for (int64_t ic = 0; ic < {cpg}; ++ic)
          for (int64_t ky = 0; ky < {kh}; ++ky)
            for (int64_t kx = 0; kx < {kw}; ++kx) {{
              int64_t iy = oy * {sh} - {pt} + ky * {dh}, ix = ox * {sw} - {pl} + kx * {dw};
              if (iy < 0 || iy >= {h} || ix < 0 || ix >= {wd}) continue;
              sum += {x.name}[((b * {cin} + g * {cpg} + ic) * {h} + iy) * {wd} + ix] * {w.name}[((oc * {cpg} + ic) * {kh} + ky) * {kw} + kx];
            }}
        {out.name}[((b * {cout} + oc) * {oh} + oy) * {ow} + ox] = {result};
      }}""")


def max_pool2d(call):
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    (ph, pw), (sh, sw), (pt, pl) = node["attrs"]["pool_size"], node["attrs"]["strides"], node["attrs"]["padding"][:2]
    n, c, h, w = x.shape
    _, _, oh, ow = out.shape
    return KernelCode(run=f"""
for (int64_t p = 0; p < {n * c}; ++p)
  for (int64_t oy = 0; oy < {oh}; ++oy)
    for (int64_t ox = 0; ox < {ow}; ++ox) {{
      float best = -3.402823466e38f;
      for (int64_t ky = 0; ky < {ph}; ++ky)
        for (int64_t kx = 0; kx < {pw}; ++kx) {{
          int64_t iy = oy * {sh} - {pt} + ky, ix = ox * {sw} - {pl} + kx;
          if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w} && {x.name}[(p * {h} + iy) * {w} + ix] > best) best = {x.name}[(p * {h} + iy) * {w} + ix];
        }}
      {out.name}[(p * {oh} + oy) * {ow} + ox] = best;
    }}""")


def mean(call):
    x, out = call.arg(call.nodes[0], 0), call.outputs[0]
    inner = x.size // out.size  # reduction over trailing axes (global pooling)
    return KernelCode(run=f"""
for (int64_t i = 0; i < {out.size}; ++i) {{
  float sum = 0.0f;
  for (int64_t j = 0; j < {inner}; ++j) sum += {x.name}[i * {inner} + j];
  {out.name}[i] = sum / {inner}.0f;
}}""", includes=())


def softmax(call):
    x, out = call.arg(call.nodes[0], 0), call.outputs[0]
    width = x.shape[-1]
    return KernelCode(includes=["<math.h>"], run=f"""
for (int64_t r = 0; r < {x.size // width}; ++r) {{
  const float* row = {x.name} + r * {width};
  float top = row[0], total = 0.0f;
  for (int64_t j = 1; j < {width}; ++j) if (row[j] > top) top = row[j];
  for (int64_t j = 0; j < {width}; ++j) {{ {out.name}[r * {width} + j] = expf(row[j] - top); total += {out.name}[r * {width} + j]; }}
  for (int64_t j = 0; j < {width}; ++j) {out.name}[r * {width} + j] /= total;
}}""")


LIBRARY = CLibrary(
    name="cloops",
    version="1",
    emitters={
        **{op: binary for op in _BINARY},
        "relax.nn.relu": relu,
        "relax.reshape": copy,
        "relax.matmul": matmul,
        "relax.nn.conv2d": conv2d,
        "conv2d_bias": conv2d,
        "conv2d_bias_relu": conv2d,
        "relax.nn.max_pool2d": max_pool2d,
        "relax.mean": mean,
        "relax.nn.softmax": softmax,
    },
    libraries=["m"],
)


def make_c_backend(name: str = "cloops", library: CLibrary = LIBRARY) -> byoc.Backend:
    backend = byoc.Backend(name=name, codegen=library, limits=byoc.Limits(dtypes=("float32",), constant_weights=True))
    backend.pattern("conv2d_bias_relu", *fused_pattern("relax.nn.conv2d", bias=True, activation="relax.nn.relu"))
    backend.pattern("conv2d_bias", *fused_pattern("relax.nn.conv2d", bias=True))
    backend.supports(*[op for op in library.emitters if op.startswith("relax.")])

    @backend.op("relax.matmul")
    def matmul_2d_weight(call):
        return None if call.args[1].ty.ndim == 2 else "only 2-D weights"

    @backend.op("relax.mean")
    def trailing_axes(call):
        rank, axes = call.args[0].ty.ndim, call.attrs.axis
        trailing = axes is not None and sorted(int(a) % rank for a in axes) == list(range(rank - len(axes), rank))
        return None if trailing else "only trailing axes"

    @backend.op("relax.nn.softmax")
    def last_axis(call):
        return None if int(call.attrs.axis) in (-1, call.args[0].ty.ndim - 1) else "only the last axis"

    return backend
