// engine_stage.c: how checkpoint data crosses between the engine's buffers (the backend's memory:
// GPU memory under cuda) and checkpoint files, which are written from and read into host memory.
// A save downloads (ops->download, which waits) into a host staging buffer and writes from it; a
// load reads into one and uploads (ops->upload) into the live buffers. No engine or model pointer
// is reassigned, ever. On the cpu download and upload are memcpy: the CPU tests run this very path.
// Invariants:
//   - optimizer state moves a chunk at a time through one host buffer of at most
//     engine_stage_floats(e) floats per call, freed before it returns;
//   - a failed copy recorded by the backend (ops->synchronize) is reported at once, naming the
//     tensor and the checkpoint; a save never writes the data it spoiled, and its file is never
//     renamed into place (the temporary is removed);
//   - every chunk's copy has finished (ops->synchronize) before the host buffer takes the next one,
//     so one buffer serves every chunk, and a failed upload is named like a failed download.
#include "engine_internal.h"
#include "shardlm/checkpoint.h"
#include "shardlm/error.h"

#include <stdlib.h>

static int rank_of(const sl_engine *e) { return e->distributed ? sl_comm_rank(e->cfg.dp) : 0; }

size_t engine_stage_floats(const sl_engine *e) {
    return e->ckpt_stage_floats ? e->ckpt_stage_floats : SL_CKPT_STAGE_FLOATS;
}

// A host buffer for chunks of at most `largest` floats (at least one float), or NULL with a message.
static float *stage_buffer(const sl_engine *e, size_t largest) {
    size_t n = engine_stage_floats(e);
    if (largest < n) n = largest ? largest : 1;
    return sl_malloc(n * sizeof(float), "checkpoint staging buffer");
}

int engine_stage_write(const sl_engine *e, const char *path, int n, const char **names, const float *const *src,
                       const size_t *numel, const char *what) {
    const sl_ops *ops = e->model->ops;
    size_t largest = 0;
    for (int i = 0; i < n; i++)
        if (numel[i] > largest) largest = numel[i];
    size_t chunk = engine_stage_floats(e);
    float *host = stage_buffer(e, largest);
    sl_st_writer *w = NULL;
    int rc = host ? sl_ckpt_open_tensors(&w, path, n, names, numel) : -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        for (size_t done = 0; rc == 0 && done < numel[i];) {
            size_t k = numel[i] - done < chunk ? numel[i] - done : chunk;
            ops->download(host, src[i] + done, k * sizeof(float));
            if (ops->synchronize()) rc = sl_error_context("%s: copying \"%s\" to host memory", what, names[i]);
            else rc = sl_st_writer_write(w, host, k);
            done += k;
        }
    }
    if (rc == 0) rc = sl_st_writer_finish(w);  // frees w, also on failure
    else sl_st_writer_abort(w);
    free(host);
    return rc;
}

int engine_stage_read(const sl_engine *e, const sl_st_file *f, int idx, size_t first, size_t count, float *dst,
                      const char *what) {
    const sl_ops *ops = e->model->ops;
    size_t chunk = engine_stage_floats(e);
    float *host = stage_buffer(e, count);
    if (!host) return -1;
    int rc = 0;
    for (size_t done = 0; rc == 0 && done < count;) {
        size_t k = count - done < chunk ? count - done : chunk;
        rc = sl_st_read_f32_range(f, idx, first + done, k, host);
        if (rc == 0) ops->upload(dst + done, host, k * sizeof(float));
        if (rc == 0 && ops->synchronize())
            rc = sl_error_context("%s: copying \"%s\" to the %s backend", what, f->tensors[idx].name, ops->name);
        done += k;
    }
    free(host);
    return rc;
}

// Every rank learns whether all of them succeeded (a failed allocation on one rank must not leave
// the others waiting in the gather that follows).
static int agree(sl_engine *e, int rc) {
    if (e->distributed && sl_comm_allreduce(e->cfg.dp, &rc, 1, SL_DTYPE_I32, SL_OP_MIN)) rc = -1;
    return rc;
}

int engine_backend_agrees(sl_engine *e) {
    int mine = e->model->ops->synchronize() ? -1 : 0, all = mine;
    if (e->distributed && sl_comm_allreduce(e->cfg.dp, &all, 1, SL_DTYPE_I32, SL_OP_MIN)) return -1;
    if (all && !mine) return sl_errorf("another data-parallel rank's %s backend reported a failed call (see its error)",
                                       e->model->ops->name);
    return all;
}

int engine_weights_for_save(sl_engine *e, float **full) {
    const sl_ops *ops = e->model->ops;
    *full = NULL;
    int stage3 = e->sharded && e->zero.stage == 3, rank0 = rank_of(e) == 0;
    if (!stage3 && (!e->master || !e->sharded)) {
        // one local buffer holds them all: the master without ZeRO, else the model's fp32 parameters
        const float *src = e->master ? e->master : engine_params(e);
        size_t n = engine_total(e);
        float *host = rank0 ? sl_malloc(n * sizeof(float), "weights for the checkpoint") : NULL;
        if (agree(e, rank0 && !host ? -1 : 0)) {
            free(host);
            return -1;
        }
        if (host) ops->download(host, src, n * sizeof(float));
        *full = host;
        return 0;
    }
    // ZeRO: every rank's slice (master, or the stage-3 parameters) into one host buffer
    int need = !stage3 || rank0;
    float *buf = need ? sl_calloc(e->padded_total, sizeof(float), "weights for the checkpoint") : NULL;
    if (agree(e, need && !buf ? -1 : 0)) {
        free(buf);
        return -1;
    }
    int rc;
    if (stage3) {
        // unit by unit through the windows: no full-size buffer in the backend's memory
        rc = sl_zero_gather_slices(&e->zero, e->master ? e->master : e->zero.shard_params, buf);
    } else {
        // stages 1-2 under mixed precision: this rank's master slice downloaded into its place, then
        // all-gathered in place on host memory
        float *mine = buf + e->shard_begin;
        ops->download(mine, e->master, e->shard_size * sizeof(float));
        rc = sl_comm_allgather(e->cfg.dp, mine, buf, e->shard_size, SL_DTYPE_F32);
    }
    if (rc || !rank0) free(buf);  // only rank 0 writes them
    if (rc) return sl_error_context("gathering the weights for the checkpoint");
    *full = rank0 ? buf : NULL;
    return 0;
}
