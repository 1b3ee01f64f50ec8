"""The CUDA C++ every region's source starts with: value conversions, the error buffer, and the
cuBLAS and cuDNN functions a region calls, resolved from the libraries at initialisation.

Why resolved at run time rather than linked: the libraries come from NVIDIA's pip wheels
(`nvidia-cublas`, `nvidia-cudnn-cu13`) on the machine that runs the model, not on the machine
that builds it, which needs nvcc alone. A missing library is then an error naming it, at
initialisation, rather than a loader failure. The functions are declared here, with the values
of the enums they take from NVIDIA's headers (cuBLAS 13, cuDNN 9), rather than through the
headers, which the building machine need not have. cuDNN's convolution is its v7-style API
(deprecated in cuDNN 9, still shipped): one descriptor per tensor, heuristics per shape.
"""

from __future__ import annotations

# cudaDataType (library_types.h) and cuDNN's data types, by byoc dtype.
CUDA_DATA_TYPES = {"float32": 0, "float16": 2, "bfloat16": 14}
CUDNN_DATA_TYPES = {"float32": 0, "float16": 2, "bfloat16": 9}
# The C++ type of each dtype on the device.
DEVICE_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int64": "long long", "int32": "int",
                "bool": "bool"}

PROLOGUE = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static char byoc_error_text[2048];
extern "C" const char* byoc_error() { return byoc_error_text; }

#define BYOC_FAIL(...) do { snprintf(byoc_error_text, sizeof byoc_error_text, __VA_ARGS__); return 1; } while (0)
#define CUDA_CHECK(call, what) do { cudaError_t e_ = (call); \
  if (e_ != cudaSuccess) BYOC_FAIL("%s: %s", what, cudaGetErrorString(e_)); } while (0)
#define LIB_CHECK(call, library, what) do { int s_ = (call); \
  if (s_ != 0) BYOC_FAIL("%s: %s status %d", what, library, s_); } while (0)

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(long long x) { return (float)x; }
__device__ __forceinline__ float to_f(int x) { return (float)x; }
__device__ __forceinline__ float to_f(bool x) { return x ? 1.0f : 0.0f; }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

/* cuBLAS (cublas_api.h): handles, streams, and one strided batched product of any data type. */
typedef int (*cublasCreate_f)(void**);
typedef int (*cublasSetStream_f)(void*, cudaStream_t);
typedef int (*cublasDestroy_f)(void*);
typedef int (*cublasGemmStridedBatchedEx_f)(void*, int, int, int, int, int, const void*, const void*, int, int, long long,
                                            const void*, int, int, long long, const void*, void*, int, int, long long, int,
                                            int, int);
enum { CUBLAS_OP_N = 0, CUBLAS_COMPUTE_32F = 68, CUBLAS_GEMM_DEFAULT = -1 };

/* cuDNN (cudnn_graph.h, cudnn_cnn.h). */
typedef struct {
  int algo; int status; float time; size_t memory; int determinism; int mathType; int reserved[3];
} cudnnConvolutionFwdAlgoPerf;
typedef int (*cudnnCreate_f)(void**);
typedef int (*cudnnDestroy_f)(void*);
typedef int (*cudnnSetStream_f)(void*, cudaStream_t);
typedef int (*cudnnCreateDescriptor_f)(void**);
typedef int (*cudnnSetTensor4dDescriptor_f)(void*, int, int, int, int, int, int);
typedef int (*cudnnSetFilter4dDescriptor_f)(void*, int, int, int, int, int, int);
typedef int (*cudnnSetConvolution2dDescriptor_f)(void*, int, int, int, int, int, int, int, int);
typedef int (*cudnnSetConvolutionInt_f)(void*, int);
typedef int (*cudnnGetConvolutionForwardAlgorithm_v7_f)(void*, void*, void*, void*, void*, int, int*, cudnnConvolutionFwdAlgoPerf*);
typedef int (*cudnnGetConvolutionForwardWorkspaceSize_f)(void*, void*, void*, void*, void*, int, size_t*);
typedef int (*cudnnConvolutionForward_f)(void*, const void*, void*, const void*, void*, const void*, void*, int, void*, size_t,
                                         const void*, void*, void*);
