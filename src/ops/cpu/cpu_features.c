// cpu_features.c: instruction-set detection for the CPU backend (cpu_features.h): cpuid leaves 1 and 7
// for what the CPU has, xgetbv for what the OS saves on a context switch (AVX, AVX-512 and AMX state
// must all be enabled for their instructions to be usable).
#include "shardlm/cpu_features.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void detect(sl_cpu_features *f) {
    unsigned int a = 0, b = 0, c = 0, d = 0, max = 0;
    if (!__get_cpuid(0, &max, &b, &c, &d)) return;
    memcpy(f->vendor, &b, 4);
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
    f->vendor[12] = '\0';
    __get_cpuid(1, &a, &b, &c, &d);
    int family = (a >> 8) & 0xf, model = (a >> 4) & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    if (family == 0x6 || family >= 0xf) model |= ((a >> 16) & 0xf) << 4;
    f->family = family;
    f->model = model;
    int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1;
    unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    int os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    int os_amx = (xcr0 & 0x60000) == 0x60000;
    if (max < 7) return;
    unsigned int b7, c7, d7, a7_1 = 0, tmp;
    __cpuid_count(7, 0, a, b7, c7, d7);
    __cpuid_count(7, 1, a7_1, tmp, tmp, tmp);
    (void)a;
    f->avx2 = os_avx && ((b7 >> 5) & 1);
    f->fma = os_avx && fma;
    f->avx512f = os_avx512 && ((b7 >> 16) & 1);
    f->avx512bw = f->avx512f && ((b7 >> 30) & 1);
    f->avx512vl = f->avx512f && ((b7 >> 31) & 1);
    f->avx512_vnni = f->avx512f && ((c7 >> 11) & 1);
    f->avx512_bf16 = f->avx512f && ((a7_1 >> 5) & 1);
    f->avx512_fp16 = f->avx512f && ((d7 >> 23) & 1);
    f->amx_bf16 = os_amx && ((d7 >> 22) & 1) && ((d7 >> 24) & 1);
    f->amx_int8 = os_amx && ((d7 >> 25) & 1) && ((d7 >> 24) & 1);
}
#else
static void detect(sl_cpu_features *f) { (void)f; }
#endif

static sl_cpu_features features;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void detect_once(void) { detect(&features); }

const sl_cpu_features *sl_cpu_features_get(void) {
    pthread_once(&once, detect_once);
    return &features;
}

const char *sl_cpu_missing_build_isa(void) {
    static char missing[160];
    const sl_cpu_features *f = sl_cpu_features_get();
    size_t used = 0;
#define NEED(flag, name) \
    if (!(flag) && used < sizeof missing) used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%s", used ? " " : "", name);
    (void)f;
#ifdef __AVX2__
    NEED(f->avx2, "avx2")
#endif
#ifdef __FMA__
    NEED(f->fma, "fma")
#endif
#ifdef __AVX512F__
    NEED(f->avx512f, "avx512f")
#endif
#ifdef __AVX512BW__
    NEED(f->avx512bw, "avx512bw")
#endif
#ifdef __AVX512VL__
    NEED(f->avx512vl, "avx512vl")
#endif
#ifdef __AVX512VNNI__
    NEED(f->avx512_vnni, "avx512_vnni")
#endif
#ifdef __AVX512BF16__
    NEED(f->avx512_bf16, "avx512_bf16")
#endif
#ifdef __AVX512FP16__
    NEED(f->avx512_fp16, "avx512_fp16")
#endif
#undef NEED
    missing[used < sizeof missing ? used : sizeof missing - 1] = '\0';
    return missing;
}

void sl_cpu_features_describe(char *buf, size_t cap) {
    const sl_cpu_features *f = sl_cpu_features_get();
    const struct {
        int on;
        const char *name;
    } flags[] = {{f->avx2, "avx2"},         {f->fma, "fma"},
                 {f->avx512f, "avx512f"},   {f->avx512bw, "avx512bw"},
                 {f->avx512vl, "avx512vl"}, {f->avx512_vnni, "avx512_vnni"},
                 {f->avx512_bf16, "avx512_bf16"}, {f->avx512_fp16, "avx512_fp16"},
                 {f->amx_bf16, "amx_bf16"}, {f->amx_int8, "amx_int8"}};
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i].on && used < cap) used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? " " : "", flags[i].name);
    if (!used && cap) snprintf(buf, cap, "none");
}
