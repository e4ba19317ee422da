// fuzz_quant_state.c: bitsandbytes' packed quant_state JSON (quant_state.c) and the BitsAndBytesConfig
// words (quant_config.c): any bytes give a state / config or one error, and a state that was read
// writes and reads back the same.
#include "fuzz_common.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"
#include "shardlm/quant_config.h"
#include "shardlm/quant_state.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    sl_qtensor q = {0}, back = {0};
    if (sl_quant_state_parse(text, size, &q, "quant_state") == 0) {
        char *js = sl_quant_state_json(&q);
        if (!js || sl_quant_state_parse(js, strlen(js), &back, "written") || back.type != q.type ||
            back.rows != q.rows || back.cols != q.cols || back.blocksize != q.blocksize || back.nested != q.nested ||
            back.dtype != q.dtype || (q.nested && memcmp(&back.offset, &q.offset, sizeof q.offset))) {
            fprintf(stderr, "written quant_state does not read back: %s\n", js ? js : sl_error());
            abort();
        }
        free(js);
    }
    cJSON *o = sl_json_parse_strict(text, size, "config");
    sl_quant_config qc;
    if (o) sl_quant_config_parse(o, &qc, "quantization_config");
    cJSON_Delete(o);
    free(text);
    return 0;
}
