// attention_cudnn.cu: causal attention on bf16 storage through cuDNN's fused flash attention
// (SHARDLM_ATTENTION=cudnn). cuDNN 9 has no single causal attention call before 9.21: its backend API
// takes an operation graph of matrix products, pointwise ops and reductions, and its runtime matches
// the graph of softmax(scale Q K^T, causal) V (and its gradient) as a whole to a fused flash-attention
// kernel. The graphs below are the ones NVIDIA's cudnn-frontend (the C++ header library; not used here)
// lowers its SDPA nodes to for this case on cuDNN 9.19: the same ops, tensor types and operand order,
// which cuDNN's support checks are picky about (the score product's second factor is K viewed
// transposed; P and the transposes in the backward are bf16; everything else fp32, the mask's
// indices int32 and its test boolean). docs/gpu.md, "cuDNN's fused attention", has the graphs.
//
// libcudnn is dlopen'ed (as cuBLASLt): built against cudnn_graph.h when the build finds it (the CUDA
// toolkit's include folder or CUDNN_HOME), else the path reports that it was built without it. One
// execution plan per shape, built at the first call (cuDNN compiles the kernel then: seconds) and kept.
// Q, K, V, dQ, dK, dV are strided views into qkv / dqkv, O / dO into the output (attention_cudnn_layout.h):
// no copies. The saved statistics are cuDNN's Stats, the natural-log sum of exponentials of each row's
// scaled scores: the lse every attention path here saves.
//
// Determinism: cuDNN's backward makes dQ either by adding each key tile's share into an fp32 buffer
// in whatever order the tiles finish (not bit-reproducible) or, in its "dP workspace" form, from a
// bf16 copy of dS in global memory (b * h * T * T * 2 bytes of workspace: 1.6 GB for GPT-2 124M at
// B = 64, T = 1024; a batch whose workspace would pass SHARDLM_CUDNN_WORKSPACE_MB, 512 MiB unless set,
// runs in slices of sequences, a call each: slice_of). The form is chosen by the graph's shape: dQ
// written by the product itself (the workspace form) or through an fp32 tensor and an identity op.
// SHARDLM_ATTENTION_DQ=atomic takes the fp32 form; split and ordered (the default) the workspace
// form, which cudnn-frontend documents as its deterministic algorithm.
#include "shardlm/settings.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/attention_cudnn.cuh"
#include "ops/cuda/attention_cudnn_layout.h"
extern "C" {
#include "ops/cuda/cuda_ops.h"  // cuda_attention_cudnn_calls, cuda_attention_cudnn_check_graph
#include "shardlm/attention_choice.h"
#include "shardlm/cuda_dlopen.h"
#include "shardlm/log.h"
}

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#if __has_include(<cudnn_graph.h>)
#define SL_HAVE_CUDNN 1
#include <cudnn_graph.h>
#endif

