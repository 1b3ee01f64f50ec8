/* Host emulation (see cuda_runtime.h): float16 as GCC's _Float16, with CUDA's conversions. */
#pragma once
struct __half { _Float16 value; };
inline float __half2float(__half h) { return (float)h.value; }
inline __half __float2half(float f) { return __half{(_Float16)f}; }
