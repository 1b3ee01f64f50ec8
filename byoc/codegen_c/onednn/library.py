"""oneDNN from pip, built with TBB (`onednn-cpu-tbb`, `onednn-devel-cpu-tbb`, with `tbb-devel` and
the Intel runtime `intel-cmplr-lib-rt` it links against): where it is, and the C shared by every
oneDNN kernel of a region.

Why TBB and not the OpenMP build (`onednn-cpu-gomp`): OpenMP splits every primitive statically
between its threads and waits at a barrier for the slowest, so a thread that the OS preempts for
another process stalls the whole primitive; measured with 2 threads on 2 cores while another
process kept one core busy, a tiny GPT-2 took 0.41 ms at the median and over 8 ms at p90
(p90/median 21), ConvNeXt up to 178x. Telling OpenMP to sleep instead of spinning
(OMP_WAIT_POLICY=PASSIVE) removed the stalls but paid a wake-up per primitive: 12x slower on a
quiet machine. TBB's threads take work as they come free, as onnxruntime's do: p90/median 1.1-1.2
with a core busy, and 7-13% slower than OpenMP at the median on a quiet machine (tiny models,
dozens of primitives of microseconds each; see docs/benchmarks.md).

Every tensor of a region has a `dnnl_memory_t <buffer>_mem`. Region inputs, outputs and
constants are plain (row-major) memories over the host's data; each kernel creates the memory of
the intermediates it produces in the layout its primitive chose (blocked, e.g. nChw16c), so that
activations stay in oneDNN's layout across the region and are reordered only where a consumer
wants another layout, typically at the region's boundary.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from byoc import library_path
from byoc.cache_dirs import library_cache_dir
from byoc.codegen_c.kernel_call import CBuffer, KernelCode
from byoc.codegen_c.onednn.kernel_scales import DNNL_TYPES
from byoc.codegen_c.onednn.openblas import SGEMM_DECLARATION
from byoc.codegen_c.symbolic_shapes import array_storage
from byoc.errors import BuildError

RUNTIME_PACKAGE = "onednn-cpu-tbb"
HEADERS_PACKAGE = "onednn-devel-cpu-tbb"
TBB_PACKAGE = "tbb"
TBB_HEADERS_PACKAGE = "tbb-devel"
# libdnnl (built with Intel's compiler) needs libimf and libintlc, which its wheel does not declare.
INTEL_RUNTIME_PACKAGE = "intel-cmplr-lib-rt"
PACKAGES = (RUNTIME_PACKAGE, HEADERS_PACKAGE, TBB_HEADERS_PACKAGE, INTEL_RUNTIME_PACKAGE)


def _locate(package: str, suffix: str) -> Path:
    try:
        files = metadata.distribution(package).files or []
    except metadata.PackageNotFoundError:
        deployed = library_path.find(Path(suffix).name)  # a deployment's copy (see byoc.library_path)
        if deployed is not None:
            return deployed
        raise BuildError(f"oneDNN is not installed ({package} is missing): pip install {' '.join(PACKAGES)}") from None
    for file in files:
        if str(file).endswith(suffix):
            return Path(file.locate()).resolve()
    raise BuildError(f"package {package} has no {suffix}; reinstall it: pip install --force-reinstall {package}")


@functools.cache
def include_dir() -> str:
    # <prefix>/include/oneapi/dnnl/dnnl.h -> <prefix>/include
    return str(_locate(HEADERS_PACKAGE, "oneapi/dnnl/dnnl.h").parent.parent.parent)


@functools.cache
def tbb_include_dir() -> str:
    # <prefix>/include/oneapi/tbb/global_control.h -> <prefix>/include
    return str(_locate(TBB_HEADERS_PACKAGE, "oneapi/tbb/global_control.h").parent.parent.parent)


@functools.cache
def library_dirs() -> list[str]:
    """Where libdnnl, libtbb and the Intel runtime are. Each is linked by name, so that libdnnl's
    own dependencies resolve to the libraries already loaded: the wheels give libdnnl no rpath."""
    found = [_locate(RUNTIME_PACKAGE, "libdnnl.so.3"), _locate(TBB_PACKAGE, "libtbb.so.12"), _locate(INTEL_RUNTIME_PACKAGE, "libimf.so")]
    return list(dict.fromkeys(str(path.parent) for path in found))


LIBRARIES = ("dnnl", "tbb", "imf", "intlc")


def installed() -> bool:
    try:
        metadata.distribution(RUNTIME_PACKAGE)
        return True
    except metadata.PackageNotFoundError:
        return library_path.find("libdnnl.so.3") is not None


def version() -> str:
    try:
        return metadata.version(RUNTIME_PACKAGE)
    except metadata.PackageNotFoundError:
        return f"deployed ({library_path.VARIABLE})"


def helpers_missing() -> str | None:
    """Why the small C++ helpers (`compiled_once`) cannot be compiled on this machine, or None: a
    deployment target (see byoc.deploy) may have oneDNN's runtime without its headers or g++."""
    if shutil.which("g++") is None:
        return "g++ is not installed"
    try:
        include_dir(), tbb_include_dir()
    except BuildError as error:
        return str(error)
    return None


