/* The host emulation of the CUDA runtime that byoc's tests compile generated CUDA regions against
   (tests/test_cuda_emulated.py): device memory is host memory, a stream runs at once, and a kernel
   launch runs its blocks one after another, each thread in turn (`byoc_launch`) or, for kernels that
   synchronise their block, every thread of a block at once on its own host thread with a barrier
   (`byoc_launch_block`). It checks the generated code's indexing, fusion, reductions and library
   calls, not CUDA itself. */
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static /* blocks run one at a time */

struct dim3 { unsigned x, y, z; };
inline thread_local dim3 threadIdx{0, 0, 0};
inline thread_local dim3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
inline const char* cudaGetErrorString(cudaError_t error) { return error == 2 ? "out of memory (emulated)" : "error (emulated)"; }
typedef void* cudaStream_t;
typedef void* cudaEvent_t;
enum { cudaStreamNonBlocking = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
struct cudaDeviceProp { int major, minor; char name[256]; };

inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  prop->major = 9; prop->minor = 0; strcpy(prop->name, "host emulation"); return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { *stream = nullptr; return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t* event) { *event = nullptr; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 0.0f; return cudaSuccess; }
/* The device's memory: BYOC_EMULATED_MEMORY bytes where it is set (an allocation past it fails, as
   on a full device), else the host's. */
inline size_t byoc_allocated = 0;
inline cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  const char* limit = getenv("BYOC_EMULATED_MEMORY");
  if (limit != nullptr && byoc_allocated + bytes > strtoull(limit, nullptr, 10)) return cudaErrorMemoryAllocation;
  *pointer = malloc(bytes ? bytes : 1);
  if (*pointer == nullptr) return cudaErrorMemoryAllocation;
  byoc_allocated += bytes;
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* pointer) { free(pointer); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) { memcpy(to, from, bytes); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  memcpy(to, from, bytes); return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

inline std::barrier<>* byoc_block_barrier = nullptr;
inline float byoc_exchange[1024];
inline void __syncthreads() { byoc_block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float value, int offset) {
  __syncthreads();
  byoc_exchange[threadIdx.x] = value;
  __syncthreads();
  float other = byoc_exchange[threadIdx.x ^ offset];
  __syncthreads();
  return other;
}

template <typename Kernel, typename... Args>
void byoc_launch(Kernel kernel, int blocks, int threads, Args... args) {
  blockDim = {(unsigned)threads, 1, 1};
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) {
      blockIdx = {(unsigned)b, 0, 0};
      threadIdx = {(unsigned)t, 0, 0};
      kernel(args...);
    }
}

template <typename Kernel, typename... Args>
void byoc_launch_block(Kernel kernel, int blocks, int threads, Args... args) {
  blockDim = {(unsigned)threads, 1, 1};
  for (int b = 0; b < blocks; ++b) {
    std::barrier<> barrier(threads);
    byoc_block_barrier = &barrier;
    std::vector<std::thread> running;
    for (int t = 0; t < threads; ++t)
      running.emplace_back([=] { blockIdx = {(unsigned)b, 0, 0}; threadIdx = {(unsigned)t, 0, 0}; kernel(args...); });
    for (auto& thread : running) thread.join();
  }
}
