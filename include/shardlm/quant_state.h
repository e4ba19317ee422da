// quant_state.h: the JSON text bitsandbytes packs into a 4-bit weight's
// `.weight.quant_state.bitsandbytes__<type>` tensor (QuantState.as_dict(packed=True), json.dumps):
//   {"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [64, 64],
//    "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.05495791882276535}
// (the nested_ keys only with double quantisation). Written byte for byte as Python writes it (the
// offset as Python's repr of the float32 value widened to double).
#ifndef SHARDLM_QUANT_STATE_H
#define SHARDLM_QUANT_STATE_H

#include <stddef.h>
#include "shardlm/quant.h"

// The JSON for q (4-bit); malloc'd, NUL-terminated; NULL with an error when out of memory.
char *sl_quant_state_json(const sl_qtensor *q);

// Parses text[0..len) into q's type, blocksize, dtype, rows, cols, nested and offset (nothing else
// is touched). Every key is checked: unknown or missing keys, wrong types, a shape that is not two
// positive integers, a block size bitsandbytes does not make, nested_blocksize other than 256, a
// non-finite offset: -1 with a message naming `where` and the key.
int sl_quant_state_parse(const char *text, size_t len, sl_qtensor *q, const char *where);

// Python's repr() of the double v ("0.1", "1e-05", "120.0") into buf; returns buf.
const char *sl_python_float_repr(char *buf, size_t cap, double v);

#endif