def compiled_once(name: str, source: str, flags: list[str], what: str) -> Path:
    """C++ `source` compiled with `flags` (`-shared -fPIC` for a library), once per machine, into
    byoc's cache as `<name>-<digest>`: TBB's thread limit, the dense product timing."""
    digest = hashlib.sha256((source + repr(flags)).encode()).hexdigest()[:24]
    path = library_cache_dir() / f"{name}-{digest}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            source_file, built = Path(tmp) / f"{name}.cpp", Path(tmp) / name
            source_file.write_text(source)
            run = subprocess.run(["g++", str(source_file), "-o", str(built), *flags], capture_output=True, text=True)
            if run.returncode != 0:
                raise BuildError(f"compiling {what} failed: {run.stderr.strip()[-2000:]}")
            os.replace(built, path)  # atomic: a concurrent process sees the whole file or none
    return path


PROLOGUE = r"""
#ifndef BYOC_OWNERSHIP  /* static shapes: each kernel is made once, and owns what it makes for the process */
typedef int byoc_arena;
static byoc_arena* byoc_arena_now = NULL;
static int byoc_replaced = 0;
#endif
static dnnl_engine_t byoc_engine = NULL;
static dnnl_stream_t byoc_stream = NULL;

#define DNNL_CHECK(call, what) do { if ((call) != dnnl_success) BYOC_FAIL(what); } while (0)
/* A kernel's check: its location (one string per kernel) and what failed, joined on failure. */
static char byoc_dnnl_failure[1024];
static const char* byoc_status_name(dnnl_status_t status) {
  switch (status) {
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_last_impl_reached: return "no implementation left";
    case dnnl_runtime_error: return "runtime error";
    default: return "error";
  }
}

/* A function rather than the formatting inline: a region makes thousands of checks, each inline
   copy more code to compile. */
static int byoc_failed(dnnl_status_t status, const char* where, const char* what) {
  if (status == dnnl_success) return 0;
  snprintf(byoc_dnnl_failure, sizeof byoc_dnnl_failure, "%s: %s (oneDNN: %s)", where, what, byoc_status_name(status));
  return 1;
}
#define DNNL_CHECK_AT(call, where, what) do { if (byoc_failed((call), where, what)) BYOC_FAIL(byoc_dnnl_failure); } while (0)

static dnnl_status_t byoc_dnnl_setup(void) {
  dnnl_status_t status = dnnl_success;
  if (byoc_engine == NULL) status = dnnl_engine_create(&byoc_engine, dnnl_cpu, 0);
  if (status == dnnl_success && byoc_stream == NULL) status = dnnl_stream_create(&byoc_stream, byoc_engine, dnnl_stream_default_flags);
  return status;
}

/* OpenBLAS's sgemm, which the dense products chosen for it call (see emitters.products). */
#ifdef __cplusplus
extern "C"
#endif
""" + SGEMM_DECLARATION + r"""

/* 1 where OpenBLAS runs the dense product `key` ("128x768x3072 bias post-ops") on this machine,
   as byoc measured it here (the global function byoc registers where it loads a model, see
   byoc.codegen_c.onednn.product_choice), else `built`: the building machine's choice, where byoc
   is not there to ask or cannot answer. */
static int byoc_dense_by_openblas(const char* key, int built) {
  static const char name[] = "byoc.onednn.dense_by_openblas";
  TVMFFIByteArray bytes = {name, sizeof name - 1};
  TVMFFIObjectHandle function = NULL, error = NULL;
  TVMFFIAny arg, result;
  int status;
  if (TVMFFIFunctionGetGlobal(&bytes, &function) != 0 || function == NULL) {
    TVMFFIErrorMoveFromRaised(&error);
    if (error != NULL) TVMFFIObjectDecRef(error);
    return built;
  }
  memset(&arg, 0, sizeof arg);
  memset(&result, 0, sizeof result);
  arg.type_index = kTVMFFIRawStr;
  arg.v_c_str = key;
  result.type_index = kTVMFFINone;
  status = TVMFFIFunctionCall(function, &arg, 1, &result);
  TVMFFIObjectDecRef(function);
  if (status != 0) {
    TVMFFIErrorMoveFromRaised(&error);
    if (error != NULL) TVMFFIObjectDecRef(error);
    return built;
  }
  if (result.type_index == kTVMFFIInt || result.type_index == kTVMFFIBool) return result.v_int64 != 0;
  return built;
}

static dnnl_status_t byoc_plain_md(dnnl_memory_desc_t* md, int ndims, const dnnl_dims_t dims, dnnl_data_type_t type) {
  static const dnnl_format_tag_t tags[] = {dnnl_a, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde, dnnl_abcdef};
  return dnnl_memory_desc_create_with_tag(md, ndims, dims, type, tags[ndims]);
}

/* A plain memory object over `handle` (the engine made first): one call per region buffer. */
static dnnl_status_t byoc_plain_memory(dnnl_memory_t* memory, int ndims, const dnnl_dims_t dims, dnnl_data_type_t type, void* handle) {
  dnnl_memory_desc_t md;
  dnnl_status_t status = byoc_dnnl_setup();
  if (status == dnnl_success) status = byoc_plain_md(&md, ndims, dims, type);
  if (status != dnnl_success) return status;
  status = dnnl_memory_create(memory, md, byoc_engine, handle);
  dnnl_memory_desc_destroy(md);
  return status;
}

static const_dnnl_memory_desc_t byoc_md(dnnl_memory_t memory) {
  const_dnnl_memory_desc_t md = NULL;
  dnnl_memory_get_memory_desc(memory, &md);
  return md;
}

/* The strides of a plain, strided layout (any order of its axes); NULL for a blocked one
   (nChw16c) or any other kind. */
static const dnnl_dims_t* byoc_plain_strides(const_dnnl_memory_desc_t md) {
  int inner_blocks = 0;
  const dnnl_dims_t* strides = NULL;
  dnnl_format_kind_t kind = dnnl_format_kind_undef;
  dnnl_memory_desc_query(md, dnnl_query_format_kind, &kind);
  if (kind != dnnl_blocked) return NULL;
  dnnl_memory_desc_query(md, dnnl_query_inner_nblks_s32, &inner_blocks);
  dnnl_memory_desc_query(md, dnnl_query_strides, &strides);
  return inner_blocks == 0 ? strides : NULL;
}

/* A descriptor of `like`'s dims and layout with another data type: a quantize or dequantize
   keeps its input's layout (NHWC between int8 convolutions), so that it is no transposition.
   (A dequantize from NHWC u8 with a zero point into plain NCHW came out wrong in oneDNN 3.2 on
   ResNet-50's last stage, 2048x7x7; without the transposition it is exact.) A blocked layout
   (nChw16c) has no strided equivalent, and its result is plain. */
static dnnl_status_t byoc_like_md(dnnl_memory_desc_t* md, const_dnnl_memory_desc_t like, dnnl_data_type_t type) {
  int ndims = 0;
  const dnnl_dims_t* dims = NULL;
  const dnnl_dims_t* strides = byoc_plain_strides(like);
  dnnl_memory_desc_query(like, dnnl_query_ndims_s32, &ndims);
  dnnl_memory_desc_query(like, dnnl_query_dims, &dims);
  if (strides != NULL) return dnnl_memory_desc_create_with_strides(md, ndims, *dims, type, *strides);
  /* From a blocked layout (nChw8c) to int8: channels last, the layout of oneDNN's int8 kernels
     (an int8 max pooling of plain NCHW runs its reference code). */
  if ((type == dnnl_u8 || type == dnnl_s8) && ndims >= 3 && ndims <= 5)
    return dnnl_memory_desc_create_with_tag(md, ndims, *dims, type, ndims == 3 ? dnnl_acb : ndims == 4 ? dnnl_acdb : dnnl_acdeb);
  return byoc_plain_md(md, ndims, *dims, type);
}

/* The unit-stride axis of a plain, strided layout, one of its last two (as oneDNN's GEMM reads a
   matrix, or its transpose); -1 for any other layout (blocked: nChw16c). */
__attribute__((unused)) static int byoc_gemm_axis(const_dnnl_memory_desc_t md) {
  int ndims = 0, axis;
  const dnnl_dims_t* strides = byoc_plain_strides(md);
  dnnl_memory_desc_query(md, dnnl_query_ndims_s32, &ndims);
  if (strides == NULL || ndims < 2) return -1;
  for (axis = ndims - 1; axis >= ndims - 2; --axis)
    if ((*strides)[axis] == 1) return axis;
  return -1;
}

/* A product's operand or result for a primitive that takes every size: the axes in `runtime`
   (bit i: axis i) and every stride but the unit one given at execution (DNNL_RUNTIME_DIM_VAL).
   oneDNN then runs its GEMM, whose kernels are made once, and the primitive is the same for
   every size (its cache hits); `like` holds for byoc_gemm_axis. */
__attribute__((unused)) static dnnl_status_t byoc_runtime_md(dnnl_memory_desc_t* md, const_dnnl_memory_desc_t like, int runtime) {
  int ndims = 0, axis, unit = byoc_gemm_axis(like);
  const dnnl_dims_t* dims = NULL;
  dnnl_data_type_t type = dnnl_data_type_undef;
  dnnl_dims_t sizes, strides;
  if (unit < 0) return dnnl_unimplemented;
  dnnl_memory_desc_query(like, dnnl_query_ndims_s32, &ndims);
  dnnl_memory_desc_query(like, dnnl_query_dims, &dims);
  dnnl_memory_desc_query(like, dnnl_query_data_type, &type);
  for (axis = 0; axis < ndims; ++axis) {
    sizes[axis] = runtime >> axis & 1 ? DNNL_RUNTIME_DIM_VAL : (*dims)[axis];
    strides[axis] = axis == unit ? 1 : DNNL_RUNTIME_DIM_VAL;
  }
  return dnnl_memory_desc_create_with_strides(md, ndims, sizes, type, strides);
}

static dnnl_status_t byoc_execute(dnnl_primitive_t primitive, int count, const dnnl_exec_arg_t* args) {
  return dnnl_primitive_execute(primitive, byoc_stream, count, args);
}

/* Memory of the layout `wanted` holding `source`: `source` itself when the layouts match,
   else a private memory that a reorder fills at run time. */
typedef struct { dnnl_primitive_t reorder; dnnl_memory_t memory; } byoc_conversion;

static dnnl_status_t byoc_conversion_init(byoc_conversion* conversion, dnnl_memory_t source, const_dnnl_memory_desc_t wanted) {
  const_dnnl_memory_desc_t have = byoc_md(source);
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t status;
  conversion->reorder = NULL;
  conversion->memory = source;
  if (dnnl_memory_desc_equal(have, wanted)) return dnnl_success;
  status = dnnl_reorder_primitive_desc_create(&pd, have, byoc_engine, wanted, byoc_engine, NULL);
  if (status == dnnl_success) status = dnnl_primitive_create(&conversion->reorder, pd);
  if (pd != NULL) dnnl_primitive_desc_destroy(pd);
  if (status == dnnl_success) status = dnnl_memory_create(&conversion->memory, wanted, byoc_engine, DNNL_MEMORY_ALLOCATE);
  return status;
}

/* How far the implementation oneDNN chose is from its fastest kind: 2 for its reference code
   ("ref:any": plain C loops, 10 to 1000 times slower than its JIT kernels), 1 for its GEMM-based
   convolutions (im2col and a matrix product: ConvNeXt's 7x7 depthwise convolutions on plain
   NCHW took 0.19 ms where the direct JIT kernel in a blocked layout takes a few microseconds),
   0 for a direct JIT kernel. oneDNN 3.2 falls back to the slower kinds for layouts its JIT
   kernels do not take (per-channel broadcasting over nChw8c, grouped convolutions on plain or
   blocked layouts). */
static int byoc_impl_rank(const_dnnl_primitive_desc_t pd) {
  const char* impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || impl == NULL) return 0;
  if (strncmp(impl, "ref", 3) == 0) return 2;
  return strstr(impl, "gemm") != NULL ? 1 : 0;
}

/* Keep the retry descriptor where it ranks faster than the one in hand. */
static void byoc_prefer_faster(dnnl_primitive_desc_t* pd, dnnl_status_t retry_status, dnnl_primitive_desc_t retry) {
  if (retry_status == dnnl_success && retry != NULL && byoc_impl_rank(retry) < byoc_impl_rank(*pd)) {
    dnnl_primitive_desc_destroy(*pd);
    *pd = retry;
  } else if (retry != NULL) {
    dnnl_primitive_desc_destroy(retry);
  }
}

static dnnl_status_t byoc_reorder(dnnl_primitive_t reorder, dnnl_memory_t from, dnnl_memory_t to) {
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  return reorder == NULL ? dnnl_success : byoc_execute(reorder, 2, args);
}

/* Constant weights in the layout `wanted`: `source` itself where it is in that layout, else a
   memory of their own, reordered once. That memory is owned by no arena: a kernel made again for
   other dimensions (a dense layer at a new number of rows) keeps it where the layout is the
   same. Made again with the kernel, BERT-base's twelve weight reorders (56 MB allocated,
   reordered and faulted in) took 10-15 ms at every change of sequence length, against 2-13 ms
   for the whole run. */
typedef struct { dnnl_memory_t memory; dnnl_memory_t owned; } byoc_weights;

static dnnl_status_t byoc_weights_init(byoc_weights* weights, dnnl_memory_t source, const_dnnl_memory_desc_t wanted) {
  byoc_arena* owner = byoc_arena_now;
  byoc_conversion made = {NULL, NULL};
  dnnl_status_t status;
  if (weights->owned != NULL && dnnl_memory_desc_equal(byoc_md(weights->owned), wanted)) {
    weights->memory = weights->owned;
    return dnnl_success;
  }
  byoc_arena_now = NULL;
  if (weights->owned != NULL) dnnl_memory_destroy(weights->owned);
  weights->owned = NULL;
  status = byoc_conversion_init(&made, source, wanted);
  if (status == dnnl_success) status = byoc_reorder(made.reorder, source, made.memory);
  if (status == dnnl_success) status = dnnl_stream_wait(byoc_stream);
  if (made.reorder != NULL) dnnl_primitive_destroy(made.reorder);
  if (made.memory != NULL && made.memory != source) {
    if (status == dnnl_success) weights->owned = made.memory;
    else dnnl_memory_destroy(made.memory);
  }
  weights->memory = status == dnnl_success ? made.memory : source;
  byoc_arena_now = owner;
  return status;
}

/* An intermediate's memory object, of descriptor `md`. Its kernel's readers hold it, so it is
   owned by no arena: a kernel made again for other dimensions (a region with symbolic shapes)
   keeps it where its descriptor is the same, and its readers need not be made again; a new one
   sets `byoc_replaced`, which makes them again. */
static dnnl_status_t byoc_result_memory(dnnl_memory_t* target, const_dnnl_memory_desc_t md) {
  byoc_arena* owner = byoc_arena_now;
  dnnl_status_t status;
  if (*target != NULL && dnnl_memory_desc_equal(byoc_md(*target), md)) return dnnl_success;
  byoc_arena_now = NULL;
  if (*target != NULL) {
    dnnl_memory_destroy(*target);
    byoc_replaced = 1;
  }
  status = dnnl_memory_create(target, md, byoc_engine, DNNL_MEMORY_NONE);
  byoc_arena_now = owner;
  return status;
}

/* A kernel's result: an intermediate takes the primitive's layout (the memory is created here,
   its data bound after allocation); a region output keeps its plain layout, and the kernel
   writes a private memory that is reordered into it. */
static dnnl_status_t byoc_result_init(byoc_conversion* conversion, dnnl_memory_t* target, size_t* target_bytes,
                                      const_dnnl_memory_desc_t produced) {
  dnnl_status_t status;
  if (target_bytes != NULL) {
    conversion->reorder = NULL;
    status = byoc_result_memory(target, produced);
    conversion->memory = *target;
    *target_bytes = dnnl_memory_desc_get_size(produced);
    return status;
  }
  if (dnnl_memory_desc_equal(produced, byoc_md(*target))) {
    conversion->reorder = NULL;
    conversion->memory = *target;
    return dnnl_success;
  }
  dnnl_primitive_desc_t pd = NULL;
  status = dnnl_reorder_primitive_desc_create(&pd, produced, byoc_engine, byoc_md(*target), byoc_engine, NULL);
  if (status == dnnl_success) status = dnnl_primitive_create(&conversion->reorder, pd);
  if (pd != NULL) dnnl_primitive_desc_destroy(pd);
  if (status == dnnl_success) status = dnnl_memory_create(&conversion->memory, produced, byoc_engine, DNNL_MEMORY_ALLOCATE);
  return status;
}

/* Build a primitive from its descriptor, then release the descriptor (and the memory
   descriptors queried from it). */
static dnnl_status_t byoc_primitive(dnnl_primitive_t* primitive, dnnl_primitive_desc_t pd) {
  dnnl_status_t status = dnnl_primitive_create(primitive, pd);
  dnnl_primitive_desc_destroy(pd);
  return status;
}

/* The range ONNX's DynamicQuantizeLinear quantizes over: the least and greatest of n values,
   widened to take 0. fast-math lets the compiler vectorize the search (a NaN is not ordered). */
__attribute__((unused, optimize("O3", "fast-math"))) static void byoc_range(const float* x, long n, float* lo, float* hi) {
  float least = 0.f, greatest = 0.f;
  for (long i = 0; i < n; ++i) {
    least = x[i] < least ? x[i] : least;
    greatest = x[i] > greatest ? x[i] : greatest;
  }
  *lo = least;
  *hi = greatest;
}

/* A strided window of a tensor copied densely: each element of `shape` in order, read at element
   `strides` from `from` (the innermost axis as one run where its stride is 1). For views oneDNN
   refuses as overlapping themselves (see byoc.codegen_c.onednn.emitters.movement). */
__attribute__((unused, optimize("O3"))) static void byoc_strided_copy(char* to, const char* from, int rank, const dnnl_dims_t shape,
                                                                     const dnnl_dims_t strides, long size) {
  long count = 1, inner = shape[rank - 1];
  for (int a = 0; a < rank - 1; ++a) count *= shape[a];
  for (long i = 0; i < count; ++i) {
    long rest = i, at = 0;
    for (int a = rank - 2; a >= 0; --a) { at += (rest % shape[a]) * strides[a]; rest /= shape[a]; }
    if (strides[rank - 1] == 1) {
      __builtin_memcpy(to + i * inner * size, from + at * size, inner * size);
    } else {
      for (long j = 0; j < inner; ++j) __builtin_memcpy(to + (i * inner + j) * size, from + (at + j * strides[rank - 1]) * size, size);
    }
  }
}

/* The border of a padded result (the generated C is compiled without optimisation). */
__attribute__((unused, optimize("O3"))) static void byoc_fill(float* data, long n, float value) {
  for (long i = 0; i < n; ++i) data[i] = value;
}

/* The number of values of a dense row-major layout (plain, its last axis contiguous, no gaps),
   at most `limit`; 0 for any other layout or more values. Attention's scores at a decoder's new
   cache length are this small: the loops below run them without a primitive made for the size. */
__attribute__((unused)) static long byoc_small_rows(const_dnnl_memory_desc_t md, long limit) {
  int ndims = 0, axis;
  long count = 1;
  const dnnl_dims_t* dims = NULL;
  const dnnl_dims_t* strides = byoc_plain_strides(md);
  dnnl_data_type_t type = dnnl_data_type_undef;
  dnnl_memory_desc_query(md, dnnl_query_data_type, &type);
  if (strides == NULL || type != dnnl_f32) return 0;
  dnnl_memory_desc_query(md, dnnl_query_ndims_s32, &ndims);
  dnnl_memory_desc_query(md, dnnl_query_dims, &dims);
  for (axis = ndims - 1; axis >= 0; --axis) {
    if ((*dims)[axis] > 1 && (*strides)[axis] != count) return 0;
    count *= (long)(*dims)[axis];
  }
  return count <= limit ? count : 0;
}

/* The data of a row kernel's `scores`, read, and of its `result`, written. */
__attribute__((unused)) static dnnl_status_t byoc_rows_data(dnnl_memory_t scores, dnnl_memory_t result, const float** src, float** dst) {
  dnnl_status_t status = dnnl_memory_get_data_handle(scores, (void**)src);
  return status == dnnl_success ? dnnl_memory_get_data_handle(result, (void**)dst) : status;
}

/* Softmax over the last axis of `rows` dense rows of `width`, as oneDNN's accurate softmax
   computes it (exp(x - max) / sum); a row whose every score is -inf gives NaN, as there. */
__attribute__((unused, optimize("O3"))) static dnnl_status_t byoc_softmax_rows(dnnl_memory_t scores, dnnl_memory_t result, long rows,
                                                                              long width) {
  const float* src = NULL;
  float* dst = NULL;
  dnnl_status_t status = byoc_rows_data(scores, result, &src, &dst);
  if (status != dnnl_success) return status;
  for (long row = 0; row < rows; ++row) {
    const float* x = src + row * width;
    float* y = dst + row * width;
    float high = -INFINITY, sum = 0.f;
    for (long i = 0; i < width; ++i) high = x[i] > high ? x[i] : high;
    for (long i = 0; i < width; ++i) {
      y[i] = expf(x[i] - high);
      sum += y[i];
    }
    for (long i = 0; i < width; ++i) y[i] /= sum;
  }
  return dnnl_success;
}

/* After a softmax: 0 for each row of plain `scores` whose every score is -inf (masked whole),
   and only such rows (torch.export's safe softmax). */
__attribute__((unused, optimize("O3"))) static dnnl_status_t byoc_zero_masked_rows(dnnl_memory_t scores, dnnl_memory_t result,
                                                                                  long rows, long width) {
  const float* src = NULL;
  float* dst = NULL;
  dnnl_status_t status = byoc_rows_data(scores, result, &src, &dst);
  if (status != dnnl_success) return status;
  for (long row = 0; row < rows; ++row) {
    long i = 0;
    while (i < width && isinf(src[row * width + i]) && src[row * width + i] < 0) ++i;
    if (i == width) memset(dst + row * width, 0, (size_t)width * sizeof(float));
  }
  return dnnl_success;
}

/* After a softmax: NaN (a row masked whole) made 0 (torch.onnx's `Where(IsNaN(p), 0, p)`). */
__attribute__((unused, optimize("O3"))) static dnnl_status_t byoc_nan_to_zero(dnnl_memory_t result) {
  float* data = NULL;
  size_t count = dnnl_memory_desc_get_size(byoc_md(result)) / sizeof(float);
  dnnl_status_t status = dnnl_memory_get_data_handle(result, (void**)&data);
  if (status != dnnl_success) return status;
  for (size_t i = 0; i < count; ++i) data[i] = isnan(data[i]) ? 0.f : data[i];
  return dnnl_success;
}

/* `result op= operand` in place, `result` dense and `operand` a plain layout of the same rank
   whose every axis is the result's or 1 (broadcast): attention's mask over the heads and
   query rows. 0 when `operand` is not such a layout, else 1 once done. op: 0 add, 1 subtract,
   2 multiply, 3 divide. */
__attribute__((unused, optimize("O3"))) static int byoc_broadcast_rows(dnnl_memory_t result, dnnl_memory_t operand, int op, int run) {
  int ndims = 0, operand_ndims = 0, axis;
  const dnnl_dims_t *dims = NULL, *operand_dims = NULL;
  const dnnl_dims_t* strides = byoc_plain_strides(byoc_md(operand));
  dnnl_dims_t step, index;
  dnnl_data_type_t type = dnnl_data_type_undef;
  float* y = NULL;
  const float* b = NULL;
  long inner, outer = 1, done;
  dnnl_memory_desc_query(byoc_md(operand), dnnl_query_data_type, &type);
  dnnl_memory_desc_query(byoc_md(result), dnnl_query_ndims_s32, &ndims);
  dnnl_memory_desc_query(byoc_md(operand), dnnl_query_ndims_s32, &operand_ndims);
  if (strides == NULL || type != dnnl_f32 || ndims != operand_ndims || ndims < 1) return 0;
  dnnl_memory_desc_query(byoc_md(result), dnnl_query_dims, &dims);
  dnnl_memory_desc_query(byoc_md(operand), dnnl_query_dims, &operand_dims);
  for (axis = 0; axis < ndims; ++axis) {
    if ((*operand_dims)[axis] != (*dims)[axis] && (*operand_dims)[axis] != 1) return 0;
    step[axis] = (*operand_dims)[axis] == 1 ? 0 : (*strides)[axis];
    index[axis] = 0;
  }
  if (!run) return 1;
  dnnl_memory_get_data_handle(result, (void**)&y);
  dnnl_memory_get_data_handle(operand, (void**)&b);
  inner = (long)(*dims)[ndims - 1];
  for (axis = 0; axis < ndims - 1; ++axis) outer *= (long)(*dims)[axis];
  for (done = 0; done < outer; ++done) {
    long offset = 0, i, s = (long)step[ndims - 1];
    float* row = y + done * inner;
    for (axis = 0; axis < ndims - 1; ++axis) offset += (long)(index[axis] * step[axis]);
    switch (op) {
      case 0: for (i = 0; i < inner; ++i) row[i] += b[offset + i * s]; break;
      case 1: for (i = 0; i < inner; ++i) row[i] -= b[offset + i * s]; break;
      case 2: for (i = 0; i < inner; ++i) row[i] *= b[offset + i * s]; break;
      default: for (i = 0; i < inner; ++i) row[i] /= b[offset + i * s]; break;
    }
    for (axis = ndims - 2; axis >= 0 && ++index[axis] == (*dims)[axis]; --axis) index[axis] = 0;
  }
  return 1;
}
"""


