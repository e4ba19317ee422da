// engine_ckpt_8bit.c: AdamW8bit's state in checkpoint files (engine_ckpt.c calls these for the
// optimizer shards and for consolidation). A shard file holds the state of one flat range [begin, end)
// as its plan (optim_8bit.h) lays it out, i.e. bitsandbytes' per-tensor blocks:
//   exp_avg.q8, exp_avg_sq.q8         U8  [n8]       the codes (signed / unsigned dynamic map)
//   exp_avg.absmax, exp_avg_sq.absmax F32 [blocks]   one per block of 256 (a cut block in both files)
//   exp_avg.fp32, exp_avg_sq.fp32     F32 [n32]      tensors under min_8bit_size
// with metadata {"format": "shardlm-adamw8bit", "min_8bit_size", "block_size"}. Reading matches the
// saved range's plan against the reader's (sl_adam8_overlap), so any world size reads any other's.
#include "engine_internal.h"
#include "shardlm/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const SL_ADAM8_TENSORS[6] = {"exp_avg.q8",     "exp_avg_sq.q8",   "exp_avg.absmax",
                                         "exp_avg_sq.absmax", "exp_avg.fp32", "exp_avg_sq.fp32"};

int engine_adam8_write(const sl_adam8_plan *plan, const sl_adam8_state *st, long long min_8bit_size,
                       const char *path) {
    size_t numel[6] = {plan->n8, plan->n8, plan->n_blocks, plan->n_blocks, plan->n32, plan->n32};
    const void *data[6] = {st->q1, st->q2, st->absmax1, st->absmax2, st->m32, st->v32};
    sl_st_desc desc[6];
    sl_st_dtype dtypes[6];
    for (int i = 0; i < 6; i++) {
        desc[i] = (sl_st_desc){SL_ADAM8_TENSORS[i], 1, {(int64_t)numel[i]}};
        dtypes[i] = i < 2 ? SL_ST_U8 : SL_ST_F32;
    }
    char min_size[32], block[16];
    snprintf(min_size, sizeof min_size, "%lld", min_8bit_size);
    snprintf(block, sizeof block, "%d", SL_ADAM8_BLOCK);
    const char *mk[3] = {"format", "min_8bit_size", "block_size"}, *mv[3] = {"shardlm-adamw8bit", min_size, block};
    sl_st_writer *w;
    if (sl_st_writer_open_dtypes(&w, path, 6, desc, dtypes, 3, mk, mv)) return -1;
    for (int i = 0; i < 6; i++) {
        size_t bytes = numel[i] * (i < 2 ? 1 : sizeof(float));
        if (bytes && sl_st_writer_write_raw(w, data[i], bytes)) {
            sl_st_writer_abort(w);
            return -1;
        }
    }
    return sl_st_writer_finish(w);
}

long long engine_adam8_file_min_size(const sl_st_file *f) {
    const char *format = sl_st_metadata(f, "format"), *v = sl_st_metadata(f, "min_8bit_size");
    const char *block = sl_st_metadata(f, "block_size");
    char *end = NULL;
    long long n = v ? strtoll(v, &end, 10) : -1;
    if (!format || strcmp(format, "shardlm-adamw8bit") != 0 || !v || *end || n < 0 || !block ||
        atoi(block) != SL_ADAM8_BLOCK)
        return sl_errorf("%s: not an AdamW8bit state file (metadata format \"shardlm-adamw8bit\", min_8bit_size, "
                         "block_size 256 expected)", f->path);
    return n;
}

typedef struct { const sl_st_file *f; int idx[6]; sl_adam8_state *dst; } read_ctx;

static int read_run(void *ctx, sl_adam8_part part, size_t src, size_t dst, size_t count) {
    read_ctx *c = ctx;
    sl_adam8_state *d = c->dst;
    if (part == SL_ADAM8_CODES)
        return sl_st_read_raw_range(c->f, c->idx[0], SL_ST_U8, src, count, d->q1 + dst) ||
               sl_st_read_raw_range(c->f, c->idx[1], SL_ST_U8, src, count, d->q2 + dst);
    int k = part == SL_ADAM8_ABSMAX ? 2 : 4;
    float *a = part == SL_ADAM8_ABSMAX ? d->absmax1 : d->m32, *b = part == SL_ADAM8_ABSMAX ? d->absmax2 : d->v32;
    return sl_st_read_raw_range(c->f, c->idx[k], SL_ST_F32, src, count, a + dst) ||
           sl_st_read_raw_range(c->f, c->idx[k + 1], SL_ST_F32, src, count, b + dst);
}

int engine_adam8_read(const sl_tensor_info *tensors, int n_tensors, size_t total, long long min_8bit_size,
                      const char *path, size_t begin, size_t end, const sl_adam8_plan *dst_plan, sl_adam8_state *dst) {
    sl_st_file f;
    if (sl_st_open(&f, path)) return -1;
    long long saved = engine_adam8_file_min_size(&f);
    int rc = saved < 0 ? -1 : 0;
    if (rc == 0 && min_8bit_size >= 0 && saved != min_8bit_size)
        rc = sl_errorf("%s: saved with optimizer.params.min_8bit_size %lld, this run has %lld (the state of tensors "
                       "between the two would change kind)", path, saved, min_8bit_size);
    sl_optim_config cfg;
    sl_optim_defaults(&cfg);
    cfg.min_8bit_size = saved;
    sl_adam8_plan src = {0};
    if (rc == 0) rc = sl_adam8_plan_build(&src, tensors, n_tensors, total, &cfg, begin, end);
    read_ctx c = {&f, {0}, dst};
    size_t numel[6] = {src.n8, src.n8, src.n_blocks, src.n_blocks, src.n32, src.n32};
    for (int i = 0; rc == 0 && i < 6; i++) {
        c.idx[i] = sl_st_find(&f, SL_ADAM8_TENSORS[i]);
        if (c.idx[i] < 0) rc = sl_errorf("%s: no tensor \"%s\"", path, SL_ADAM8_TENSORS[i]);
        else if (f.tensors[c.idx[i]].numel != numel[i])
            rc = sl_errorf("%s: tensor \"%s\" holds %zu elements; the range [%zu, %zu) of this model needs %zu", path,
                           SL_ADAM8_TENSORS[i], f.tensors[c.idx[i]].numel, begin, end, numel[i]);
    }
    if (rc == 0) rc = sl_adam8_overlap(dst_plan, &src, read_run, &c);
    sl_adam8_plan_free(&src);
    sl_st_close(&f);
    return rc;
}
