"""Which kernel runs a float32 dense product (activations times constant 2-D weights) on this
machine: oneDNN's matmul, or OpenBLAS's sgemm followed by one oneDNN primitive for the bias and
post-ops (`openblas`). Measured, not assumed: each shape is timed once per machine, both ways, in
a small program compiled once per machine, and the choice is kept in byoc's cache.

The machine is its CPU model, oneDNN's instruction-set limit, OpenBLAS's kernels, the thread
count and both libraries' versions: a choice made on one is never read on another. Measured on 2
cores of an AMD EPYC (see docs/benchmarks.md): with oneDNN limited to AVX2, OpenBLAS ran BERT's
768 to 3072 dense layer 1.9x faster and the other BERT layers within 8% of oneDNN; with AVX-512,
oneDNN's brgemm won every BERT and VGG-19 shape (1.2-1.8x).

The code of such a product holds both kernels, and the region asks at load which one runs
(`GLOBAL_FUNCTION`, registered by `register_choice`): the loading machine's choice, measured
there on first load, so an artifact built on one CPU runs the faster kernel on another. Where
nothing answers (TVM's runtime alone), the building machine's choice runs. The build option
`dense_kernel` ("measured", "onednn", "openblas") names one kernel instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi

from byoc.cache_dirs import library_cache_dir
from byoc.codegen_c.onednn import library, openblas, threads
from byoc.codegen_c.onednn.settings import DENSE_KERNELS
from byoc.errors import BuildError
from byoc.timing import machine_description

KERNELS = ("onednn", "openblas")
CHOICES = DENSE_KERNELS  # "measured", then KERNELS
# OpenBLAS is chosen only where it takes at most this share of oneDNN's time: a closer race is
# noise, and oneDNN keeps the fused post-ops and the layouts the rest of the region reads.
MARGIN = 0.92
# Smaller products are left to oneDNN unmeasured: at most about 0.1 ms either way, and a model of
# many small shapes (a test suite's) would pay more for timing them than it could gain.
MEASURED_MACS = 1 << 23
# How long each kernel is timed, at most, per shape (after two runs to warm up): enough rounds
# for a median on a noisy machine, few enough that a BERT's 4 shapes take about a second.
_BUDGET_S = 0.15
_ROUNDS = (5, 40)

_SOURCE = r"""
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/tbb/global_control.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
extern "C" {
""" + openblas.SGEMM_DECLARATION + r"""
}
#define CHECK(call) do { if ((call) != dnnl_success) { std::fprintf(stderr, "oneDNN failed: %s\n", #call); return 2; } } while (0)
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

