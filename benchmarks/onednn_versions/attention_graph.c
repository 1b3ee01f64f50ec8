/* Scaled dot-product attention (BERT-base shapes: 12 heads, 128 tokens, 64 per head) through
   the oneDNN Graph API: how many partitions the library makes of it and how long they take. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl_graph.h"
#define CHECK(x) do { dnnl_status_t st_ = (x); if (st_ != dnnl_success) { printf("error %d at %s\n", st_, #x); exit(1);} } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return (x > y) - (x < y); }
enum { Q, K, V, SCALE, S, S2, P, O, NT };
int main(void) {
  dnnl_engine_t e; dnnl_stream_t s;
  CHECK(dnnl_engine_create(&e, dnnl_cpu, 0)); CHECK(dnnl_stream_create(&s, e, dnnl_stream_default_flags));
  dnnl_dims_t shapes[NT] = {{1, 12, 128, 64}, {1, 12, 64, 128}, {1, 12, 128, 64}, {1}, {1, 12, 128, 128}, {1, 12, 128, 128}, {1, 12, 128, 128}, {1, 12, 128, 64}};
  int ranks[NT] = {4, 4, 4, 1, 4, 4, 4, 4};
  dnnl_graph_logical_tensor_t lt[NT];
  for (int i = 0; i < NT; i++)
    CHECK(dnnl_graph_logical_tensor_init_with_dims(&lt[i], i, dnnl_f32, ranks[i], shapes[i], dnnl_graph_layout_type_strided, dnnl_graph_tensor_property_undef));
  dnnl_graph_graph_t g; CHECK(dnnl_graph_graph_create(&g, dnnl_cpu));
  dnnl_graph_op_t op;
  CHECK(dnnl_graph_op_create(&op, 0, dnnl_graph_op_matmul, "qk")); CHECK(dnnl_graph_op_add_input(op, &lt[Q])); CHECK(dnnl_graph_op_add_input(op, &lt[K])); CHECK(dnnl_graph_op_add_output(op, &lt[S])); CHECK(dnnl_graph_add_op(g, op));
  CHECK(dnnl_graph_op_create(&op, 1, dnnl_graph_op_divide, "scale")); CHECK(dnnl_graph_op_add_input(op, &lt[S])); CHECK(dnnl_graph_op_add_input(op, &lt[SCALE])); CHECK(dnnl_graph_op_add_output(op, &lt[S2])); CHECK(dnnl_graph_add_op(g, op));
  int64_t axis = -1;
  CHECK(dnnl_graph_op_create(&op, 2, dnnl_graph_op_softmax, "softmax")); CHECK(dnnl_graph_op_set_attr_s64(op, dnnl_graph_op_attr_axis, &axis, 1));
  CHECK(dnnl_graph_op_add_input(op, &lt[S2])); CHECK(dnnl_graph_op_add_output(op, &lt[P])); CHECK(dnnl_graph_add_op(g, op));
  CHECK(dnnl_graph_op_create(&op, 3, dnnl_graph_op_matmul, "pv")); CHECK(dnnl_graph_op_add_input(op, &lt[P])); CHECK(dnnl_graph_op_add_input(op, &lt[V])); CHECK(dnnl_graph_op_add_output(op, &lt[O])); CHECK(dnnl_graph_add_op(g, op));
  CHECK(dnnl_graph_graph_finalize(g)); CHECK(dnnl_graph_graph_filter(g, dnnl_graph_partition_policy_fusion));
  size_t np; CHECK(dnnl_graph_graph_get_partition_num(g, &np));
  dnnl_graph_partition_t parts[8]; CHECK(dnnl_graph_graph_get_partitions(g, np, parts));
  float* data[NT];
  for (int i = 0; i < NT; i++) { size_t n = 1; for (int d = 0; d < ranks[i]; d++) n *= shapes[i][d]; data[i] = malloc(n * 4); for (size_t j = 0; j < n; j++) data[i][j] = (float)((j * 7919) % 100) / 100.f; }
  data[SCALE][0] = 8.f;
  dnnl_graph_compiled_partition_t cps[8]; size_t nin[8], nout[8]; dnnl_graph_tensor_t tin[8][8], tout[8][8];
  for (size_t p = 0; p < np; p++) {
    size_t nops; CHECK(dnnl_graph_partition_get_op_num(parts[p], &nops));
    uint8_t ok; CHECK(dnnl_graph_partition_is_supported(parts[p], &ok));
    dnnl_graph_logical_tensor_t ins[8], outs[8];
    CHECK(dnnl_graph_partition_get_input_ports_num(parts[p], &nin[p])); CHECK(dnnl_graph_partition_get_input_ports(parts[p], nin[p], ins));
    CHECK(dnnl_graph_partition_get_output_ports_num(parts[p], &nout[p])); CHECK(dnnl_graph_partition_get_output_ports(parts[p], nout[p], outs));
    printf("partition %zu: %zu op(s), supported %d, %zu in, %zu out\n", p, nops, ok, nin[p], nout[p]);
    const dnnl_graph_logical_tensor_t* pin[8]; const dnnl_graph_logical_tensor_t* pout[8];
    for (size_t i = 0; i < nin[p]; i++) pin[i] = &lt[ins[i].id];
    for (size_t i = 0; i < nout[p]; i++) pout[i] = &lt[outs[i].id];
    CHECK(dnnl_graph_compiled_partition_create(&cps[p], parts[p]));
    CHECK(dnnl_graph_partition_compile(parts[p], cps[p], nin[p], pin, nout[p], pout, e));
    for (size_t i = 0; i < nin[p]; i++) CHECK(dnnl_graph_tensor_create(&tin[p][i], &lt[ins[i].id], e, data[ins[i].id]));
    for (size_t i = 0; i < nout[p]; i++) CHECK(dnnl_graph_tensor_create(&tout[p][i], &lt[outs[i].id], e, data[outs[i].id]));
  }
  double t[500];
  for (int r = 0; r < 510; r++) {
    double a = now();
    for (size_t p = 0; p < np; p++) CHECK(dnnl_graph_compiled_partition_execute(cps[p], s, nin[p], (const_dnnl_graph_tensor_t*)tin[p], nout[p], (const_dnnl_graph_tensor_t*)tout[p]));
    CHECK(dnnl_stream_wait(s));
    if (r >= 10) t[r - 10] = now() - a;
  }
  qsort(t, 500, sizeof(double), cmp);
  const dnnl_version_t* v = dnnl_version();
  printf("oneDNN %d.%d.%d: attention (12 heads x 128 x 64) in %zu partition(s): %.3f ms\n", v->major, v->minor, v->patch, np, t[250]);
  return 0;
}
