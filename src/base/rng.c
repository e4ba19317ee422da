// rng.c: the counter-based generator of rng.h. No hidden state: (key, counter) is everything.
#include "shardlm/rng.h"

#include <math.h>

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

sl_rng sl_rng_make(uint64_t seed, uint64_t rank, uint64_t step, uint64_t purpose) {
    uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
    k = mix64(k ^ (rank + 0x632be59bd9b4e019ULL));
    k = mix64(k ^ (step + 0x85157af5ULL));
    k = mix64(k ^ (purpose * 0xd6e8feb86659fd93ULL));
    return (sl_rng){k, 0};
}

uint64_t sl_rng_u64(sl_rng *r) { return mix64(r->key + 0x9e3779b97f4a7c15ULL * ++r->counter); }
uint32_t sl_rng_u32(sl_rng *r) { return (uint32_t)(sl_rng_u64(r) >> 32); }
float sl_rng_uniform(sl_rng *r) { return (float)(sl_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float sl_rng_normal(sl_rng *r) {
    double u1 = ((double)(sl_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
    double u2 = (double)(sl_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t sl_rng_below(sl_rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = sl_rng_u64(r); while (x >= limit);
    return x % n;
}
