// safetensors.h: reading and writing the safetensors format (Hugging Face).
//
// File layout: 8-byte little-endian header length N, then N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}          (metadata optional)
// then the data; offsets are relative to the first byte after the header.
//
// The reader trusts nothing: the header length, JSON, every field, every dtype, shape/size agreement,
// bounds and overlaps are checked in sl_st_open before any data is read, and every failure is a -1
// with a message naming the file, the tensor and what was expected versus found.
// The writer writes F32 tensors, or any dtype as raw bytes (sl_st_writer_open_dtypes), streaming each tensor to a temporary file in the same
// directory, then fsync + rename + fsync(dir), so a reader never sees a half-written file.
#ifndef SHARDLM_SAFETENSORS_H
#define SHARDLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SL_ST_MAX_DIMS 8
#define SL_ST_MAX_HEADER (100u * 1024u * 1024u)   // headers beyond 100 MB are rejected as corrupt

// Float dtypes convert to float32 on read; the others are recognised (so a file holding, say, an
// int64 buffer still opens) but reading them as float is an error.
typedef enum {
    SL_ST_F32, SL_ST_F16, SL_ST_BF16, SL_ST_F64,
    SL_ST_I8, SL_ST_U8, SL_ST_I16, SL_ST_U16, SL_ST_I32, SL_ST_U32, SL_ST_I64, SL_ST_U64,
    SL_ST_BOOL, SL_ST_F8_E4M3, SL_ST_F8_E5M2
} sl_st_dtype;

typedef struct {
    char *name;
    sl_st_dtype dtype;
    int ndim;
    int64_t shape[SL_ST_MAX_DIMS];
    size_t numel;
    uint64_t begin, end;   // byte offsets relative to the data start (end - begin == numel * size)
} sl_st_tensor;

typedef struct {
    char *path;
    int fd;
    uint64_t file_size;
    uint64_t data_start;   // 8 + N
    int n_tensors;
    sl_st_tensor *tensors; // in header order
    int n_meta;
    char **meta_keys, **meta_values;
} sl_st_file;

// Opens and validates a file. On failure *f is left closed (safe to sl_st_close).
int sl_st_open(sl_st_file *f, const char *path);
void sl_st_close(sl_st_file *f);

// Index of the tensor with this name, or -1.
int sl_st_find(const sl_st_file *f, const char *name);
// Metadata value for key, or NULL.
const char *sl_st_metadata(const sl_st_file *f, const char *key);

const char *sl_st_dtype_name(sl_st_dtype dt);
size_t sl_st_dtype_size(sl_st_dtype dt);
int sl_st_dtype_is_float(sl_st_dtype dt);   // F32, F16, BF16, F64: readable as float32

// Reads elements [first, first + count) of tensor idx (row-major) converted to float32.
int sl_st_read_f32_range(const sl_st_file *f, int idx, size_t first, size_t count, float *out);
// Reads the whole tensor; `capacity` is the size of out in floats and must be >= numel.
int sl_st_read_f32(const sl_st_file *f, int idx, float *out, size_t capacity);

// Copies tensor idx's bytes as stored (any dtype, little-endian) into out, which holds cap bytes.
int sl_st_read_raw(const sl_st_file *f, int idx, void *out, size_t cap);

// Writes `shape` as "[a, b]" into buf (for error messages); returns buf.
char *sl_st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);

// ---- writer ----
typedef struct {
    const char *name;
    int ndim;                         // 0..SL_ST_MAX_DIMS (0 is a scalar)
    int64_t shape[SL_ST_MAX_DIMS];
} sl_st_desc;

typedef struct sl_st_writer sl_st_writer;

// Creates path.tmp.<pid> and writes the header for tensors desc[0..n) (data in that order).
// meta_keys/meta_values may be NULL when n_meta == 0.
int sl_st_writer_open(sl_st_writer **w, const char *path, int n, const sl_st_desc *desc, int n_meta,
                      const char *const *meta_keys, const char *const *meta_values);
// The same with each tensor's dtype (dtypes[i] for desc[i]; NULL: all F32); tensors of other dtypes
// than F32 are written with sl_st_writer_write_raw.
int sl_st_writer_open_dtypes(sl_st_writer **w, const char *path, int n, const sl_st_desc *desc,
                             const sl_st_dtype *dtypes, int n_meta, const char *const *meta_keys,
                             const char *const *meta_values);
// Appends `count` floats of tensor data (tensors concatenated in desc order; any chunking).
int sl_st_writer_write(sl_st_writer *w, const float *data, size_t count);
// Appends `bytes` raw bytes of tensor data (for tensors of any dtype).
int sl_st_writer_write_raw(sl_st_writer *w, const void *data, size_t bytes);
// Checks that exactly the declared bytes were written, fsyncs, renames into place, fsyncs the
// directory, and frees w (also on failure, removing the temporary file).
int sl_st_writer_finish(sl_st_writer *w);
// Removes the temporary file and frees w. Safe with NULL.
void sl_st_writer_abort(sl_st_writer *w);

// Convenience: writes n whole tensors from memory.
int sl_st_write_f32(const char *path, int n, const sl_st_desc *desc, const float *const *data, int n_meta,
                    const char *const *meta_keys, const char *const *meta_values);

#endif
