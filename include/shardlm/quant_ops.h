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

#endif