namespace {

unsigned long calls;  // forward and backward calls queued through cuDNN (cuda_attention_cudnn_calls)

// SHARDLM_ATTENTION=cudnn asked for by name (else auto, in training).
bool named() { return sl_settings_get()->attention == SL_ATTENTION_CUDNN; }

// cuDNN cannot serve a call, for the reason given. Named, that is a failure: recorded, -1. Under auto
// the reason is logged once as a warning, auto resolves to mma for the rest of the process, and 0
// sends this call to the mma.sync kernels.
int cannot(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cannot(const char *fmt, ...) {
    char why[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (named()) {
        sl_cuda_record_failure("SHARDLM_ATTENTION=cudnn: %s", why);
        return -1;
    }
    static bool said;
    if (!said)
        sl_log(SL_LOG_WARN, "attention: cuDNN's fused attention is not used (%s); the mma.sync kernels instead", why);
    said = true;
    sl_attention_cudnn_unusable();
    return 0;
}
unsigned long plans_built;              // cuda_attention_cudnn_plans: plans built, ...
double plan_seconds, plan_longest;      // ... their wall seconds in all and the longest's

// The calls auto hands cuDNN: the shapes whose numbers a GPU run has checked against the CPU (H200,
// libcudnn 9.14, 2026-11-28: GPT-2's, every head its own K / V, head dim 64, T a multiple of 128).
// GQA and head dims 80 to 128 are in test_ops_cuda's attention_cudnn group (T a multiple of 128, which
// 9.14 takes) but have not run there yet, nor has any other T (9.16+, whose graph here leaves out the
// padding mask cudnn-frontend adds before 9.16): until they do, auto keeps them on the mma.sync
// kernels (=cudnn takes them).
bool auto_checked(int T, int NH, int NKV, int HD) { return NKV == NH && HD == 64 && T % 128 == 0; }

// Whether a call is this path's: SHARDLM_ATTENTION=cudnn (or auto in training, for the heads above),
// a head dim cuDNN's Hopper kernels take in both directions (a multiple of 8 from 16 to 128 here: the
// op tests' range), T > 1 (the backward refuses a 1 x 1 score matrix), and 16-byte aligned buffers
// (every tensor, lse included, is declared 16-byte aligned; the views' offsets, multiples of HD
// elements, keep that).
bool takes(int T, int NH, int NKV, int HD, const void *a, const void *b, const void *c, const float *lse) {
    return sl_attention_kind() == SL_ATTENTION_CUDNN && (named() || auto_checked(T, NH, NKV, HD)) && HD % 8 == 0 &&
           HD >= 16 && HD <= 128 && T > 1 && sl_aligned16(a) && sl_aligned16(b) && (!c || sl_aligned16(c)) &&
           sl_aligned16(lse);
}

#ifdef SL_HAVE_CUDNN

// ---- libcudnn, loaded at run time ---------------------------------------------------------------------

#define SL_DNN_FUNCS(X)                                                                                   \
    X(cudnnGetVersion) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream) X(cudnnGetErrorString)            \
    X(cudnnGetLastErrorString)                                                                            \
    X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor) X(cudnnBackendSetAttribute)          \
    X(cudnnBackendGetAttribute) X(cudnnBackendFinalize) X(cudnnBackendExecute)

struct {
#define SL_DNN_FIELD(f) decltype(&::f) f;
    SL_DNN_FUNCS(SL_DNN_FIELD)
#undef SL_DNN_FIELD
} dnn;

int dnn_state;            // 0 not tried, 1 loaded, -1 failed (dnn_why says why)
char dnn_why[1024];
size_t dnn_version;       // cudnnGetVersion of the loaded library (9.19.0: 91900)
// The least libcudnn whose runtime takes these graphs (CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC is 9.11's),
// and the least that takes the backward's at any T: before 9.16 cudnn-frontend adds a padding mask to
// the backward graph when T % 128 != 0, a workaround for those versions this graph leaves out, so
// there such calls go to the mma.sync kernels.
constexpr size_t MIN_VERSION = 91100, ANY_T_VERSION = 91600;
cudnnHandle_t dnn_handle;  // made at the first execution (it needs the GPU)

// Loads libcudnn once: 0, or -1 with dnn_why set.
int dnn_load() {
    if (dnn_state) return dnn_state > 0 ? 0 : -1;
    dnn_state = -1;
    char why[768];
    void *lib = sl_cudnn_dlopen(why, sizeof why);
    if (!lib) {
        snprintf(dnn_why, sizeof dnn_why, "libcudnn.so.9 could not be loaded (%s); install cuDNN 9 (the CUDA "
                 "toolkit's, or the nvidia-cudnn-cu13 wheel's: SHARDLM_CUDNN_LIBRARY=.../nvidia/cudnn/lib/"
                 "libcudnn.so.9)", why);
        return -1;
    }
#define SL_DNN_LOAD(f)                                                                           \
    dnn.f = (decltype(dnn.f))dlsym(lib, #f);                                                     \
    if (!dnn.f) {                                                                                \
        snprintf(dnn_why, sizeof dnn_why, "libcudnn.so.9 does not export %s (not cuDNN 9?)", #f); \
        return -1;                                                                               \
    }
    SL_DNN_FUNCS(SL_DNN_LOAD)
#undef SL_DNN_LOAD
    const size_t v = dnn.cudnnGetVersion();
    if (v / 10000 != CUDNN_MAJOR || v < MIN_VERSION) {
        snprintf(dnn_why, sizeof dnn_why, "the loaded libcudnn is version %zu: this path needs cuDNN %d at least "
                 "9.11 (the build's header is %d.%d)", v, CUDNN_MAJOR, CUDNN_MAJOR, CUDNN_MINOR);
        return -1;
    }
    dnn_version = v;
    sl_attention_note_cudnn(v);
    dnn_state = 1;
    return 0;
}

// ---- a graph under construction: every descriptor it made, the first failure ---------------------

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_DO, UID_DQ, UID_DK, UID_DV, UID_ONE,
       UID_DELTA, UID_DQ_SUM, UID_VIRTUAL = 100 };
constexpr int MAX_DESC = 128, MAX_OPS = 32;

struct graph {
    cudnnBackendDescriptor_t made[MAX_DESC];  // destroyed together
    int n_made;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int n_ops;
    int64_t next_uid;  // of the virtual tensors
    char err[768];     // the first failure ("" while none)
};

void fail(graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fail(graph *g, const char *fmt, ...) {
    if (g->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof g->err, fmt, ap);
    va_end(ap);
}

// A cuDNN call of step `what`: false (and the graph's first failure, with cuDNN's own message) unless it
// succeeded. Every step after a failure is skipped.
bool ok(graph *g, cudnnStatus_t st, const char *what) {
    if (g->err[0]) return false;
    if (st == CUDNN_STATUS_SUCCESS) return true;
    char last[512] = "";
    dnn.cudnnGetLastErrorString(last, sizeof last);
    fail(g, "%s: %s%s%s", what, dnn.cudnnGetErrorString(st), last[0] ? ": " : "", last);
    return false;
}

cudnnBackendDescriptor_t make(graph *g, cudnnBackendDescriptorType_t type, const char *what) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->err[0]) return NULL;
    if (g->n_made == MAX_DESC) {
        fail(g, "%s: more than %d descriptors", what, MAX_DESC);
        return NULL;
    }
    if (!ok(g, dnn.cudnnBackendCreateDescriptor(type, &d), what)) return NULL;
    g->made[g->n_made++] = d;
    return d;
}

void set(graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         int64_t n, const void *v, const char *what) {
    if (d && !g->err[0]) ok(g, dnn.cudnnBackendSetAttribute(d, name, type, n, v), what);
}
void set_desc(graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t v,
              const char *what) {
    if (!v) fail(g, "%s: an operand was not made", what);
    set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}
cudnnBackendDescriptor_t finish(graph *g, cudnnBackendDescriptor_t d, const char *what) {
    if (d && !g->err[0] && ok(g, dnn.cudnnBackendFinalize(d), what)) return d;
    return NULL;
}

void destroy(graph *g) {
    for (int i = g->n_made - 1; i >= 0; i--) dnn.cudnnBackendDestroyDescriptor(g->made[i]);
    g->n_made = g->n_ops = 0;
}

// ---- tensors and ops --------------------------------------------------------------------------------

constexpr cudnnDataType_t F32 = CUDNN_DATA_FLOAT, BF16 = CUDNN_DATA_BFLOAT16, I32 = CUDNN_DATA_INT32,
                          BOOL = CUDNN_DATA_BOOLEAN;

cudnnBackendDescriptor_t tensor(graph *g, int64_t uid, const int64_t dim[4], const int64_t stride[4],
                                cudnnDataType_t type, bool is_virtual, bool by_value) {
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const int64_t align = 16;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, "tensor strides");
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    if (is_virtual) set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    return finish(g, t, "tensor");
}
// A tensor in memory: a view of attention_cudnn_layout.h (the variant pack gives its address).
cudnnBackendDescriptor_t view(graph *g, int64_t uid, const sl_att_view &v, cudnnDataType_t type) {
    return tensor(g, uid, v.dim, v.stride, type, false, false);
}
// An fp32 scalar passed by value (the variant pack gives a host address).
cudnnBackendDescriptor_t scalar(graph *g, int64_t uid) {
    static const int64_t ones[4] = {1, 1, 1, 1};
    return tensor(g, uid, ones, ones, F32, false, true);
}
// A dense (b, h, rows, cols) tensor, row-major or (transposed) column-major in each (b, h).
cudnnBackendDescriptor_t dense(graph *g, int64_t uid, int64_t b, int64_t h, int64_t rows, int64_t cols,
                               cudnnDataType_t type, bool is_virtual, bool transposed = false) {
    const int64_t dim[4] = {b, h, rows, cols};
    const int64_t stride[4] = {h * rows * cols, rows * cols, transposed ? 1 : cols, transposed ? rows : 1};
    return tensor(g, uid, dim, stride, type, is_virtual, false);
}
// An intermediate (virtual) dense tensor.
cudnnBackendDescriptor_t temp(graph *g, int64_t b, int64_t h, int64_t rows, int64_t cols, cudnnDataType_t type,
                              bool transposed = false) {
    return dense(g, g->next_uid++, b, h, rows, cols, type, true, transposed);
}

