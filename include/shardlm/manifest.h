// manifest.h: a checkpoint's manifest.json, written last into every tag directory (engine_ckpt.c):
//   {"format": "shardlm-checkpoint-3", "step", "world_size", "zero_stage", "shard_size",
//    "num_parameters_flat", "optimizer", "state_tensors": [names],
//    "optimizer_shards": [{"file", "begin", "end", "rank", "bytes", "fnv1a64"}],
//    "files": [{"file", "bytes", "fnv1a64"}]}      model.safetensors, config.json, trainer_state.json
// "fnv1a64" is the 16-hex-digit FNV-1a 64 of the file's bytes (fileio.h; docs/formats.md). Format
// "shardlm-checkpoint-2" manifests were hashed from a mistyped offset basis (SL_FNV1A64_INIT_V2); they
// still verify, with that basis and a one-line notice on stderr.
#ifndef SHARDLM_MANIFEST_H
#define SHARDLM_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#define SL_MANIFEST_FORMAT "shardlm-checkpoint-3"
#define SL_MANIFEST_FORMAT_V2 "shardlm-checkpoint-2"
#define SL_FNV1A64_INIT_V2 1469598103934665603ULL  // format 2's basis: 14695981039346656037 missing a digit

typedef enum {
    SL_VERIFY_NONE = 0,    // read the lists only (sizes and checksums trusted)
    SL_VERIFY_FILES = 1,   // the "files" list: what loading the weights reads
    SL_VERIFY_ALL = 2,     // the "files" list and every optimizer shard
} sl_verify_level;

typedef struct { char file[256]; size_t begin, end; } sl_manifest_shard;

typedef struct {
    int n_shards;
    sl_manifest_shard *shards;   // in order; their [begin, end) tile [0, total)
    int n_state;
    char state_names[2][32];     // "state_tensors"
} sl_manifest;

// FNV-1a 64 of a regular file's bytes from `basis` (SL_FNV1A64_INIT), and its size.
int sl_file_fnv1a64(const char *path, uint64_t basis, uint64_t *hash, uint64_t *bytes);

// Reads DIR/manifest.json (strictly), checks that its optimizer shards tile [0, total) (total 0: not
// checked) and verifies
// files to `level`: each file's size and checksum must match, or the error names the file.
int sl_manifest_load(sl_manifest *m, const char *dir, size_t total, sl_verify_level level);
void sl_manifest_free(sl_manifest *m);

// Before loading weights from DIR: a shardlm checkpoint (DIR holds manifest.json or trainer_state.json)
// must match its manifest (SL_VERIFY_FILES); a Hugging Face directory without either passes.
int sl_manifest_verify_weights_dir(const char *dir);

#endif
