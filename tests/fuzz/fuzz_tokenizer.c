// fuzz_tokenizer.c: vocab.json and merges.txt. The input is the two files joined by one NUL byte;
// a tokenizer that loads also encodes and decodes a short text.
#include "fuzz_common.h"
#include "shardlm/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t vsize = nul ? (size_t)(nul - data) : size;
    char vocab[128], merges[128];
    fuzz_write("vocab.json", data, vsize, vocab, sizeof vocab);
    fuzz_write("merges.txt", nul ? nul + 1 : data, nul ? size - vsize - 1 : 0, merges, sizeof merges);
    sl_tokenizer *tok = NULL;
    if (sl_tokenizer_load(&tok, vocab, merges) == 0) {
        static const char text[] = "Hello world, it's 2026!\n<|endoftext|> caf\xc3\xa9";
        int32_t *ids = NULL;
        size_t n = 0;
        if (sl_tokenizer_encode(tok, text, sizeof text - 1, &ids, &n) == 0) {
            char *back = NULL;
            size_t len = 0;
            (void)sl_tokenizer_decode(tok, ids, n, &back, &len);
            free(back);
        }
        free(ids);
        sl_tokenizer_free(tok);
    }
    return 0;
}