void add_op(graph *g, cudnnBackendDescriptor_t op) {
    if (!op) return;
    if (g->n_ops == MAX_OPS) fail(g, "more than %d ops", MAX_OPS);
    else g->ops[g->n_ops++] = op;
}

// y = mode(x [, b [, t]]) elementwise, at fp32 unless `math` says otherwise; GEN_INDEX takes `axis`.
void pointwise(graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t math = F32, int64_t axis = -1) {
    cudnnBackendDescriptor_t p = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, "pointwise precision");
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "index axis");
    p = finish(g, p, "pointwise");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p, "pointwise op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    if (b) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    const float one = 1.0f;
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
    add_op(g, finish(g, op, "pointwise op"));
}

// c = a b over the last two dims (the leading ones batch; b's heads broadcast over a's under GQA), fp32 sums.
void matmul(graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t m = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t f32 = F32;
    set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul compute type");
    m = finish(g, m, "matmul");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, "matmul op");
    add_op(g, finish(g, op, "matmul op"));
}

// y = sum or max of x over the dims where y has 1 (or a head group, y having the kv heads), fp32.
void reduce(graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t f32 = F32;
    const bool deterministic = false;  // cudnn-frontend's value (not the attention's determinism: see the top)
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction compute type");
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "reduction operator");
    set(g, r, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic, "reduction mode");
    r = finish(g, r, "reduction");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, "reduction op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    add_op(g, finish(g, op, "reduction op"));
}

