// test_quant.c: NF4 / FP4 / int8 quantisation and dequantisation against bitsandbytes 0.50's bytes
// (tests/fixtures/quant/quant_ref.safetensors from tests/reference/make_quant_fixtures.py).
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/quant.h"
#include "shardlm/safetensors.h"

#include <stdint.h>

#define FIXTURE "tests/fixtures/quant/quant_ref.safetensors"

static const char *cases[] = {"r1_f32",      "r7_bf16",  "r33_f16",   "ties_f32",
                              "partial_f32", "odd_bf16", "r1023_f32", "wide_f16"};
#define N_CASES (sizeof cases / sizeof cases[0])

static sl_st_file fx;
static int fx_open;

static const sl_st_file *fixture(void) {
    if (!fx_open) {
        if (sl_st_open(&fx, FIXTURE)) { fprintf(stderr, "  %s\n", sl_error()); return NULL; }
        fx_open = 1;
    }
    return &fx;
}

// The raw bytes of tensor "case.suffix" (malloc'd), its element count in *n.
static void *raw(const char *c, const char *suffix, size_t *n) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", c, suffix);
    const sl_st_file *f = fixture();
    int i = f ? sl_st_find(f, name) : -1;
    if (i < 0) { fprintf(stderr, "  fixture lacks %s\n", name); return NULL; }
    size_t bytes = f->tensors[i].end - f->tensors[i].begin;
    void *p = malloc(bytes ? bytes : 1);
    if (sl_st_read_raw(f, i, p, bytes)) { fprintf(stderr, "  %s\n", sl_error()); free(p); return NULL; }
    if (n) *n = f->tensors[i].numel;
    return p;
}

static float *input(const char *c, int64_t *rows, int64_t *cols, sl_quant_dtype *dt) {
    char name[128];
    snprintf(name, sizeof name, "%s.input", c);
    const sl_st_file *f = fixture();
    int i = f ? sl_st_find(f, name) : -1;
    if (i < 0) return NULL;
    const sl_st_tensor *t = &f->tensors[i];
    *rows = t->shape[0];
    *cols = t->shape[1];
    *dt = t->dtype == SL_ST_BF16 ? SL_QDT_BF16 : t->dtype == SL_ST_F16 ? SL_QDT_F16 : SL_QDT_F32;
    float *w = malloc(t->numel * sizeof(float));
    if (sl_st_read_f32(f, i, w, t->numel)) { free(w); return NULL; }
    return w;
}

// Counts positions where n bytes differ; prints the first.
static size_t bytes_differ(const char *what, const void *a, const void *b, size_t elem, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem)) {
            if (!bad) fprintf(stderr, "  %s: first difference at element %zu of %zu\n", what, i, n);
            bad++;
        }
    return bad;
}

static void check_deq(const char *c, const char *what, const sl_qtensor *q) {
    size_t n;
    float *want = raw(c, what, &n);
    CHECK(want && n == q->numel);
    if (!want || n != q->numel) { free(want); return; }
    float *got = malloc(n * sizeof(float));
    sl_dequantize_range(q, 0, n, got);
    CHECK_MSG(bytes_differ(what, got, want, 4, n) == 0, "%s %s: dequantised values differ", c, what);
    // any tile of rows, and any odd range, gives the same bits as the whole
    size_t first = n / 3 + 1, count = n - first > 77 ? 77 : n - first;
    sl_dequantize_range(q, first, count, got);
    CHECK(bytes_differ(what, got, want + first, 4, count) == 0);
    free(got);
    free(want);
}

// Quantises case c's input with our code (type, double quantisation dq); 0 on success.
static int quantize_case(const char *c, sl_quant_type type, int dq, sl_qtensor *q) {
    int64_t rows, cols;
    sl_quant_dtype dt;
    float *w = input(c, &rows, &cols, &dt);
    CHECK(w != NULL);
    if (!w) return -1;
    int rc = type == SL_QUANT_INT8 ? sl_quantize_int8(q, w, rows, cols, dt)
                                   : sl_quantize_4bit(q, w, rows, cols, type, 64, dq, dt, 1);
    CHECK_MSG(rc == 0, "%s: %s", c, sl_error());
    free(w);
    return rc;
}

