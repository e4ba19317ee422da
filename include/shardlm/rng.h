// rng.h: counter-based randomness. Every random stream is a pure function of
// (seed, rank, step, purpose) plus a position counter, so a resumed run, or a run on another
// world size where the maths allows, draws exactly the same numbers. The mixer is SplitMix64's
// finaliser applied to a hash of the key and the counter (stateless; saving the counter is enough).
#ifndef SHARDLM_RNG_H
#define SHARDLM_RNG_H

#include <stdint.h>

enum { SL_RNG_INIT = 1, SL_RNG_DATA = 2, SL_RNG_SAMPLE = 3, SL_RNG_DROPOUT = 4, SL_RNG_TEST = 5 };

typedef struct {
    uint64_t key;      // hash of (seed, rank, step, purpose)
    uint64_t counter;  // how many values have been drawn
} sl_rng;

sl_rng sl_rng_make(uint64_t seed, uint64_t rank, uint64_t step, uint64_t purpose);
uint64_t sl_rng_u64(sl_rng *r);
uint32_t sl_rng_u32(sl_rng *r);
float sl_rng_uniform(sl_rng *r);            // [0, 1), 24 random bits
float sl_rng_normal(sl_rng *r);             // standard normal (Box-Muller, one value per call)
uint64_t sl_rng_below(sl_rng *r, uint64_t n);  // uniform in [0, n), unbiased

#endif