// y = x with other dims / strides over the same elements (a transpose as a view).
void reshape(graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    add_op(g, finish(g, op, "reshape op"));
}

// The causal mask on scores s (b, h, T, T): s where query (axis 2) >= key (axis 3), else -inf.
cudnnBackendDescriptor_t causal(graph *g, cudnnBackendDescriptor_t s, int64_t b, int64_t h, int64_t T) {
    cudnnBackendDescriptor_t row = temp(g, b, h, T, T, I32), col = temp(g, b, h, T, T, I32);
    cudnnBackendDescriptor_t keep = temp(g, b, h, T, T, BOOL), y = temp(g, b, h, T, T, F32);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, row, F32, 2);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, col, F32, 3);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, BOOL);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, s, scalar(g, UID_NEG_INF), keep, y);  // keep ? s : -inf
    return y;
}

// The forward: O = softmax(causal(scale Q K^T)) V and Stats = each row's log-sum-exp.
void build_forward(graph *g, int B, int T, int NH, int NKV, int HD) {
    const sl_att_views v = sl_att_cudnn_views(B, T, NH, NKV, HD);
    cudnnBackendDescriptor_t q = view(g, UID_Q, v.q, BF16), kt = view(g, UID_K, sl_att_view_transposed(v.k), BF16);
    cudnnBackendDescriptor_t val = view(g, UID_V, v.v, BF16), o = view(g, UID_O, v.o, BF16);
    cudnnBackendDescriptor_t stats = view(g, UID_STATS, v.stats, F32);
    cudnnBackendDescriptor_t s = temp(g, B, NH, T, T, F32), scaled = temp(g, B, NH, T, T, F32);
    matmul(g, q, kt, s);
    pointwise(g, CUDNN_POINTWISE_MUL, s, scalar(g, UID_SCALE), NULL, scaled);
    cudnnBackendDescriptor_t masked = causal(g, scaled, B, NH, T);
    cudnnBackendDescriptor_t max = temp(g, B, NH, T, 1, F32), shifted = temp(g, B, NH, T, T, F32);
    cudnnBackendDescriptor_t e = temp(g, B, NH, T, T, F32), sum = temp(g, B, NH, T, 1, F32);
    cudnnBackendDescriptor_t log_sum = temp(g, B, NH, T, 1, F32), p = temp(g, B, NH, T, T, BF16);
    reduce(g, CUDNN_REDUCE_TENSOR_MAX, masked, max);
    pointwise(g, CUDNN_POINTWISE_SUB, masked, max, NULL, shifted);
    pointwise(g, CUDNN_POINTWISE_EXP, shifted, NULL, NULL, e);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    pointwise(g, CUDNN_POINTWISE_LOG, sum, NULL, NULL, log_sum);
    pointwise(g, CUDNN_POINTWISE_ADD, max, log_sum, NULL, stats);
    pointwise(g, CUDNN_POINTWISE_DIV, e, sum, NULL, p);  // P in bf16: the second product's inputs match
    matmul(g, p, val, o);
}

