// fuzz_tokenizer_json.c: Hugging Face tokenizer.json. The input is the file, optionally followed by one
// NUL byte and a text to encode (else a fixed one with added tokens in it); a tokenizer that loads
// also encodes (with and without its template) and decodes.
#include "fuzz_common.h"
#include "shardlm/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t jsize = nul ? (size_t)(nul - data) : size;
    char path[128];
    fuzz_write("tokenizer.json", data, jsize, path, sizeof path);
    static const char fixed[] = "Hello  world, it's 2026!\n<s>caf\xc3\xa9</s> \xe4\xb8\xad <|endoftext|>\xf0\x9f\x98\x80";
    const char *text = nul ? (const char *)nul + 1 : fixed;
    size_t len = nul ? size - jsize - 1 : sizeof fixed - 1;
    sl_tokenizer *tok = NULL;
    if (sl_tokenizer_load_json(&tok, path, NULL) == 0) {
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            size_t n = 0;
            int rc = special ? sl_tokenizer_encode_special(tok, text, len, &ids, &n)
                             : sl_tokenizer_encode(tok, text, len, &ids, &n);
            if (rc == 0) {
                char *back = NULL;
                size_t blen = 0;
                (void)sl_tokenizer_decode(tok, ids, n, &back, &blen);
                free(back);
            }
            free(ids);
        }
        sl_tokenizer_free(tok);
    }
    return 0;
}