# Regions with symbolic shapes (see CLibrary.ownership): every memory, primitive and buffer the
# generated code and PROLOGUE make is owned by the arena in `byoc_arena_now`, so that a kernel's
# objects are destroyed when it is made again for other dimensions. The macros come before
# PROLOGUE, whose helpers create through them too.
OWNERSHIP = r"""
#define BYOC_OWNERSHIP 1
typedef struct { int kind; void* object; } byoc_owned;
typedef struct { byoc_owned* items; int count, capacity; } byoc_arena;
static byoc_arena* byoc_arena_now = NULL;
static int byoc_replaced = 0;  /* a kernel made again made a new result object (see byoc_result_memory) */

/* Whether `object` is now owned by the current arena (always, outside one); 0 where the arena
   could not grow, and its maker then destroys it and reports the memory it lacked. */
static int byoc_own(int kind, void* object) {
  byoc_arena* arena = byoc_arena_now;
  if (arena == NULL || object == NULL) return 1;
  if (arena->count == arena->capacity) {
    int capacity = arena->capacity ? 2 * arena->capacity : 16;
    byoc_owned* items = (byoc_owned*)realloc(arena->items, capacity * sizeof(byoc_owned));
    if (items == NULL) return 0;
    arena->items = items;
    arena->capacity = capacity;
  }
  arena->items[arena->count].kind = kind;
  arena->items[arena->count++].object = object;
  return 1;
}

static dnnl_status_t byoc_owned_memory(dnnl_memory_t* memory, const_dnnl_memory_desc_t md, dnnl_engine_t engine, void* handle) {
  dnnl_status_t status = dnnl_memory_create(memory, md, engine, handle);
  if (status == dnnl_success && !byoc_own(0, *memory)) {
    dnnl_memory_destroy(*memory);
    *memory = NULL;
    status = dnnl_out_of_memory;
  }
  return status;
}

static dnnl_status_t byoc_owned_primitive(dnnl_primitive_t* primitive, const_dnnl_primitive_desc_t pd) {
  dnnl_status_t status = dnnl_primitive_create(primitive, pd);
  if (status == dnnl_success && !byoc_own(1, *primitive)) {
    dnnl_primitive_destroy(*primitive);
    *primitive = NULL;
    status = dnnl_out_of_memory;
  }
  return status;
}

static void* byoc_owned_malloc(size_t bytes) {
  void* data = malloc(bytes);
  if (!byoc_own(2, data)) {
    free(data);
    data = NULL;
  }
  return data;
}

static void byoc_release(byoc_arena* arena) {
  while (arena->count > 0) {
    byoc_owned* item = &arena->items[--arena->count];
    if (item->kind == 0) dnnl_memory_destroy((dnnl_memory_t)item->object);
    else if (item->kind == 1) dnnl_primitive_destroy((dnnl_primitive_t)item->object);
    else free(item->object);
  }
}

#define dnnl_memory_create byoc_owned_memory
#define dnnl_primitive_create byoc_owned_primitive
#define malloc byoc_owned_malloc
"""


