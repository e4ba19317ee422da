// quant.h: quantised weights in bitsandbytes' formats, quantised and dequantised on the CPU with
// bitsandbytes 0.50's bits (docs/quantization.md).
//
// Formats (a weight is an (out, in) matrix, nn.Linear's layout, read as one flat row-major array):
//   NF4 / FP4  4-bit codes into a 16-value table (bitsandbytes' NF4 table, or its FP4 table), one
//              fp32 absmax per block of `blocksize` consecutive elements (64 by default, the last block
//              may be short). Two codes per byte: element 2i in the high nibble, 2i+1 in the low one;
//              an odd count pads the last low nibble with the code of 0.0. Quantisation: x * (1/absmax)
//              (x / absmax in a short last block), clamped to [-1, 1], then the nearest table value, a
//              value exactly half-way going to the lower one (torch.bucketize's ties). An all-zero block
//              has absmax 0 and codes of 0.0. Dequantisation: table[code] * absmax, in fp32.
//   double     ("compress_statistics", bnb_4bit_use_double_quant): the fp32 absmax array minus its mean
//   quant      (`offset`) is itself quantised blockwise (256) with the signed 8-bit dynamic map; the
//              block scale is then dynamic[qabsmax[b]] * nested_absmax[b / 256] + offset.
//   int8       LLM.int8()'s weight: per output row, SCB = absmax of the row after rounding the weight to
//              fp16 (bitsandbytes converts it first), CB = round_half_even(w16 * ((1 / SCB) * 127)) as int8;
//              dequantised CB * SCB * (1/127 as fp32). An all-zero row has SCB 0 and CB 0.
// The 8-bit blockwise quantiser reproduces bitsandbytes' CPU kernel, which rounds through a 65536-entry
// table over [-1, 1] (not always the nearest code). The mean behind `offset` is PyTorch's float sum
// (its x86 cascade order, 8 lanes, one thread: exact for fewer than 32768 blocks; above that PyTorch
// splits the sum over its threads and the last bit can depend on their number), divided by the count.
#ifndef SHARDLM_QUANT_H
#define SHARDLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SL_QUANT_NONE = 0, SL_QUANT_NF4, SL_QUANT_FP4, SL_QUANT_INT8 } sl_quant_type;

// The dtype a quantised weight came from (quant_state "dtype"; the compute dtype is separate).
typedef enum { SL_QDT_F32 = 0, SL_QDT_BF16, SL_QDT_F16 } sl_quant_dtype;

#define SL_QUANT_NESTED_BLOCK 256

typedef struct {
    sl_quant_type type;
    sl_quant_dtype dtype;
    int64_t rows, cols;        // (out, in)
    size_t numel;              // rows * cols
    uint8_t *data;             // 4-bit: (numel + 1) / 2 packed bytes; int8: numel bytes (int8 bits)
    // 4-bit
    int blocksize;             // 32, 64 (default), 128, ..., 4096
    size_t n_blocks;           // ceil(numel / blocksize)
    float code[16];            // quant_map
    float *absmax;             // n_blocks fp32 scales (only when !nested)
    int nested;                // double quantisation of the scales
    uint8_t *qabsmax;          // n_blocks 8-bit codes (nested)
    float *nested_absmax;      // ceil(n_blocks / 256) (nested)
    float nested_code[256];    // the dynamic map (nested_quant_map)
    float offset;              // nested_offset
    // int8
    float *scb;                // rows
} sl_qtensor;

// "nf4", "fp4", "int8" (and "none"); sl_quant_parse returns -1 with a message naming the choices.
const char *sl_quant_name(sl_quant_type t);
int sl_quant_parse(const char *s, sl_quant_type *out);
const char *sl_quant_dtype_name(sl_quant_dtype d);  // "float32", "bfloat16", "float16" (torch's names)
int sl_quant_dtype_parse(const char *s, sl_quant_dtype *out);

// bitsandbytes' tables: get_4bit_type("nf4" / "fp4") and create_dynamic_map() (signed, 8 bits).
void sl_quant_4bit_code(sl_quant_type t, float code[16]);
void sl_quant_dynamic_map(float code[256]);

// Quantises w (rows x cols, values already exact in `dtype`, given as fp32) into q (allocated here).
// 4-bit: numel must be a multiple of blocksize unless allow_partial (bitsandbytes itself accepts a
// short last block; model weights are refused so that every block is whole). On failure q is empty.
int sl_quantize_4bit(sl_qtensor *q, const float *w, int64_t rows, int64_t cols, sl_quant_type type, int blocksize,
                     int double_quant, sl_quant_dtype dtype, int allow_partial);
int sl_quantize_int8(sl_qtensor *q, const float *w, int64_t rows, int64_t cols, sl_quant_dtype dtype);
void sl_qtensor_free(sl_qtensor *q);
// Bytes held by the quantised form (codes + scales): 4-bit ceil(n/2) + 4 per block (double-quantised:
// 1 per block + 4 per 256 blocks); int8 n + 4 per row. The 16- and 256-entry tables are not counted.
size_t sl_qtensor_bytes(const sl_qtensor *q);
// The same from the shape and settings, before anything is quantised (memory_estimate.h).
size_t sl_qtensor_bytes_for(sl_quant_type type, int64_t rows, int64_t cols, int blocksize, int nested);
// Checks that the sizes and arrays of q agree (after loading from a file); -1 with a message naming `what`.
int sl_qtensor_validate(const sl_qtensor *q, const char *what);

// Dequantises elements [first, first + count) of the flat weight into out (fp32), exactly as
// bitsandbytes' dequantize_4bit / int8_vectorwise_dequant. Works on any range (a tile of rows).
void sl_dequantize_range(const sl_qtensor *q, size_t first, size_t count, float *out);

// The scale of 4-bit block b (absmax[b], or its double-quantised reconstruction).
float sl_quant_block_scale(const sl_qtensor *q, size_t b);

// bitsandbytes' 8-bit blockwise quantisation with a sorted 256-value code (its CPU kernel's rounding):
// absmax[ceil(n / blocksize)], out[n]. -1 only when its 64 KiB rounding table cannot be allocated.
int sl_quantize_blockwise8(const float code[256], const float *a, size_t n, int blocksize, float *absmax,
                            uint8_t *out);
void sl_dequantize_blockwise8(const float code[256], const uint8_t *a, const float *absmax, size_t n, int blocksize,
                              float *out);

// PyTorch's float32 `x.mean()` on the CPU for a 1-D contiguous tensor (see the note above).
float sl_quant_torch_mean(const float *x, size_t n);

#endif
