"""The CUDA of each op that is not element-wise: a kernel and its launch, or a library call.

Each writer takes the op's node, the C names and shapes of its operands and its output, and
returns `Code`: file-scope source (kernels, descriptors), code run once at initialisation (cuDNN's
descriptors and algorithm choice) and code run per call (the launch). Shapes are static: every
size is a constant of the generated source.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from byoc.codegen_c.kernel_call import CBuffer
from byoc.codegen_cuda.elementwise import coordinates, strides
from byoc.codegen_cuda.prologue import CUDA_DATA_TYPES, CUDNN_DATA_TYPES, DEVICE_TYPES
from byoc.errors import CodegenError

THREADS = 256


class Operand(CBuffer):
    """A tensor in device memory: `name` is its device pointer, of type `ctype*` in CUDA."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str) -> None:
        super().__init__(name, shape, dtype, "device")

    @property
    def ctype(self) -> str:
        return DEVICE_TYPES[self.dtype]


@dataclass
class Code:
    global_source: str = ""
    init: list[str] = field(default_factory=list)
    run: list[str] = field(default_factory=list)
    uses_cublas: bool = False
    uses_cudnn: bool = False
    workspace: str | None = None  # C expression of the cuDNN workspace bytes it needs (set at init)


Writer = Callable[[Mapping[str, Any], str, Sequence[Operand], Operand], Code]


def launch(kernel: str, blocks: int, args: Sequence[str]) -> str:
    return (f"{kernel}<<<{max(1, blocks)}, {THREADS}, 0, byoc_stream>>>({', '.join(args)}); "
            f"CUDA_CHECK(cudaGetLastError(), \"launching {kernel}\");")


def _signature(kernel: str, inputs: Sequence[Operand], output: Operand) -> str:
    params = [f"const {o.ctype}* __restrict__ in{k}" for k, o in enumerate(inputs)] + [f"{output.ctype}* __restrict__ out"]
    return f"__global__ void {kernel}({', '.join(params)})"


def _args(inputs: Sequence[Operand], output: Operand) -> list[str]:
    return [f"({o.ctype}*){o.name}" for o in inputs] + [f"({output.ctype}*){output.name}"]


def matmul(node, kernel, inputs, output) -> Code:
    """relax.matmul as one strided batched product of cuBLAS (row-major data: C^T = B^T A^T in
    cuBLAS's column-major terms), float32 accumulation."""
    a, b = inputs
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if len(b.shape) == 2:  # the activations' batch folds into the rows
        m, batch, stride_a, stride_b = math.prod(a.shape[:-1]), 1, 0, 0
    else:
        batch = math.prod(output.shape[:-2])
        stride_a = m * k if math.prod(a.shape[:-2]) == batch else 0
        stride_b = k * n if math.prod(b.shape[:-2]) == batch else 0
    dtype = CUDA_DATA_TYPES[output.dtype]
    call = (f"LIB_CHECK(byoc_lib.gemm(byoc_cublas, CUBLAS_OP_N, CUBLAS_OP_N, {n}, {m}, {k}, &byoc_one, {b.name}, {dtype}, {n}, "
            f"{stride_b}LL, {a.name}, {dtype}, {k}, {stride_a}LL, &byoc_zero, {output.name}, {dtype}, {n}, {m * n}LL, {batch}, "
            f"CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), \"cuBLAS\", \"{node['name']}: the product\");")
    return Code(run=[call], uses_cublas=True)