/* argv: m k n bias post threads budget_s min_rounds max_rounds. Prints both kernels' median ms. */
int main(int argc, char** argv) {
  if (argc != 10) return 1;
  long m = std::atol(argv[1]), k = std::atol(argv[2]), n = std::atol(argv[3]);
  int bias = std::atoi(argv[4]), post = std::atoi(argv[5]), count = std::atoi(argv[6]);
  double budget = std::atof(argv[7]);
  int least = std::atoi(argv[8]), most = std::atoi(argv[9]);
  oneapi::tbb::global_control* limit = count > 0 ? new oneapi::tbb::global_control(
      oneapi::tbb::global_control::max_allowed_parallelism, count) : nullptr;
  (void)limit;
  std::vector<float> a(m * k), b(k * n), c(m * n), d(n, 0.5f);
  for (size_t i = 0; i < a.size(); i++) a[i] = (float)((i * 7919) % 1000) / 1000.f - 0.5f;
  for (size_t i = 0; i < b.size(); i++) b[i] = (float)((i * 104729) % 1000) / 1000.f - 0.5f;
  dnnl_engine_t engine; dnnl_stream_t stream;
  CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
  CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
  dnnl_dims_t a_dims = {m, k}, b_dims = {k, n}, c_dims = {m, n}, d_dims = {1, n};
  dnnl_memory_desc_t a_md, b_md, b_any, c_md, d_md;
  CHECK(dnnl_memory_desc_create_with_tag(&a_md, 2, a_dims, dnnl_f32, dnnl_ab));
  CHECK(dnnl_memory_desc_create_with_tag(&b_md, 2, b_dims, dnnl_f32, dnnl_ab));
  CHECK(dnnl_memory_desc_create_with_tag(&b_any, 2, b_dims, dnnl_f32, dnnl_format_tag_any));
  CHECK(dnnl_memory_desc_create_with_tag(&c_md, 2, c_dims, dnnl_f32, dnnl_ab));
  CHECK(dnnl_memory_desc_create_with_tag(&d_md, 2, d_dims, dnnl_f32, dnnl_ab));
  dnnl_primitive_attr_t attr;
  CHECK(dnnl_primitive_attr_create(&attr));
  if (post) {
    dnnl_post_ops_t ops;
    CHECK(dnnl_post_ops_create(&ops));
    CHECK(dnnl_post_ops_append_eltwise(ops, dnnl_eltwise_gelu_erf, 0.f, 0.f));
    CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
  }
  dnnl_memory_t a_mem, b_mem, packed, c_mem, d_mem;
  CHECK(dnnl_memory_create(&a_mem, a_md, engine, a.data()));
  CHECK(dnnl_memory_create(&b_mem, b_md, engine, b.data()));
  CHECK(dnnl_memory_create(&c_mem, c_md, engine, c.data()));
  CHECK(dnnl_memory_create(&d_mem, d_md, engine, d.data()));
  /* oneDNN: the matmul with its weights reordered once, bias and post-op fused. */
  dnnl_primitive_desc_t pd, reorder_pd;
  CHECK(dnnl_matmul_primitive_desc_create(&pd, engine, a_md, b_any, bias ? d_md : NULL, c_md, attr));
  const_dnnl_memory_desc_t packed_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  CHECK(dnnl_memory_create(&packed, packed_md, engine, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_reorder_primitive_desc_create(&reorder_pd, b_md, engine, packed_md, engine, NULL));
  dnnl_primitive_t matmul, reorder, tail = NULL;
  CHECK(dnnl_primitive_create(&matmul, pd));
  CHECK(dnnl_primitive_create(&reorder, reorder_pd));
  dnnl_exec_arg_t reorder_args[2] = {{DNNL_ARG_FROM, b_mem}, {DNNL_ARG_TO, packed}};
  CHECK(dnnl_primitive_execute(reorder, stream, 2, reorder_args));
  dnnl_exec_arg_t matmul_args[4] = {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, packed}, {DNNL_ARG_DST, c_mem}, {DNNL_ARG_BIAS, d_mem}};
  /* OpenBLAS: sgemm, then the bias (a binary add) and post-op in one primitive, in place. */
  dnnl_primitive_desc_t tail_pd = NULL;
  if (bias) CHECK(dnnl_binary_primitive_desc_create(&tail_pd, engine, dnnl_binary_add, c_md, d_md, c_md, attr));
  else if (post) CHECK(dnnl_eltwise_forward_primitive_desc_create(&tail_pd, engine, dnnl_forward_inference, dnnl_eltwise_gelu_erf,
                                                                   c_md, c_md, 0.f, 0.f, NULL));
  if (tail_pd) CHECK(dnnl_primitive_create(&tail, tail_pd));
  dnnl_exec_arg_t tail_args[3] = {{DNNL_ARG_SRC_0, c_mem}, {DNNL_ARG_SRC_1, d_mem}, {DNNL_ARG_DST, c_mem}};
  dnnl_exec_arg_t eltwise_args[2] = {{DNNL_ARG_SRC, c_mem}, {DNNL_ARG_DST, c_mem}};
  auto by_onednn = [&]() {
    dnnl_primitive_execute(matmul, stream, bias ? 4 : 3, matmul_args);
    dnnl_stream_wait(stream);
  };
  auto by_openblas = [&]() {
    scipy_cblas_sgemm(101, 111, 111, (int)m, (int)n, (int)k, 1.f, a.data(), (int)k, b.data(), (int)n, 0.f, c.data(), (int)n);
    if (tail) {
      if (bias) dnnl_primitive_execute(tail, stream, 3, tail_args);
      else dnnl_primitive_execute(tail, stream, 2, eltwise_args);
      dnnl_stream_wait(stream);
    }
  };
  double slowest = 0;
  for (int warm = 0; warm < 2; warm++) {
    double t0 = now(); by_onednn(); double t1 = now(); by_openblas(); double t2 = now();
    slowest = std::max(slowest, std::max(t1 - t0, t2 - t1));
  }
  int rounds = std::max(least, std::min(most, (int)(budget / std::max(slowest, 1e-6))));
  std::vector<double> onednn, blas;
  for (int r = 0; r < rounds; r++) {  /* interleaved: both see the same moments of a noisy machine */
    double t0 = now(); by_onednn(); double t1 = now(); by_openblas(); double t2 = now();
    onednn.push_back(t1 - t0); blas.push_back(t2 - t1);
  }
  std::printf("{\"onednn\": %.6f, \"openblas\": %.6f, \"rounds\": %d}\n", median(onednn) * 1e3, median(blas) * 1e3, rounds);
  return 0;
}
"""

_lock = threading.Lock()


# The global function a region's C asks at load which kernel runs each of its products
# (`byoc_dense_by_openblas` in the oneDNN library's C): the choice is the loading machine's.
GLOBAL_FUNCTION = "byoc.onednn.dense_by_openblas"


@dataclass(frozen=True)
class Product:
    """A dense product of an (m, k) float32 matrix by constant (k, n) weights, with a bias or
    not, and element-wise post-ops or not."""

    m: int
    k: int
    n: int
    bias: bool
    post: bool

    @property
    def key(self) -> str:
        return f"{self.m}x{self.k}x{self.n}" + (" bias" if self.bias else "") + (" post-ops" if self.post else "")

    @classmethod
    def from_key(cls, key: str) -> Product:
        sizes, *flags = key.split(" ", 1)
        m, k, n = (int(v) for v in sizes.split("x"))
        rest = flags[0] if flags else ""
        return cls(m, k, n, "bias" in rest, "post-ops" in rest)


def machine_key() -> str:
    """What the choice depends on besides the shape."""
    return "; ".join([machine_description(), f"threads {threads.requested() or len(os.sched_getaffinity(0))}",
                      f"oneDNN {library.version()}", f"OpenBLAS {openblas.version()} {openblas.core()}"])


def choices_path() -> Path:
    digest = hashlib.sha256(machine_key().encode()).hexdigest()[:24]
    return library_cache_dir() / f"dense-products-{digest}.json"


def kernel_for(product: Product, option: str = "measured") -> str:
    """The kernel that runs `product`: the option's where it names one, else the faster here
    (oneDNN where OpenBLAS is not installed)."""
    if option not in CHOICES:
        raise BuildError(f"dense_kernel={option!r}: expected one of {', '.join(CHOICES)}")
    if option == "openblas" and not openblas.installed():
        raise BuildError(f"dense_kernel='openblas': OpenBLAS is not installed ({openblas.PACKAGE}): pip install 'byoc[dnnl]'")
    if option != "measured":
        return option
    if not openblas.installed():
        return "onednn"
    return measured(product)["kernel"]


def measured(product: Product) -> dict:
    """Both kernels' median milliseconds on `product` here, and the faster (`kernel`): from the
    cache, else timed now and kept."""
    path = choices_path()
    with _lock:
        known = _read(path)
        if product.key in known:
            return known[product.key]
        times = _time(product)
        kernel = "openblas" if times["openblas"] <= MARGIN * times["onednn"] else "onednn"
        entry = {"onednn": times["onednn"], "openblas": times["openblas"], "kernel": kernel}
        known = {**_read(path), product.key: entry, "machine": machine_key()}
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as file:
            json.dump(known, file, indent=1)
        os.replace(file.name, path)  # atomic: a concurrent build reads the whole file or the old one
        return entry


def _read(path: Path) -> dict:
    """The choices kept at `path`; none where it is missing or unreadable (they are measured again)."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) and known.get("machine") == machine_key() else {}