enum { CUDNN_TENSOR_NCHW = 0, CUDNN_CROSS_CORRELATION = 1, CUDNN_DATA_FLOAT = 0, CUDNN_TENSOR_OP_MATH = 1, CUDNN_FMA_MATH = 3 };

static struct {
  void* cublas; void* cudnn;
  cublasCreate_f cublasCreate; cublasSetStream_f cublasSetStream; cublasDestroy_f cublasDestroy;
  cublasGemmStridedBatchedEx_f gemm;
  cudnnCreate_f cudnnCreate; cudnnDestroy_f cudnnDestroy; cudnnSetStream_f cudnnSetStream;
  cudnnCreateDescriptor_f createTensor, createFilter, createConvolution;
  cudnnSetTensor4dDescriptor_f setTensor4d; cudnnSetFilter4dDescriptor_f setFilter4d;
  cudnnSetConvolution2dDescriptor_f setConvolution2d;
  cudnnSetConvolutionInt_f setGroupCount, setMathType;
  cudnnGetConvolutionForwardAlgorithm_v7_f getAlgorithm; cudnnGetConvolutionForwardWorkspaceSize_f getWorkspaceSize;
  cudnnConvolutionForward_f convolutionForward;
} byoc_lib;

/* `library` (its name for messages) opened from `path`, and each of `names` resolved into `slots`. */
static int byoc_open(const char* path, const char* library, void** handle, const char* const* names, void** const* slots, int count) {
  *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (*handle == NULL) BYOC_FAIL("%s cannot be loaded (%s): %s", library, path, dlerror());
  for (int k = 0; k < count; ++k) {
    *slots[k] = dlsym(*handle, names[k]);
    if (*slots[k] == NULL) BYOC_FAIL("%s (%s) has no %s", library, path, names[k]);
  }
  return 0;
}

static int byoc_open_cublas(const char* path) {
  const char* const names[] = {"cublasCreate_v2", "cublasSetStream_v2", "cublasDestroy_v2", "cublasGemmStridedBatchedEx"};
  void** const slots[] = {(void**)&byoc_lib.cublasCreate, (void**)&byoc_lib.cublasSetStream, (void**)&byoc_lib.cublasDestroy,
                          (void**)&byoc_lib.gemm};
  return byoc_open(path, "cuBLAS", &byoc_lib.cublas, names, slots, 4);
}

static int byoc_open_cudnn(const char* path) {
  const char* const names[] = {
    "cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnCreateTensorDescriptor", "cudnnCreateFilterDescriptor",
    "cudnnCreateConvolutionDescriptor", "cudnnSetTensor4dDescriptor", "cudnnSetFilter4dDescriptor",
    "cudnnSetConvolution2dDescriptor", "cudnnSetConvolutionGroupCount", "cudnnSetConvolutionMathType",
    "cudnnGetConvolutionForwardAlgorithm_v7", "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"};
  void** const slots[] = {
    (void**)&byoc_lib.cudnnCreate, (void**)&byoc_lib.cudnnDestroy, (void**)&byoc_lib.cudnnSetStream, (void**)&byoc_lib.createTensor,
    (void**)&byoc_lib.createFilter, (void**)&byoc_lib.createConvolution, (void**)&byoc_lib.setTensor4d,
    (void**)&byoc_lib.setFilter4d, (void**)&byoc_lib.setConvolution2d, (void**)&byoc_lib.setGroupCount,
    (void**)&byoc_lib.setMathType, (void**)&byoc_lib.getAlgorithm, (void**)&byoc_lib.getWorkspaceSize,
    (void**)&byoc_lib.convolutionForward};
  return byoc_open(path, "cuDNN", &byoc_lib.cudnn, names, slots, 14);
}

/* A row-wise reduction of a block's values: the block's sum, in every thread. */
__device__ float byoc_block_sum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffff, value, offset);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += shared[w];
  return total;
}

__device__ float byoc_block_max(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, offset));
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float best = -INFINITY;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) best = fmaxf(best, shared[w]);
  return best;
}
"""