// The backward: D = rowsum(dO o O); P = exp(causal(scale Q K^T - Stats)); dV = P^T dO;
// dS = scale P o (dO V^T - D); dK = dS^T Q; dQ = dS K. Under GQA dV and dK come per query head and are
// summed over each kv head's group. `deterministic`: dQ straight from its product (see the top).
void build_backward(graph *g, int B, int T, int NH, int NKV, int HD, bool deterministic) {
    const sl_att_views v = sl_att_cudnn_views(B, T, NH, NKV, HD);
    cudnnBackendDescriptor_t q = view(g, UID_Q, v.q, BF16), kt = view(g, UID_K, sl_att_view_transposed(v.k), BF16);
    cudnnBackendDescriptor_t vt = view(g, UID_V, sl_att_view_transposed(v.v), BF16), o = view(g, UID_O, v.o, BF16);
    cudnnBackendDescriptor_t dout = view(g, UID_DO, v.o, BF16), stats = view(g, UID_STATS, v.stats, F32);
    cudnnBackendDescriptor_t dq = view(g, UID_DQ, v.q, BF16), dk = view(g, UID_DK, v.k, BF16);
    cudnnBackendDescriptor_t dv = view(g, UID_DV, v.v, BF16), scale = scalar(g, UID_SCALE);
    const bool grouped = NH != NKV;
    // D, through a product with 1 into a tensor in memory (cudnn-frontend's form, and its strides for
    // dO o O; scratch here)
    const int64_t h = NH, t = T, d = HD;
    const int64_t dod[4] = {B, h, t, d}, dos[4] = {h * t * d, t * d, h * d, 1};
    cudnnBackendDescriptor_t dout_o = tensor(g, g->next_uid++, dod, dos, F32, true, false);
    cudnnBackendDescriptor_t row_sum = temp(g, B, NH, T, 1, F32);
    cudnnBackendDescriptor_t delta = dense(g, UID_DELTA, B, NH, T, 1, F32, false);
    pointwise(g, CUDNN_POINTWISE_MUL, dout, o, NULL, dout_o);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, dout_o, row_sum);
    pointwise(g, CUDNN_POINTWISE_MUL, row_sum, scalar(g, UID_ONE), NULL, delta);
    // P again from the saved statistics
    cudnnBackendDescriptor_t s = temp(g, B, NH, T, T, F32), scaled = temp(g, B, NH, T, T, F32);
    cudnnBackendDescriptor_t centred = temp(g, B, NH, T, T, F32);
    matmul(g, q, kt, s);
    pointwise(g, CUDNN_POINTWISE_MUL, s, scale, NULL, scaled);
    pointwise(g, CUDNN_POINTWISE_SUB, scaled, stats, NULL, centred);
    cudnnBackendDescriptor_t masked = causal(g, centred, B, NH, T);
    cudnnBackendDescriptor_t p = temp(g, B, NH, T, T, F32), pt = temp(g, B, NH, T, T, BF16, true);
    pointwise(g, CUDNN_POINTWISE_EXP, masked, NULL, NULL, p);
    reshape(g, p, pt);
    // dV (per query head under GQA, then summed over the group)
    cudnnBackendDescriptor_t dv_heads = grouped ? temp(g, B, NH, T, HD, BF16) : dv;
    matmul(g, pt, dout, dv_heads);
    if (grouped) reduce(g, CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv);
    // dS
    cudnnBackendDescriptor_t dp = temp(g, B, NH, T, T, F32), dp_c = temp(g, B, NH, T, T, F32);
    cudnnBackendDescriptor_t dp_p = temp(g, B, NH, T, T, F32), ds = temp(g, B, NH, T, T, F32);
    matmul(g, dout, vt, dp);
    pointwise(g, CUDNN_POINTWISE_SUB, dp, delta, NULL, dp_c);
    pointwise(g, CUDNN_POINTWISE_MUL, dp_c, p, NULL, dp_p);
    pointwise(g, CUDNN_POINTWISE_MUL, dp_p, scale, NULL, ds);
    // dK
    cudnnBackendDescriptor_t dst = temp(g, B, NH, T, T, BF16, true);
    reshape(g, ds, dst);
    cudnnBackendDescriptor_t dk_heads = grouped ? temp(g, B, NH, T, HD, BF16) : dk;
    matmul(g, dst, q, dk_heads);
    if (grouped) reduce(g, CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk);
    // dQ, with K as a view of K^T (fp32: the type cudnn-frontend's reshape gives it)
    cudnnBackendDescriptor_t k = tensor(g, g->next_uid++, v.k.dim, v.k.stride, F32, true, false);
    reshape(g, kt, k);
    if (deterministic) {
        matmul(g, ds, k, dq);
    } else {
        cudnnBackendDescriptor_t dq_sum = dense(g, UID_DQ_SUM, B, NH, T, HD, F32, false);
        matmul(g, ds, k, dq_sum);
        pointwise(g, CUDNN_POINTWISE_IDENTITY, dq_sum, NULL, NULL, dq);
    }
}

// The operation graph of one call (the handle set when there is one: without a GPU the graph still
// finalizes, which is what cuda_attention_cudnn_check_graph tests).
cudnnBackendDescriptor_t build_graph(graph *g, bool backward, int B, int T, int NH, int NKV, int HD,
                                     bool deterministic, cudnnHandle_t handle) {
    g->next_uid = UID_VIRTUAL;
    if (backward) build_backward(g, B, T, NH, NKV, HD, deterministic);
    else build_forward(g, B, T, NH, NKV, HD);
    cudnnBackendDescriptor_t og = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops, "graph ops");
    if (handle) set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
    return finish(g, og, "operation graph");
}

// ---- plans: one per shape, kept ------------------------------------------------------------------

struct plan {
    int backward, deterministic, B, T, NH, NKV, HD;
    unsigned long used;  // the call count at its last use (the least recently used plan goes first)
    graph g;
    cudnnBackendDescriptor_t exec;  // NULL: building it failed (g.err says why)
    int64_t workspace;
    int mode, config;               // the heuristics mode (0: A, 1: fallback) and the configuration taken
};
constexpr int MAX_PLANS = 48;
plan plans[MAX_PLANS];
int n_plans;
unsigned long uses;  // plan lookups so far

