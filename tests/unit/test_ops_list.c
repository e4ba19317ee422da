// test_ops_list.c: the tables generated from ops_list.h. Every table a run can get (cpu, the bf16
// emulation, the native bf16 table, the profiler around any) has every op of the list; the bf16
// tables and the profiler wrap each op rather than handing the inner one through; the profiler counts
// what the list's flops column says.
#include "test.h"

#include "shardlm/ops.h"
#include "shardlm/ops_profile.h"

#include <string.h>

// Each op of the list as (name, entry of table t).
typedef void (*any_fn)(void);
#define OP_ENTRY(ret, name, params, args, storage, flops, emulation) {#name, offsetof(sl_ops, name)},
static const struct {
    const char *name;
    size_t offset;
} ops_listed[] = {SL_OPS(OP_ENTRY)};
#undef OP_ENTRY
#define N_OPS ((int)(sizeof ops_listed / sizeof ops_listed[0]))

static any_fn entry(const sl_ops *t, int i) {
    any_fn f;
    memcpy(&f, (const char *)t + ops_listed[i].offset, sizeof f);
    return f;
}

TEST(every_table_has_every_op) {
    const sl_ops *tables[] = {&sl_ops_cpu, &sl_ops_cpu_bf16, &sl_ops_cpu_bf16_native};
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < N_OPS; i++) CHECK_MSG(entry(tables[t], i), "%s: no %s", tables[t]->name, ops_listed[i].name);
        const sl_ops *p = sl_ops_profile_wrap(tables[t]);
        for (int i = 0; i < N_OPS; i++) {
            CHECK_MSG(entry(p, i), "profile(%s): no %s", tables[t]->name, ops_listed[i].name);
            CHECK_MSG(entry(p, i) != entry(tables[t], i), "profile(%s): %s not wrapped", tables[t]->name,
                      ops_listed[i].name);
        }
        CHECK(p->act_bf16 == tables[t]->act_bf16 && p->alloc == tables[t]->alloc);
    }
}

TEST(op_names_are_unique) {
    for (int i = 0; i < N_OPS; i++)
        for (int j = i + 1; j < N_OPS; j++) CHECK(strcmp(ops_listed[i].name, ops_listed[j].name) != 0);
    CHECK(N_OPS >= 24);
}

// The emulation runs its own code for every op (staging or a composition), never the fp32 op on bf16.
TEST(bf16_emulation_wraps_every_op) {
    for (int i = 0; i < N_OPS; i++)
        CHECK_MSG(entry(&sl_ops_cpu_bf16, i) != entry(&sl_ops_cpu, i), "cpu-bf16 hands %s through",
                  ops_listed[i].name);
    CHECK(sl_ops_cpu_bf16.act_bf16 == 1 && sl_ops_cpu.act_bf16 == 0);
}

// The native bf16 table likewise: its own function for every op (oneDNN GEMMs, staged or composed
// others), none of the emulation's or the fp32 table's.
TEST(native_bf16_table_wraps_every_op) {
    for (int i = 0; i < N_OPS; i++) {
        any_fn f = entry(&sl_ops_cpu_bf16_native, i);
        CHECK_MSG(f != entry(&sl_ops_cpu, i) && f != entry(&sl_ops_cpu_bf16, i), "cpu-bf16-onednn hands %s through",
                  ops_listed[i].name);
    }
    CHECK(sl_ops_cpu_bf16_native.act_bf16 == 1 && sl_ops_cpu_bf16_native.synchronize != sl_ops_cpu_bf16.synchronize);
}

static const sl_op_stat *stat_of(const char *name) {
    int n;
    const sl_op_stat *s = sl_ops_profile_ops(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

// GEMM FLOPs: 2*N*IC*OC forward, and a backward that for each of dinp and dweight it computes (a
// frozen weight under LoRA: dinp alone); each call also totalled under its shape.
TEST(profiler_counts_the_lists_flops) {
    enum { N = 3, IC = 4, OC = 5 };
    float x[N * IC] = {0}, w[OC * IC] = {0}, y[N * OC] = {0}, dx[N * IC], dw[OC * IC] = {0};
    const sl_ops *p = sl_ops_profile_wrap(&sl_ops_cpu);
    p->matmul_forward(ACT(y), ACT(x), ACT(w), NULL, N, IC, OC);
    p->matmul_backward(ACT(dx), dw, NULL, ACT(y), ACT(x), ACT(w), N, IC, OC);
    p->matmul_backward(NULL, dw, NULL, ACT(y), ACT(x), ACT(w), N, IC, OC);
    p->matmul_backward(ACT(dx), NULL, NULL, ACT(y), ACT(x), ACT(w), N, IC, OC);
    const sl_op_stat *f = stat_of("matmul_forward"), *b = stat_of("matmul_backward");
    CHECK(f && f->calls == 1 && f->flops == 2.0 * N * IC * OC);
    CHECK(b && b->calls == 3 && b->flops == 2.0 * N * IC * OC * 4);
    int n_shapes;
    const sl_op_stat *shapes = sl_ops_profile_matmul_shapes(&n_shapes);
    CHECK(n_shapes == 4);  // forward, backward with both, without dinp, without dweight
    CHECK(n_shapes == 4 && strstr(shapes[3].name, "(no dweight)") && shapes[3].flops == 2.0 * N * IC * OC);
    float out[2 * 2], lse[2], qkv[2 * 3 * 2] = {0};  // B=1, T=2, NH=NKV=1, HD=2
    p->attention_forward(ACT(out), lse, ACT(qkv), 1, 2, 1, 1, 2, 0);
    const sl_op_stat *a = stat_of("attention_forward");
    CHECK(a && a->flops == 4.0 * 2 * sl_causal_pairs(1, 2, 1, 0) && sl_causal_pairs(1, 2, 1, 0) == 3.0);
    CHECK(stat_of("gelu_forward") == NULL);  // not called: no slot
}

TEST_MAIN()