def _time(product: Product) -> dict:
    program = _program()
    env = {**os.environ}
    env.setdefault(openblas.SPIN_ENV, openblas.SPIN_LEAST)
    args = [str(program), str(product.m), str(product.k), str(product.n), str(int(product.bias)), str(int(product.post)),
            str(threads.requested() or 0), str(_BUDGET_S), *(str(r) for r in _ROUNDS)]
    run = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    if run.returncode != 0:
        raise BuildError(f"timing the dense product {product.key} failed: {(run.stderr or run.stdout).strip()[-1000:]}")
    return json.loads(run.stdout)


def _program() -> Path:
    """The timing program, compiled once per machine into byoc's cache."""
    dirs = [*library.library_dirs(), openblas.library_dir()]
    flags = ["-O2", f"-I{library.include_dir()}", f"-I{library.tbb_include_dir()}", *(f"-L{d}" for d in dirs),
             "-Wl,--disable-new-dtags", *(f"-Wl,-rpath,{d}" for d in dirs), *(f"-l{lib}" for lib in library.LIBRARIES),
             f"-l{openblas.LIBRARY}"]
    return library.compiled_once("dense-product-timing", _SOURCE, flags, "the dense product timing")


def _by_openblas_here(key: str) -> int:
    return int(kernel_for(Product.from_key(key)) == "openblas")


def register_choice() -> None:
    """Let regions ask this process which kernel runs each product (`GLOBAL_FUNCTION`), where the
    timing program can be compiled here; elsewhere (a deployment without g++ or oneDNN's
    headers) nothing answers, and the building machine's choice runs."""
    if library.helpers_missing() is None:
        tvm_ffi.register_global_func(GLOBAL_FUNCTION, _by_openblas_here, override=True)