def conv2d(node, kernel, inputs, output) -> Code:
    """relax.nn.conv2d (NCHW, OIHW, symmetric padding) through cuDNN: descriptors and the
    algorithm its heuristics rank first made at initialisation, the convolution per call."""
    x, w = inputs
    attrs = node["attrs"]
    top, left, bottom, right = attrs["padding"]
    if (top, left) != (bottom, right):
        raise CodegenError(f"{node['name']}: cuDNN pads both sides alike; padding {attrs['padding']}")
    data, compute = CUDNN_DATA_TYPES[output.dtype], CUDNN_DATA_TYPES["float32"]
    math_type = "CUDNN_FMA_MATH" if output.dtype == "float32" else "CUDNN_TENSOR_OP_MATH"  # no TF32 for float32, as torch's allow_tf32=False
    d = f"{kernel}_d"
    global_source = f"static void *{d}_x, *{d}_w, *{d}_conv, *{d}_y; static int {d}_algo;"
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    init = [
        f"LIB_CHECK(byoc_lib.createTensor(&{d}_x), \"cuDNN\", \"{node['name']}\");",
        f"LIB_CHECK(byoc_lib.createFilter(&{d}_w), \"cuDNN\", \"{node['name']}\");",
        f"LIB_CHECK(byoc_lib.createConvolution(&{d}_conv), \"cuDNN\", \"{node['name']}\");",
        f"LIB_CHECK(byoc_lib.createTensor(&{d}_y), \"cuDNN\", \"{node['name']}\");",
        f"LIB_CHECK(byoc_lib.setTensor4d({d}_x, CUDNN_TENSOR_NCHW, {data}, {', '.join(map(str, x.shape))}), \"cuDNN\", "
        f"\"{node['name']}: input\");",
        f"LIB_CHECK(byoc_lib.setFilter4d({d}_w, {data}, CUDNN_TENSOR_NCHW, {', '.join(map(str, w.shape))}), \"cuDNN\", "
        f"\"{node['name']}: weights\");",
        f"LIB_CHECK(byoc_lib.setConvolution2d({d}_conv, {top}, {left}, {sh}, {sw}, {dh}, {dw}, CUDNN_CROSS_CORRELATION, {compute}), "
        f"\"cuDNN\", \"{node['name']}: convolution\");",
        f"LIB_CHECK(byoc_lib.setGroupCount({d}_conv, {attrs['groups']}), \"cuDNN\", \"{node['name']}: groups\");",
        f"LIB_CHECK(byoc_lib.setMathType({d}_conv, {math_type}), \"cuDNN\", \"{node['name']}: math\");",
        f"LIB_CHECK(byoc_lib.setTensor4d({d}_y, CUDNN_TENSOR_NCHW, {data}, {', '.join(map(str, output.shape))}), \"cuDNN\", "
        f"\"{node['name']}: output\");",
        f"if (byoc_choose_algorithm({d}_x, {d}_w, {d}_conv, {d}_y, {int(output.dtype != 'float32')}, &{d}_algo, \"{node['name']}\")) "
        "return 1;",
    ]
    run = [f"LIB_CHECK(byoc_lib.convolutionForward(byoc_cudnn, &byoc_one, {d}_x, {x.name}, {d}_w, {w.name}, {d}_conv, {d}_algo, "
           f"byoc_workspace, byoc_workspace_bytes, &byoc_zero, {d}_y, {output.name}), \"cuDNN\", \"{node['name']}\");"]
    return Code(global_source, init, run, uses_cudnn=True)


CHOOSE_ALGORITHM = r"""
/* The first of cuDNN's heuristics' algorithms that fits the workspace limit, with the math type it
   was ranked for (float16 and bfloat16: tensor cores; float32 stays on FMA), and the workspace it
   needs kept as the region's largest. */
static int byoc_choose_algorithm(void* x, void* w, void* conv, void* y, int any_math, int* algo, const char* where) {
  cudnnConvolutionFwdAlgoPerf perf[8];
  int returned = 0;
  LIB_CHECK(byoc_lib.getAlgorithm(byoc_cudnn, x, w, conv, y, 8, &returned, perf), "cuDNN", where);
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != 0 || perf[i].memory > (size_t)1 << 30) continue;
    *algo = perf[i].algo;
    if (any_math) LIB_CHECK(byoc_lib.setMathType(conv, perf[i].mathType), "cuDNN", where);
    size_t bytes = 0;
    LIB_CHECK(byoc_lib.getWorkspaceSize(byoc_cudnn, x, w, conv, y, *algo, &bytes), "cuDNN", where);
    if (bytes > byoc_workspace_bytes) byoc_workspace_bytes = bytes;
    return 0;
  }
  BYOC_FAIL("%s: cuDNN has no algorithm for this convolution", where);
}
"""