// Heuristics (mode A, then the fallback list), then the first engine configuration that finalizes.
void build_plan(plan *p) {
    graph *g = &p->g;
    cudnnBackendDescriptor_t og =
        build_graph(g, p->backward, p->B, p->T, p->NH, p->NKV, p->HD, p->deterministic, dnn_handle);
    static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char refusal[512] = "";  // cuDNN's first word on why no configuration was offered or built
    int64_t offered = 0;
    for (int m = 0; m < 2 && !g->err[0] && !p->exec; m++) {
        cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
        set_desc(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og, "heuristics graph");
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m], "heuristics mode");
        heur = finish(g, heur, "heuristics");
        int64_t n = 0, got = 0;
        if (heur) ok(g, dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                                     &n, NULL), "heuristics count");
        cudnnBackendDescriptor_t cfg[8];
        if (n > 8) n = 8;
        for (int i = 0; i < n; i++) cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
        // the count returned now: configurations that fail cuDNN's support checks are left out
        if (n > 0 && !g->err[0])
            ok(g, dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                                               &got, cfg), "heuristics results");
        if (got == 0 && !refusal[0]) dnn.cudnnGetLastErrorString(refusal, sizeof refusal);
        offered += got;
        for (int i = 0; i < got && !g->err[0] && !p->exec; i++) {
            cudnnBackendDescriptor_t e = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
            set(g, e, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i], "plan config");
            cudnnStatus_t st = e && !g->err[0] ? dnn.cudnnBackendFinalize(e) : CUDNN_STATUS_BAD_PARAM;
            if (st == CUDNN_STATUS_SUCCESS) p->exec = e, p->mode = m, p->config = i;
            else if (!refusal[0]) dnn.cudnnGetLastErrorString(refusal, sizeof refusal);
        }
    }
    if (!p->exec)
        fail(g, "cuDNN offered %lld engine configurations for the %s graph and none built (%s)", (long long)offered,
             p->backward ? "backward" : "forward", refusal[0] ? refusal : "no message");
    if (p->exec)
        ok(g, dnn.cudnnBackendGetAttribute(p->exec, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, NULL,
                                           &p->workspace), "plan workspace");
    if (g->err[0]) p->exec = NULL;
}

