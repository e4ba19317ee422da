// quant_config.c: BitsAndBytesConfig's words <-> sl_quant_config (see quant_config.h).
#include "shardlm/quant_config.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"

#include <stdio.h>
#include <string.h>

void sl_quant_config_default(sl_quant_config *qc) {
    qc->type = SL_QUANT_NONE;
    qc->blocksize = 64;
    qc->double_quant = 0;
    qc->compute_dtype = SL_QDT_F32;
}

static const char *const known_keys[] = {
    "quant_method", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
    "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage", "llm_int8_threshold", "llm_int8_skip_modules",
    "llm_int8_has_fp16_weight", "llm_int8_enable_fp32_cpu_offload", "_load_in_4bit", "_load_in_8bit", NULL};

// A key that must keep its default value when present.
static int require_default_bool(const cJSON *o, const char *key, const char *why, const char *w) {
    int v = 0;
    if (sl_json_get_bool(o, key, &v, w)) return -1;
    return v ? sl_errorf("%s: \"%s\": true is not supported (%s)", w, key, why) : 0;
}

int sl_quant_config_parse(const cJSON *o, sl_quant_config *qc, const char *w) {
    sl_quant_config_default(qc);
    if (!o || cJSON_IsNull(o)) return 0;
    if (!cJSON_IsObject(o)) return sl_errorf("%s: expected a JSON object (transformers' BitsAndBytesConfig)", w);
    char unknown[256];
    if (sl_json_unknown_keys(o, known_keys, unknown, sizeof unknown))
        return sl_errorf("%s: unknown key(s) %s (expected BitsAndBytesConfig's: load_in_4bit, load_in_8bit, "
                         "bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_compute_dtype, ...)", w, unknown);
    char method[32] = "bitsandbytes", qtype[16] = "fp4", cdt[16] = "float32", storage[16] = "uint8";
    int in4 = 0, in8 = 0;
    if (sl_json_get_string(o, "quant_method", method, sizeof method, w) ||
        sl_json_get_bool(o, "load_in_4bit", &in4, w) || sl_json_get_bool(o, "load_in_8bit", &in8, w) ||
        sl_json_get_string(o, "bnb_4bit_quant_type", qtype, sizeof qtype, w) ||
        sl_json_get_bool(o, "bnb_4bit_use_double_quant", &qc->double_quant, w) ||
        sl_json_get_string(o, "bnb_4bit_compute_dtype", cdt, sizeof cdt, w) ||
        sl_json_get_string(o, "bnb_4bit_quant_storage", storage, sizeof storage, w))
        return -1;
    if (strcmp(method, "bitsandbytes"))
        return sl_errorf("%s: quant_method \"%s\" is not supported (expected \"bitsandbytes\")", w, method);
    if (in4 && in8) return sl_errorf("%s: load_in_4bit and load_in_8bit are both true (choose one)", w);
    if (strcmp(storage, "uint8"))
        return sl_errorf("%s: bnb_4bit_quant_storage \"%s\" is not supported (expected \"uint8\")", w, storage);
    if (sl_quant_dtype_parse(cdt, &qc->compute_dtype))
        return sl_error_context("%s: bnb_4bit_compute_dtype", w);
    if (qc->compute_dtype == SL_QDT_F16)
        return sl_errorf("%s: bnb_4bit_compute_dtype \"%s\": the CPU multiplies dequantised weights in float32 or "
                         "bfloat16 (expected \"float32\" or \"bfloat16\")", w, cdt);
    if (require_default_bool(o, "llm_int8_has_fp16_weight", "shardlm keeps only the int8 weight", w) ||
        require_default_bool(o, "llm_int8_enable_fp32_cpu_offload", "shardlm quantises every linear", w))
        return -1;
    const cJSON *skip = cJSON_GetObjectItemCaseSensitive(o, "llm_int8_skip_modules");
    if (skip && !cJSON_IsNull(skip) && !(cJSON_IsArray(skip) && cJSON_GetArraySize(skip) == 0))
        return sl_errorf("%s: llm_int8_skip_modules: a module list is not supported (null or [] expected; the LM "
                         "head is always kept in full precision)", w);
    if (!in4 && !in8) return sl_errorf("%s: neither load_in_4bit nor load_in_8bit is true (nothing to quantise)", w);
    if (in8) qc->type = SL_QUANT_INT8;
    else if (in4) {
        if (strcmp(qtype, "nf4") == 0) qc->type = SL_QUANT_NF4;
        else if (strcmp(qtype, "fp4") == 0) qc->type = SL_QUANT_FP4;
        else return sl_errorf("%s: bnb_4bit_quant_type \"%s\" is unknown (expected \"nf4\" or \"fp4\")", w, qtype);
    }
    if (qc->type != SL_QUANT_NF4 && qc->type != SL_QUANT_FP4) qc->double_quant = 0;
    return 0;
}

int sl_quant_config_from_flag(const char *value, sl_quant_config *qc) {
    sl_quant_config_default(qc);
    if (sl_quant_parse(value, &qc->type)) return sl_error_context("--quantize");
    qc->double_quant = qc->type == SL_QUANT_NF4;   // QLoRA's recipe: NF4 with double-quantised scales
    return 0;
}

cJSON *sl_quant_config_to_json(const sl_quant_config *qc) {
    int four = qc->type == SL_QUANT_NF4 || qc->type == SL_QUANT_FP4, eight = qc->type == SL_QUANT_INT8;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddBoolToObject(o, "_load_in_4bit", four);
    cJSON_AddBoolToObject(o, "_load_in_8bit", eight);
    cJSON_AddStringToObject(o, "bnb_4bit_compute_dtype", sl_quant_dtype_name(qc->compute_dtype));
    cJSON_AddStringToObject(o, "bnb_4bit_quant_storage", "uint8");
    cJSON_AddStringToObject(o, "bnb_4bit_quant_type", qc->type == SL_QUANT_NF4 ? "nf4" : "fp4");
    cJSON_AddBoolToObject(o, "bnb_4bit_use_double_quant", four && qc->double_quant);
    cJSON_AddBoolToObject(o, "llm_int8_enable_fp32_cpu_offload", 0);
    cJSON_AddBoolToObject(o, "llm_int8_has_fp16_weight", 0);
    cJSON_AddNullToObject(o, "llm_int8_skip_modules");
    cJSON_AddRawToObject(o, "llm_int8_threshold", "6.0");   // transformers wants a float, cJSON would print 6
    cJSON_AddBoolToObject(o, "load_in_4bit", four);
    cJSON_AddBoolToObject(o, "load_in_8bit", eight);
    cJSON_AddStringToObject(o, "quant_method", "bitsandbytes");
    return o;
}

const char *sl_quant_config_describe(const sl_quant_config *qc, char *buf, size_t cap) {
    if (qc->type == SL_QUANT_INT8)
        snprintf(buf, cap, "int8 (LLM.int8() rows, SCB scales)");
    else if (qc->type == SL_QUANT_NONE)
        snprintf(buf, cap, "none");
    else
        snprintf(buf, cap, "%s (blocks of %d, %s scales)", sl_quant_name(qc->type), qc->blocksize,
                 qc->double_quant ? "double-quantised" : "fp32");
    return buf;
}