def _per_row(kernel: str, inputs: Sequence[Operand], output: Operand, body: str) -> Code:
    """A kernel of one block per row of the first input's last axis: `xs` is the row read, `ys`
    the row written, `shared` the block's scratch for its reductions."""
    x = inputs[0]
    length = x.shape[-1]
    source = f"""
{_signature(kernel, inputs, output)} {{
  __shared__ float shared[32];
  const long long row = blockIdx.x;
  const {x.ctype}* xs = in0 + row * {length}LL;
  {output.ctype}* ys = out + row * {length}LL;
{body}
}}"""
    return Code(source, run=[launch(kernel, x.size // length, _args(inputs, output))])


def softmax(node, kernel, inputs, output) -> Code:
    """relax.nn.softmax over the last axis: one block per row, its max and sum reduced in the block."""
    (x,) = inputs
    length = x.shape[-1]
    body = f"""  float best = -INFINITY;
  for (int j = threadIdx.x; j < {length}; j += blockDim.x) best = fmaxf(best, to_f(xs[j]));
  best = byoc_block_max(best, shared);
  float total = 0.0f;
  for (int j = threadIdx.x; j < {length}; j += blockDim.x) total += expf(to_f(xs[j]) - best);
  total = byoc_block_sum(total, shared);
  for (int j = threadIdx.x; j < {length}; j += blockDim.x) ys[j] = from_f<{output.ctype}>(expf(to_f(xs[j]) - best) / total);"""
    return _per_row(kernel, inputs, output, body)


def layer_norm(node, kernel, inputs, output) -> Code:
    """relax.nn.layer_norm over the last axis, with its scale and shift: one block per row, the mean
    and then the variance reduced in the block (two passes, as exact as onnxruntime's)."""
    x, gamma, beta = inputs
    length, epsilon = x.shape[-1], float(node["attrs"]["epsilon"])
    body = f"""  float total = 0.0f;
  for (int j = threadIdx.x; j < {length}; j += blockDim.x) total += to_f(xs[j]);
  const float mean = byoc_block_sum(total, shared) / {length}.0f;
  float squares = 0.0f;
  for (int j = threadIdx.x; j < {length}; j += blockDim.x) {{ float d = to_f(xs[j]) - mean; squares += d * d; }}
  const float scale = rsqrtf(byoc_block_sum(squares, shared) / {length}.0f + {epsilon!r}f);
  for (int j = threadIdx.x; j < {length}; j += blockDim.x)
    ys[j] = from_f<{output.ctype}>((to_f(xs[j]) - mean) * scale * to_f(in1[j]) + to_f(in2[j]));"""
    return _per_row(kernel, inputs, output, body)


def _per_element(kernel: str, inputs: Sequence[Operand], output: Operand, body: str) -> Code:
    # 32-bit indices where every tensor is under 2^31 elements: a 64-bit division by a constant
    # costs several times a 32-bit one, and an element-wise kernel makes one per axis.
    wide = max(o.size for o in (*inputs, output)) >= 2**31
    source = f"""
{_signature(kernel, inputs, output)} {{
  typedef {'long long' if wide else 'int'} byoc_index_t;
  const byoc_index_t i = blockIdx.x * (byoc_index_t)blockDim.x + threadIdx.x;
  if (i >= {output.size}LL) return;
{coordinates(output.shape)}
{body}
}}"""
    return Code(source, run=[launch(kernel, -(-output.size // THREADS), _args(inputs, output))])


def mean(node, kernel, inputs, output) -> Code:
    """relax.mean (and relax.sum) over any axes: each thread sums its output's inputs."""
    (x,) = inputs
    axes = sorted(a % len(x.shape) for a in (node["attrs"]["axis"] or range(len(x.shape))))
    kept = [a for a in range(len(x.shape)) if a not in axes]
    keepdims = node["attrs"]["keepdims"]
    in_strides = strides(x.shape)
    base = " + ".join(f"c{axis if keepdims else k} * {in_strides[axis]}" for k, axis in enumerate(kept)) or "0"
    count = math.prod(x.shape[a] for a in axes)
    inner = []
    rest = "r"
    for axis in reversed(axes):
        inner.append(f"    const byoc_index_t r{axis} = {rest} % {x.shape[axis]};")
        rest = f"({rest} / {x.shape[axis]})"
    offset = " + ".join(f"r{a} * {in_strides[a]}" for a in axes)
    scale = f" / {count}.0f" if node["op"] == "relax.mean" else ""
    body = f"""  const byoc_index_t base = {base};
  float total = 0.0f;
  for (byoc_index_t r = 0; r < {count}; ++r) {{
{chr(10).join(inner)}
    total += to_f(in0[base + {offset}]);
  }}
  out[i] = from_f<{output.ctype}>(total{scale});"""
    return _per_element(kernel, inputs, output, body)


def pool2d(node, kernel, inputs, output) -> Code:
    """relax.nn.max_pool2d and avg_pool2d (NCHW): each thread reduces its window."""
    (x,) = inputs
    attrs = node["attrs"]
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    top, left = attrs["padding"][0], attrs["padding"][1]
    height, width = x.shape[2], x.shape[3]
    is_max = node["op"] == "relax.nn.max_pool2d"
    count = "(float)counted" if not attrs.get("count_include_pad", False) else f"{kh * kw}.0f"
    body = f"""  const {x.ctype}* plane = in0 + (c0 * {x.shape[1]} + c1) * (byoc_index_t){height * width};
  float value = {'-INFINITY' if is_max else '0.0f'};
  int counted = 0;
  for (int a = 0; a < {kh}; ++a) for (int b = 0; b < {kw}; ++b) {{
    const byoc_index_t h = c2 * {sh} - {top} + a * {dh}, w = c3 * {sw} - {left} + b * {dw};
    if (h < 0 || h >= {height} || w < 0 || w >= {width}) continue;
    const float v = to_f(plane[h * {width} + w]);
    value = {'fmaxf(value, v)' if is_max else 'value + v'}; ++counted;
  }}
  out[i] = from_f<{output.ctype}>({'value' if is_max else f'value / {count}'});"""
    return _per_element(kernel, inputs, output, body)


def take(node, kernel, inputs, output) -> Code:
    """relax.take along axis 0 (embedding lookups): each thread copies one element of its row."""
    table, indices = inputs
    rows, width = table.shape[0], math.prod(table.shape[1:])
    mode = node["attrs"].get("mode", "fast")
    row = f"(r % {rows}LL + {rows}LL) % {rows}LL" if mode == "wrap" else f"(r < 0 ? 0 : r >= {rows} ? {rows - 1} : r)"
    body = f"""  const long long r = (long long)in1[i / {width}];
  out[i] = in0[({row}) * {width}LL + i % {width}];"""
    return _per_element(kernel, inputs, output, body)


def permute_dims(node, kernel, inputs, output) -> Code:
    """relax.permute_dims: each thread moves one element."""
    (x,) = inputs
    axes = node["attrs"]["axes"] or list(range(len(x.shape)))[::-1]
    in_strides = strides(x.shape)
    offset = " + ".join(f"c{k} * {in_strides[axis]}" for k, axis in enumerate(axes)) or "0"
    return _per_element(kernel, inputs, output, f"  out[i] = in0[{offset}];")


def concat(node, kernel, inputs, output) -> Code:
    """relax.concat: each thread finds the input its element comes from."""
    axis = node["attrs"]["axis"] % len(output.shape)
    lines, start = [], 0
    for k, operand in enumerate(inputs):
        end = start + operand.shape[axis]
        operand_strides = strides(operand.shape)
        offset = " + ".join(f"(c{a}{f' - {start}' if a == axis else ''}) * {operand_strides[a]}" for a in range(len(output.shape)))
        lines.append(f"  {'if' if k == 0 else 'else if'} (c{axis} < {end}) out[i] = in{k}[{offset}];")
        start = end
    return _per_element(kernel, inputs, output, "\n".join(lines))


WRITERS: dict[str, Writer] = {
    "relax.matmul": matmul,
    "relax.nn.conv2d": conv2d,
    "relax.nn.softmax": softmax,
    "relax.nn.layer_norm": layer_norm,
    "relax.mean": mean,
    "relax.sum": mean,
    "relax.nn.max_pool2d": pool2d,
    "relax.nn.avg_pool2d": pool2d,
    "relax.take": take,
    "relax.permute_dims": permute_dims,
    "relax.concat": concat,
}
# Ops whose result is their input's memory read another way: no kernel, the buffer is shared.
VIEWS = ("relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims")
