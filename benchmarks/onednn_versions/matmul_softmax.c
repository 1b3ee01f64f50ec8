/* The MLP matrix product of BERT-base (with bias and a GELU post-op) and its softmax, as oneDNN
   primitives: the same C built against each oneDNN release (see run.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "oneapi/dnnl/dnnl.h"
#define CHECK(x) do { dnnl_status_t st_ = (x); if (st_ != dnnl_success) { printf("error %d at %s\n", st_, #x); exit(1);} } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return (x > y) - (x < y); }
static double run(dnnl_primitive_t p, dnnl_stream_t s, int n, dnnl_exec_arg_t* args, int reps) {
  double t[1000];
  for (int i = 0; i < 5; i++) { CHECK(dnnl_primitive_execute(p, s, n, args)); CHECK(dnnl_stream_wait(s)); }
  for (int i = 0; i < reps; i++) { double a = now(); CHECK(dnnl_primitive_execute(p, s, n, args)); CHECK(dnnl_stream_wait(s)); t[i] = now() - a; }
  qsort(t, reps, sizeof(double), cmp); return t[reps / 2];
}
int main(void) {
  const dnnl_version_t* v = dnnl_version();
  dnnl_engine_t e; dnnl_stream_t s;
  CHECK(dnnl_engine_create(&e, dnnl_cpu, 0)); CHECK(dnnl_stream_create(&s, e, dnnl_stream_default_flags));
  /* the MLP's first layer: 128x768 @ 768x3072 + bias, GELU post-op */
  dnnl_dims_t sd = {128, 768}, wd = {768, 3072}, bd = {1, 3072}, dd = {128, 3072};
  dnnl_memory_desc_t smd, wmd, wany, bmd, dmd;
  CHECK(dnnl_memory_desc_create_with_tag(&smd, 2, sd, dnnl_f32, dnnl_ab));
  CHECK(dnnl_memory_desc_create_with_tag(&wmd, 2, wd, dnnl_f32, dnnl_ab));
  CHECK(dnnl_memory_desc_create_with_tag(&wany, 2, wd, dnnl_f32, dnnl_format_tag_any));
  CHECK(dnnl_memory_desc_create_with_tag(&bmd, 2, bd, dnnl_f32, dnnl_ab));
  CHECK(dnnl_memory_desc_create_with_tag(&dmd, 2, dd, dnnl_f32, dnnl_ab));
  dnnl_primitive_attr_t attr; dnnl_post_ops_t ops;
  CHECK(dnnl_primitive_attr_create(&attr)); CHECK(dnnl_post_ops_create(&ops));
  CHECK(dnnl_post_ops_append_eltwise(ops, dnnl_eltwise_gelu_erf, 0.f, 0.f)); CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
  dnnl_primitive_desc_t pd; CHECK(dnnl_matmul_primitive_desc_create(&pd, e, smd, wany, bmd, dmd, attr));
  const char* impl; CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
  dnnl_primitive_t mm; CHECK(dnnl_primitive_create(&mm, pd));
  const_dnnl_memory_desc_t wq = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  dnnl_memory_t src, w, wr, b, dst;
  CHECK(dnnl_memory_create(&src, smd, e, DNNL_MEMORY_ALLOCATE)); CHECK(dnnl_memory_create(&w, wmd, e, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&wr, wq, e, DNNL_MEMORY_ALLOCATE)); CHECK(dnnl_memory_create(&b, bmd, e, DNNL_MEMORY_ALLOCATE));
  CHECK(dnnl_memory_create(&dst, dmd, e, DNNL_MEMORY_ALLOCATE));
  dnnl_primitive_desc_t rpd; dnnl_primitive_t r;
  CHECK(dnnl_reorder_primitive_desc_create(&rpd, wmd, e, wq, e, NULL)); CHECK(dnnl_primitive_create(&r, rpd));
  dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, w}, {DNNL_ARG_TO, wr}}; CHECK(dnnl_primitive_execute(r, s, 2, ra)); CHECK(dnnl_stream_wait(s));
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wr}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, dst}};
  double mm_ms = run(mm, s, 4, args, 200);
  /* attention probabilities: softmax over 12x128x128 */
  dnnl_dims_t xd = {1, 12, 128, 128}; dnnl_memory_desc_t xmd;
  CHECK(dnnl_memory_desc_create_with_tag(&xmd, 4, xd, dnnl_f32, dnnl_abcd));
  dnnl_primitive_desc_t spd; CHECK(dnnl_softmax_forward_primitive_desc_create(&spd, e, dnnl_forward_inference, dnnl_softmax_accurate, xmd, xmd, 3, NULL));
  dnnl_primitive_t sm; CHECK(dnnl_primitive_create(&sm, spd));
  dnnl_memory_t x, y; CHECK(dnnl_memory_create(&x, xmd, e, DNNL_MEMORY_ALLOCATE)); CHECK(dnnl_memory_create(&y, xmd, e, DNNL_MEMORY_ALLOCATE));
  dnnl_exec_arg_t sa[2] = {{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, y}};
  double sm_ms = run(sm, s, 2, sa, 200);
  printf("oneDNN %d.%d.%d cpu_runtime=%u: matmul+bias+gelu 128x768x3072 %.3f ms (%s, %.0f GFLOP/s), softmax 12x128x128 %.3f ms\n",
         v->major, v->minor, v->patch, v->cpu_runtime, mm_ms, impl, 2.0 * 128 * 768 * 3072 / mm_ms / 1e6, sm_ms);
  return 0;
}
