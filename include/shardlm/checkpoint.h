// checkpoint.h: checkpoint directory mechanics (DeepSpeed-style tag directories and `latest`).
//
//   ROOT/
//     latest              text file holding the newest complete tag (rewritten atomically)
//     step_000100/        one directory per tag; whatever files the engine writes
//     step_000200/
//     .tmp-<tag>-<pid>/   a checkpoint being written (ignored by resolve; removed by clean)
//
// A tag directory appears under its final name only when every file in it has been fsync'd, and
// `latest` names it only after that rename is durable, so a crash at any point leaves the previous
// checkpoint and `latest` intact and loadable.
#ifndef SHARDLM_CHECKPOINT_H
#define SHARDLM_CHECKPOINT_H

#include <stddef.h>
#include "shardlm/safetensors.h"

// Creates a fresh, empty ROOT/.tmp-<tag>-<pid> (ROOT created if needed) and returns its path.
// Tags are non-empty, at most 128 chars of [A-Za-z0-9._-], not starting with '.', not "latest".
int sl_ckpt_begin(const char *root, const char *tag, char *tmp_dir, size_t cap);

// fsyncs every file in tmp_dir and tmp_dir itself, moves it to ROOT/<tag> (replacing an existing
// ROOT/<tag> only once the new one is complete), fsyncs ROOT, then atomically rewrites ROOT/latest.
int sl_ckpt_commit(const char *root, const char *tag, const char *tmp_dir);

// Removes an uncommitted temporary directory (only names of the form .tmp-*).
int sl_ckpt_abort(const char *tmp_dir);

// Turns a checkpoint root (uses ROOT/latest) or a tag directory into the directory to load.
int sl_ckpt_resolve(const char *path, char *dir_out, size_t cap);

// Removes ROOT/.tmp-* directories, ROOT/latest.tmp.* files and ROOT/.old-TAG-* directories whose
// ROOT/TAG exists again, left by processes on this host that are no longer running (a .old-TAG-* copy
// that is the only one of TAG is kept: sl_ckpt_resolve loads it). Returns the number removed, or -1.
// `shardlm train` runs it on its save directory at start (rank 0).
int sl_ckpt_clean_stale(const char *root);

// Flat 1-D float32 buffers (e.g. optimizer moments) to/from one safetensors file, written atomically.
int sl_ckpt_save_tensors(const char *path, int n, const char **names, const float **data, const size_t *numel);
// The same file streamed: opens a writer for those n tensors (the header sl_ckpt_save_tensors
// writes); the caller appends their data in order (sl_st_writer_write, any chunking), then
// sl_st_writer_finish, or sl_st_writer_abort on failure.
int sl_ckpt_open_tensors(sl_st_writer **w, const char *path, int n, const char **names, const size_t *numel);
// Each names[i] must exist with exactly numel[i] elements (1-D); data[i] receives them.
int sl_ckpt_load_tensors(const char *path, int n, const char **names, float **data, const size_t *numel);

#endif
