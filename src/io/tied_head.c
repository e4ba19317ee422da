// tied_head.c: a tied model's file that also holds lm_head.weight (hf_weights.h sl_hf_check_tied_head).
// transformers 4.x ties the head to the embedding after loading and drops that tensor; transformers 5
// keeps the file's tensor as the head when the file has one. The two readings agree only when the
// tensor equals the embedding, so it must, value for value; a different head is refused by name
// instead of being dropped in silence. Read a chunk of each at a time: no whole-matrix buffer.
#include "shardlm/hf_weights.h"
#include "shardlm/error.h"

#include <math.h>
#include <stdlib.h>

#define CHUNK ((size_t)1 << 16)

int sl_hf_check_tied_head(const sl_st_file *hf, int hi, const sl_st_file *ef, int ei, int arch) {
    const sl_st_tensor *h = &hf->tensors[hi], *e = &ef->tensors[ei];
    const char *advice = arch == SL_ARCH_GPT2
                             ? "shardlm's GPT-2 always ties its head; delete the tensor to use the embedding"
                             : "set \"tie_word_embeddings\": false in config.json to load it as its own head, or "
                               "delete the tensor to use the embedding";
    if (h->ndim != e->ndim || h->ndim != 2 || h->shape[0] != e->shape[0] || h->shape[1] != e->shape[1]) {
        char a[64], b[64];
        return sl_errorf("%s: tensor \"%s\" has shape %s, the embedding \"%s\" %s, but config.json ties the head to "
                         "the embedding (tie_word_embeddings true, its default when absent); %s",
                         hf->path, h->name, sl_st_shape_str(a, sizeof a, h->ndim, h->shape), e->name,
                         sl_st_shape_str(b, sizeof b, e->ndim, e->shape), advice);
    }
    float *x = malloc(2 * CHUNK * sizeof(float)), *y = x + CHUNK;
    if (!x) return sl_errorf("out of memory comparing %s with %s", h->name, e->name);
    size_t cols = (size_t)h->shape[1];
    int rc = 0;
    for (size_t done = 0, m; done < h->numel && !rc; done += m) {
        m = h->numel - done < CHUNK ? h->numel - done : CHUNK;
        if (sl_st_read_f32_range(hf, hi, done, m, x) || sl_st_read_f32_range(ef, ei, done, m, y)) {
            rc = -1;
            break;
        }
        size_t i = 0;
        while (i < m && (x[i] == y[i] || (isnan(x[i]) && isnan(y[i])))) i++;
        if (i < m)
            rc = sl_errorf("%s: tensor \"%s\" differs from the embedding \"%s\" (first at row %zu, column %zu: %g "
                           "against %g), but config.json ties the head to the embedding (tie_word_embeddings true, "
                           "its default when absent): transformers 5 would use this tensor as the head, 4.x the "
                           "embedding; %s",
                           hf->path, h->name, e->name, (done + i) / cols, (done + i) % cols, (double)x[i],
                           (double)y[i], advice);
    }
    free(x);
    return rc;
}