// The plan of a call (built at first use; a failed build is kept too, so every call reports it rather
// than compiling again: a retry would take seconds a layer and most likely fail the same way).
plan *plan_for(bool backward, bool deterministic, int B, int T, int NH, int NKV, int HD) {
    uses++;
    for (int i = 0; i < n_plans; i++) {
        plan *p = &plans[i];
        if (p->backward == backward && p->deterministic == deterministic && p->B == B && p->T == T && p->NH == NH &&
            p->NKV == NKV && p->HD == HD) {
            p->used = uses;
            return p;
        }
    }
    plan *p;
    if (n_plans < MAX_PLANS) {
        p = &plans[n_plans++];
    } else {  // the least recently used goes (the stream waits: work queued on it may still use the plan)
        p = &plans[0];
        for (int i = 1; i < MAX_PLANS; i++)
            if (plans[i].used < p->used) p = &plans[i];
        CUDA_CHECK(cudaStreamSynchronize(sl_cuda_stream()));
        destroy(&p->g);
    }
    memset(p, 0, sizeof *p);
    p->used = uses;
    p->backward = backward, p->deterministic = deterministic, p->B = B, p->T = T, p->NH = NH, p->NKV = NKV, p->HD = HD;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    build_plan(p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    plans_built++;
    plan_seconds += took;
    if (took > plan_longest) plan_longest = took;
    if (p->exec)
        sl_log(SL_LOG_INFO, "cuDNN attention: %s plan for B=%d T=%d NH=%d NKV=%d HD=%d%s built in %.2f s "
               "(heuristics %s, configuration %d; workspace %.1f MiB; libcudnn %zu)", backward ? "backward" : "forward",
               B, T, NH, NKV, HD, backward ? (deterministic ? ", deterministic" : ", dQ in fp32") : "", took,
               p->mode ? "fallback" : "A", p->config, (double)p->workspace / 1048576.0, dnn_version);
    return p;
}

// Loads cuDNN and the handle on the backend's stream, for a call over T tokens: 1 to go on, 0 when the
// loaded version leaves that T to the mma.sync kernels (see ANY_T_VERSION) or, under auto, when cuDNN
// cannot be used, -1 with the failure recorded.
int ready(int T) {
    if (dnn_load() != 0) return cannot("%s", dnn_why);
    if (dnn_version < ANY_T_VERSION && T % 128) return 0;  // (auto never asks: auto_checked)
    if (!dnn_handle) {
        cudnnStatus_t st = dnn.cudnnCreate(&dnn_handle);
        if (st == CUDNN_STATUS_SUCCESS) st = dnn.cudnnSetStream(dnn_handle, sl_cuda_stream());
        if (st != CUDNN_STATUS_SUCCESS) {
            if (dnn_handle) dnn.cudnnDestroy(dnn_handle);
            dnn_handle = NULL;
            return cannot("cudnnCreate / cudnnSetStream failed: %s", dnn.cudnnGetErrorString(st));
        }
    }
    return 1;
}

// Queues one built plan (p->exec) with the variant pack of (uid, address) pairs; the workspace from
// scratch. false when it could not (the failure recorded).
bool execute(plan *p, const int64_t *uids, void *const *ptrs, int n) {
    static sl_cuda_scratch ws;
    void *work = p->workspace > 0 ? sl_cuda_scratch_get(&ws, (size_t)p->workspace, "cuDNN attention's workspace") : NULL;
    if (p->workspace > 0 && !work) return false;
    graph vp_g = {};  // the variant pack, made and destroyed per call (its addresses change)
    cudnnBackendDescriptor_t vp = make(&vp_g, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    set(&vp_g, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs, "variant pointers");
    set(&vp_g, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids, "variant uids");
    set(&vp_g, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &work, "variant workspace");
    vp = finish(&vp_g, vp, "variant pack");
    if (vp) ok(&vp_g, dnn.cudnnBackendExecute(dnn_handle, p->exec, vp), "execute");
    const bool done = !vp_g.err[0];
    if (done) calls++;
    else sl_cuda_record_failure("SHARDLM_ATTENTION=cudnn: %s", vp_g.err);
    destroy(&vp_g);
    return done;
}

// A plan whose graph cuDNN refused (plan_for keeps it, with cuDNN's message): cannot()'s verdict.
int refused(const plan *p) {
    return cannot("the %s graph for B %d T %d heads %d/%d head dim %d: %s", p->backward ? "backward" : "forward",
                  p->B, p->T, p->NH, p->NKV, p->HD, p->g.err);
}

// Element offsets into a bf16 buffer as addresses.
void *at(const __nv_bfloat16 *base, int64_t offset) { return (void *)(base + offset); }

// The sequences one call of this kind takes (attention_cudnn_layout.h's sl_att_cudnn_slice), so that
// its workspace stays within SHARDLM_CUDNN_WORKSPACE_MB: the deterministic backward's bf16 dS is
// NH * T * T * 2 bytes a sequence (24 MiB for GPT-2 at T = 1024: 1.5 GiB at B = 64, held from the
// first call on), the forward's and the fp32-dQ backward's workspace next to nothing. That figure
// picks the slice; when the slice's plan then asks for more than the cap, its own figure picks again.
int slice_of(bool backward, bool deterministic, int B, int T, int NH, int NKV, int HD) {
    const int64_t cap = (int64_t)sl_settings_get()->cudnn_workspace_mb << 20;
    const int64_t guess = backward && deterministic ? (int64_t)NH * T * T * 2 : 0;
    const int step = sl_att_cudnn_slice_step(NH, T);
    const int s = sl_att_cudnn_slice(B, guess, cap, step);
    const plan *p = plan_for(backward, deterministic, s, T, NH, NKV, HD);
    if (!p->exec || p->workspace <= cap || s <= step) return s;
    return sl_att_cudnn_slice(B, (p->workspace + s - 1) / s, cap, step);
}

#else

int no_header() {
    return cannot("this build found no cudnn_graph.h (cuDNN 9's header; set CUDNN_HOME to a cuDNN 9 install and "
                  "rebuild)");
}

#endif  // SL_HAVE_CUDNN

}  // namespace

extern "C" unsigned long cuda_attention_cudnn_calls(void) { return calls; }

extern "C" unsigned long cuda_attention_cudnn_plans(double *seconds, double *longest) {
    *seconds = plan_seconds;
    *longest = plan_longest;
    return plans_built;
}

extern "C" size_t cuda_attention_cudnn_version(void) {
#ifdef SL_HAVE_CUDNN
    return dnn_load() == 0 ? dnn_version : 0;
#else
    return 0;
#endif
}

bool attention_cudnn_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B, int T, int NH, int NKV,
                             int HD, float scale) {
    if (!takes(T, NH, NKV, HD, out, qkv, NULL, lse)) return false;
#ifdef SL_HAVE_CUDNN
    const int go = ready(T);  // as the backward's: see ANY_T_VERSION
    if (go <= 0) return go < 0;
    float scale_v = scale, neg_inf = -INFINITY;  // by value: host addresses, read by cudnnBackendExecute
    const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    const int slice = slice_of(false, false, B, T, NH, NKV, HD);
    for (int b0 = 0; b0 < B; b0 += slice) {  // slice by slice: the views of `n` sequences, moved on by b0
        const int n = B - b0 < slice ? B - b0 : slice;
        plan *p = plan_for(false, false, n, T, NH, NKV, HD);
        if (!p->exec) return refused(p) < 0;
        const sl_att_views v = sl_att_cudnn_views(n, T, NH, NKV, HD);
        const __nv_bfloat16 *x = qkv + b0 * v.q.stride[0];
        void *const ptrs[] = {at(x, v.q.offset), at(x, v.k.offset), at(x, v.v.offset), out + b0 * v.o.stride[0],
                              lse + b0 * v.stats.stride[0], &scale_v, &neg_inf};
        if (!execute(p, uids, ptrs, 7)) break;
    }
    return true;
#else
    (void)lse, (void)B, (void)NH, (void)NKV, (void)scale;
    return no_header() < 0;
#endif
}