static void check_4bit(const char *c, sl_quant_type type, int dq, const char *tag) {
    sl_qtensor q;
    if (quantize_case(c, type, dq, &q)) return;
    char key[64];
    size_t n;
    snprintf(key, sizeof key, "%s.data", tag);
    uint8_t *data = raw(c, key, &n);
    CHECK(data && n == (q.numel + 1) / 2);
    if (data) CHECK_MSG(bytes_differ(key, q.data, data, 1, n) == 0, "%s %s", c, key);
    free(data);
    if (!dq) {
        snprintf(key, sizeof key, "%s.absmax", tag);
        float *am = raw(c, key, &n);
        CHECK(am && n == q.n_blocks);
        if (am) CHECK_MSG(bytes_differ(key, q.absmax, am, 4, n) == 0, "%s %s", c, key);
        free(am);
    } else {
        snprintf(key, sizeof key, "%s.offset", tag);
        float *off = raw(c, key, &n);
        CHECK(off && n == 1);
        if (off) CHECK_MSG(memcmp(off, &q.offset, 4) == 0, "%s offset %.9g, bitsandbytes %.9g", c, q.offset, *off);
        free(off);
        snprintf(key, sizeof key, "%s.qabsmax", tag);
        uint8_t *qa = raw(c, key, &n);
        CHECK(qa && n == q.n_blocks);
        if (qa) CHECK_MSG(bytes_differ(key, q.qabsmax, qa, 1, n) == 0, "%s %s", c, key);
        free(qa);
        snprintf(key, sizeof key, "%s.nested_absmax", tag);
        float *na = raw(c, key, &n);
        CHECK(na && n == (q.n_blocks + 255) / 256);
        if (na) CHECK_MSG(bytes_differ(key, q.nested_absmax, na, 4, n) == 0, "%s %s", c, key);
        free(na);
        snprintf(key, sizeof key, "%s.nested_code", tag);
        float *nc = raw(c, key, &n);
        CHECK(nc && n == 256);
        if (nc) CHECK(bytes_differ(key, q.nested_code, nc, 4, 256) == 0);
        free(nc);
    }
    snprintf(key, sizeof key, "%s.deq", tag);
    check_deq(c, key, &q);
    sl_qtensor_free(&q);
}

TEST(nf4_bytes_and_values_equal_bitsandbytes) {
    for (size_t i = 0; i < N_CASES; i++) check_4bit(cases[i], SL_QUANT_NF4, 0, "nf4");
}

TEST(nf4_double_quant_equals_bitsandbytes) {
    for (size_t i = 0; i < N_CASES; i++) check_4bit(cases[i], SL_QUANT_NF4, 1, "nf4dq");
}

TEST(fp4_bytes_and_values_equal_bitsandbytes) {
    for (size_t i = 0; i < N_CASES; i++) check_4bit(cases[i], SL_QUANT_FP4, 0, "fp4");
}

TEST(int8_rows_equal_bitsandbytes) {
    for (size_t i = 0; i < N_CASES; i++) {
        const char *c = cases[i];
        sl_qtensor q;
        if (quantize_case(c, SL_QUANT_INT8, 0, &q)) continue;
        size_t n;
        int8_t *cb = raw(c, "int8.cb", &n);
        CHECK(cb && n == q.numel);
        if (cb) CHECK_MSG(bytes_differ("cb", q.data, cb, 1, n) == 0, "%s int8 codes", c);
        float *scb = raw(c, "int8.scb", &n);
        CHECK(scb && n == (size_t)q.rows);
        if (scb) CHECK_MSG(bytes_differ("scb", q.scb, scb, 4, n) == 0, "%s SCB", c);
        free(cb);
        free(scb);
        check_deq(c, "int8.deq", &q);
        sl_qtensor_free(&q);
    }
}

TEST(nf4_refuses_a_size_that_is_not_a_multiple_of_the_block) {
    float w[100] = {0};
    sl_qtensor q;
    CHECK(sl_quantize_4bit(&q, w, 5, 20, SL_QUANT_NF4, 64, 1, SL_QDT_F32, 0) == -1);
    CHECK(strstr(sl_error(), "not a multiple of the block size 64") != NULL);
    CHECK(q.data == NULL && q.absmax == NULL);
    CHECK(sl_quantize_4bit(&q, w, 5, 20, SL_QUANT_NF4, 48, 0, SL_QDT_F32, 1) == -1);
    CHECK(strstr(sl_error(), "block size 48") != NULL);
    CHECK(sl_quantize_4bit(&q, w, 5, 20, SL_QUANT_INT8, 64, 0, SL_QDT_F32, 1) == -1);
    sl_quant_type t;
    CHECK(sl_quant_parse("nf3", &t) == -1);
    CHECK(strstr(sl_error(), "\"nf3\"") != NULL && strstr(sl_error(), "nf4, fp4, int8") != NULL);
    CHECK(sl_quant_parse("int8", &t) == 0 && t == SL_QUANT_INT8);
}

TEST(torch_mean_matches_exact_mean_closely) {
    // the emulated float sum stays within a few ulps of the double-precision mean for any length
    for (size_t n = 1; n < 3000; n += 37) {
        float *x = malloc(n * sizeof(float));
        double exact = 0;
        for (size_t i = 0; i < n; i++) { x[i] = (float)((i * 2654435761u) % 1000) / 997.0f; exact += x[i]; }
        exact /= (double)n;
        float m = sl_quant_torch_mean(x, n);
        CHECK_MSG(fabs(m - exact) <= 1e-6 * fabs(exact) + 1e-12, "n=%zu mean %.9g exact %.9g", n, m, exact);
        free(x);
    }
}

TEST_MAIN()
