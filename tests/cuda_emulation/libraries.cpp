/* Host emulation (see cuda_runtime.h) of the cuBLAS and cuDNN functions byoc's generated regions
   call, with the parameters NVIDIA documents: a column-major strided batched product, and a direct
   NCHW convolution with groups, strides, dilation and symmetric padding. */
#include <cstdint>
#include <cstring>

static float load(const void* data, int type, long long i) {
  if (type == 0) return ((const float*)data)[i];
  if (type == 2) return (float)((const _Float16*)data)[i];
  uint32_t u = (uint32_t)((const uint16_t*)data)[i] << 16; float f; memcpy(&f, &u, 4); return f;
}
static void store(void* data, int type, long long i, float value) {
  if (type == 0) ((float*)data)[i] = value;
  else if (type == 2) ((_Float16*)data)[i] = (_Float16)value;
  else { uint32_t u; memcpy(&u, &value, 4); u += 0x7fffu + ((u >> 16) & 1u); ((uint16_t*)data)[i] = (uint16_t)(u >> 16); }
}
static int cudnn_type(int type) { return type == 0 ? 0 : type == 2 ? 2 : 14; }  /* cuDNN's data type as cudaDataType */

extern "C" {
int cublasCreate_v2(void** handle) { *handle = (void*)1; return 0; }
int cublasSetStream_v2(void*, void*) { return 0; }
int cublasDestroy_v2(void*) { return 0; }
int cublasGemmStridedBatchedEx(void*, int transa, int transb, int m, int n, int k, const void* alpha, const void* a, int atype,
                               int lda, long long stride_a, const void* b, int btype, int ldb, long long stride_b, const void* beta,
                               void* c, int ctype, int ldc, long long stride_c, int batch, int, int) {
  if (transa != 0 || transb != 0) return 7;
  const float scale = *(const float*)alpha, keep = *(const float*)beta;
  for (int p = 0; p < batch; ++p)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float sum = 0.0f;
        for (int l = 0; l < k; ++l) sum += load(a, atype, p * stride_a + i + (long long)l * lda) * load(b, btype, p * stride_b + l + (long long)j * ldb);
        long long at = p * stride_c + i + (long long)j * ldc;
        store(c, ctype, at, scale * sum + (keep != 0.0f ? keep * load(c, ctype, at) : 0.0f));
      }
  return 0;
}

struct Tensor { int n, c, h, w, type; };
struct Convolution { int pad_h, pad_w, u, v, dilation_h, dilation_w, groups; };
typedef struct { int algo; int status; float time; size_t memory; int determinism; int mathType; int reserved[3]; } Perf;

int cudnnCreate(void** handle) { *handle = (void*)1; return 0; }
int cudnnDestroy(void*) { return 0; }
int cudnnSetStream(void*, void*) { return 0; }
int cudnnCreateTensorDescriptor(void** d) { *d = new Tensor(); return 0; }
int cudnnCreateFilterDescriptor(void** d) { *d = new Tensor(); return 0; }
int cudnnCreateConvolutionDescriptor(void** d) { *d = new Convolution{0, 0, 1, 1, 1, 1, 1}; return 0; }
int cudnnSetTensor4dDescriptor(void* d, int format, int type, int n, int c, int h, int w) {
  if (format != 0) return 3;
  *(Tensor*)d = Tensor{n, c, h, w, cudnn_type(type)}; return 0;
}
int cudnnSetFilter4dDescriptor(void* d, int type, int format, int k, int c, int h, int w) {
  if (format != 0) return 3;
  *(Tensor*)d = Tensor{k, c, h, w, cudnn_type(type)}; return 0;
}
int cudnnSetConvolution2dDescriptor(void* d, int pad_h, int pad_w, int u, int v, int dilation_h, int dilation_w, int mode, int) {
  if (mode != 1) return 3;
  Convolution* conv = (Convolution*)d;
  *conv = Convolution{pad_h, pad_w, u, v, dilation_h, dilation_w, conv->groups}; return 0;
}
int cudnnSetConvolutionGroupCount(void* d, int groups) { ((Convolution*)d)->groups = groups; return 0; }
int cudnnSetConvolutionMathType(void*, int) { return 0; }
int cudnnGetConvolutionForwardAlgorithm_v7(void*, void*, void*, void*, void*, int requested, int* returned, Perf* perf) {
  if (requested < 1) return 3;
  memset(perf, 0, sizeof(Perf));
  *returned = 1; return 0;
}
int cudnnGetConvolutionForwardWorkspaceSize(void*, void*, void*, void*, void*, int, size_t* bytes) { *bytes = 0; return 0; }
int cudnnConvolutionForward(void*, const void* alpha, void* xd, const void* x, void* wd, const void* w, void* cd, int, void*, size_t,
                            const void* beta, void* yd, void* y) {
  const Tensor& X = *(Tensor*)xd; const Tensor& W = *(Tensor*)wd; const Tensor& Y = *(Tensor*)yd;
  const Convolution& C = *(Convolution*)cd;
  const int per_group_out = W.n / C.groups;
  for (int n = 0; n < Y.n; ++n)
    for (int o = 0; o < Y.c; ++o)
      for (int oh = 0; oh < Y.h; ++oh)
        for (int ow = 0; ow < Y.w; ++ow) {
          float sum = 0.0f;
          const int group = o / per_group_out;
          for (int ci = 0; ci < W.c; ++ci)
            for (int kh = 0; kh < W.h; ++kh)
              for (int kw = 0; kw < W.w; ++kw) {
                int ih = oh * C.u - C.pad_h + kh * C.dilation_h, iw = ow * C.v - C.pad_w + kw * C.dilation_w;
                if (ih < 0 || ih >= X.h || iw < 0 || iw >= X.w) continue;
                int c = group * W.c + ci;
                sum += load(x, X.type, (((long long)n * X.c + c) * X.h + ih) * X.w + iw) *
                       load(w, W.type, (((long long)o * W.c + ci) * W.h + kh) * W.w + kw);
              }
          long long at = (((long long)n * Y.c + o) * Y.h + oh) * Y.w + ow;
          store(y, Y.type, at, *(const float*)alpha * sum + (*(const float*)beta != 0.0f ? *(const float*)beta * load(y, Y.type, at) : 0.0f));
        }
  return 0;
}
}