bool attention_cudnn_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                              const __nv_bfloat16 *out, const float *lse, int B, int T, int NH, int NKV, int HD,
                              float scale) {
    if (!takes(T, NH, NKV, HD, dqkv, dout, qkv, lse) || !sl_aligned16(out)) return false;
#ifdef SL_HAVE_CUDNN
    const int go = ready(T);
    if (go <= 0) return go < 0;
    const bool deterministic = sl_settings_get()->attention_dq != SL_ATTENTION_DQ_ATOMIC;
    const int slice = slice_of(true, deterministic, B, T, NH, NKV, HD);
    const size_t rows = (size_t)slice * NH * T;  // a slice's: D and dQ's sums are scratch reused slice by slice
    static sl_cuda_scratch delta_s, dq_sum_s;  // D, and dQ's fp32 sums (the non-deterministic form)
    void *delta = sl_cuda_scratch_get(&delta_s, rows * sizeof(float), "cuDNN attention's row sums");
    void *dq_sum = deterministic ? NULL
                                 : sl_cuda_scratch_get(&dq_sum_s, rows * HD * sizeof(float), "cuDNN attention's dQ sums");
    if (!delta || (!deterministic && !dq_sum)) return true;
    float scale_v = scale, neg_inf = -INFINITY, one = 1.0f;
    const int64_t uids[] = {UID_Q,  UID_K,  UID_V,  UID_O,   UID_STATS, UID_SCALE, UID_NEG_INF,
                            UID_DO, UID_DQ, UID_DK, UID_DV, UID_ONE,   UID_DELTA, UID_DQ_SUM};
    for (int b0 = 0; b0 < B; b0 += slice) {
        const int n = B - b0 < slice ? B - b0 : slice;
        plan *p = plan_for(true, deterministic, n, T, NH, NKV, HD);
        if (!p->exec) return refused(p) < 0;
        const sl_att_views v = sl_att_cudnn_views(n, T, NH, NKV, HD);
        const __nv_bfloat16 *x = qkv + b0 * v.q.stride[0], *dx = dqkv + b0 * v.q.stride[0];
        const int64_t o = b0 * v.o.stride[0];
        // cuDNN since 9.6 clears dQ's sums itself (cudnn-frontend stopped doing it); cleared here anyway
        if (dq_sum) CUDA_CHECK(cudaMemsetAsync(dq_sum, 0, (size_t)n * NH * T * HD * sizeof(float), sl_cuda_stream()));
        void *const ptrs[] = {at(x, v.q.offset), at(x, v.k.offset), at(x, v.v.offset), at(out, o),
                              (void *)(lse + b0 * v.stats.stride[0]), &scale_v, &neg_inf, at(dout, o),
                              at(dx, v.q.offset), at(dx, v.k.offset), at(dx, v.v.offset), &one, delta, dq_sum};
        if (!execute(p, uids, ptrs, deterministic ? 13 : 14)) break;
    }
    return true;
#else
    (void)out, (void)lse, (void)B, (void)NH, (void)NKV, (void)scale;
    return no_header() < 0;
#endif
}

// Builds and finalizes one call's operation graph without a GPU: 0 when cuDNN accepts it, 1 when
// libcudnn (or its header, at build time) is not there, -1 when cuDNN refuses the graph; why says.
extern "C" int cuda_attention_cudnn_check_graph(int backward, int deterministic, int B, int T, int NH, int NKV, int HD,
                                                char *why, size_t cap) {
#ifdef SL_HAVE_CUDNN
    if (dnn_load() != 0) {
        snprintf(why, cap, "%s", dnn_why);
        return 1;
    }
    static graph g;
    memset(&g, 0, sizeof g);
    build_graph(&g, backward != 0, B, T, NH, NKV, HD, deterministic != 0, NULL);
    snprintf(why, cap, "%s", g.err[0] ? g.err : "accepted");
    const int rc = g.err[0] ? -1 : 0;
    destroy(&g);
    return rc;
#else
    (void)backward, (void)deterministic, (void)B, (void)T, (void)NH, (void)NKV, (void)HD;
    snprintf(why, cap, "built without cudnn_graph.h");
    return 1;
#endif
}
