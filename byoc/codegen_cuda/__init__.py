"""Code generation for NVIDIA GPUs: a region as one CUDA C++ unit (`generate`: cuBLAS and cuDNN
calls, generated kernels for the rest, element-wise chains fused), compiled by nvcc for a named
architecture (`compile`), and run from its shared library (`engine`)."""
