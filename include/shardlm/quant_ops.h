// quant_ops.h: the CPU fp32 ops table with its linear ops running on quantised weights where the
// model's weight pointer is registered (quant_linear.h), and as sl_ops_cpu everywhere else. This is
// how a model computes with NF4 / int8 base weights without a change to model.c: the model hands
// matmul_forward the address of its weight in the parameter buffer as always; the table looks the
// address up and, when it names a quantised linear, multiplies with tiles dequantised from it.
//
//   matmul_forward / matmul_gelu_forward: out = inp @ dequant(W)^T (+ bias), GELU after for the fused op;
//   matmul_backward / matmul_gelu_backward / matmul_backward_gelu: dinp = dout @ dequant(W) (times
//     gelu'(pre) for the last), dbias += colsum(dout); the
//     quantised base is frozen, so dweight is left untouched (QLoRA trains adapters only).
//
// The registry is one per process (the ops table has no context argument): install it before the
// model's first forward, clear it before its entries' weights are freed.
//
// bf16 (quant_ops_bf16.c): sl_quant_ops_for(base) is the table for a model on `base`: sl_ops_cpu_quant
// for sl_ops_cpu; for the bf16-storage tables (cpu-bf16-onednn, and the emulation cpu-bf16 where the
// CPU lacks bf16 instructions) a copy of that table whose linears on registered weights compute as
// bitsandbytes' bnb_4bit_compute_dtype=torch.bfloat16 does (quant_linear.h's bf16 functions: oneDNN's
// bf16 matmul, or the emulation's fp32 GEMM on the same bf16 values); NULL for any other table. The
// model passes its bf16 weight shadow's addresses to those tables, so their entries are keyed by them.
#ifndef SHARDLM_QUANT_OPS_H
#define SHARDLM_QUANT_OPS_H

#include "shardlm/ops.h"
#include "shardlm/quant_linear.h"

typedef struct {
    const void *weight;   // the address the model passes as `weight` (its parameter buffer's tensor)
    sl_qlinear lin;
} sl_quant_ops_entry;

extern const sl_ops sl_ops_cpu_quant;

// Takes a copy of entries[0..n) and allocates one tile buffer they share (the model calls its linears one
// at a time), so the ops never allocate (-1 when out of memory). n = 0 clears the registry.
int sl_quant_ops_install(const sl_quant_ops_entry *entries, int n);

// The registered linear whose weight address is `weight` (NULL: not quantised); a registered weight used
// with another shape than its own aborts (a model / registry mismatch is a bug, not bad input).
const sl_qlinear *sl_quant_ops_lookup(const sl_act *weight, int IC, int OC);

const sl_ops *sl_quant_ops_for(const sl_ops *base);

#endif