def dims(shape: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(d) for d in shape) + "}" if shape else "{1}"


def dims_decl(name: str, shape: tuple) -> str:
    """A block-scope `dnnl_dims_t` of `shape` (see `array_storage`)."""
    return f"{array_storage(shape)} dnnl_dims_t {name} = {dims(shape)};"


def rank(shape: tuple[int, ...]) -> int:
    return max(1, len(shape))


def bind_buffer(buffer: CBuffer) -> KernelCode:
    """A `dnnl_memory_t` per tensor: plain for inputs, outputs and constants; for an
    intermediate, the producing kernel creates it and its data is bound after allocation."""
    state = f"static dnnl_memory_t {buffer.name}_mem = NULL;"
    if buffer.kind == "intermediate":
        return KernelCode(state=state, init=f'DNNL_CHECK(dnnl_memory_set_data_handle({buffer.name}_mem, {buffer.name}), "bind {buffer.name}");')
    handle = buffer.name if buffer.kind == "constant" else "DNNL_MEMORY_NONE"
    # A constant oneDNN never reads as a tensor (an int64 index, read at code generation) has no
    # oneDNN type; its memory object is never used, and f32 describes it as well as any.
    dnnl_type = DNNL_TYPES.get(buffer.dtype, "dnnl_f32")
    init = f"""{{
  {dims_decl("shape", buffer.shape)}
  DNNL_CHECK(byoc_plain_memory(&{buffer.name}_mem, {rank(buffer.shape)}, shape, {dnnl_type}, {handle}), "memory of {buffer.name}");
}}"""
    run = "" if buffer.kind == "constant" else f'DNNL_CHECK(dnnl_memory_set_data_handle({buffer.name}_mem, {buffer.name}), "bind {buffer.name}");'
    return KernelCode(state=state, init=init, run=run)
