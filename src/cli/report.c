// report.c: `shardlm report`: what this build and machine have, as DeepSpeed's ds_report prints it:
// compiler and build flags, OpenBLAS / OpenMP / MPI / cJSON / PCRE2 versions, the comm and ops
// backends built in, CUDA driver / runtime / cuBLASLt / NCCL and each GPU (probed with dlopen, so
// the report works on machines without CUDA), and the launch environment. Every probe that cannot answer prints
// "not available: <reason>"; the command itself never fails (exit 0; 2 only for a bad flag).
#include "cli/commands.h"
#include "shardlm/cpu_features.h"
#include "shardlm/comm.h"
#include "shardlm/cuda_dlopen.h"
#include "shardlm/error.h"
#include "shardlm/settings.h"
#include "shardlm/launch_env.h"
#include "shardlm/ops.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <dnnl.h>
#include <cblas.h>
#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <mpi.h>
#include <omp.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define KEY_WIDTH 22

static void usage(FILE *f) {
    fprintf(f,
        "usage: shardlm report\n\n"
        "Prints what this build and machine have (like DeepSpeed's ds_report): compiler and build\n"
        "flags, OpenBLAS, OpenMP, MPI, cJSON and PCRE2 versions, the comm and ops backends built in,\n"
        "the CUDA driver, runtime, NCCL and GPUs (when present), and the detected launch environment.\n"
        "Anything missing is reported as \"not available: <reason>\"; the command always exits 0.\n");
}

static void section(const char *title) { printf("\n%s\n", title); }

// One row: key padded to KEY_WIDTH, then the value; a multi-line value continues under the value.
static void row(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void row(const char *key, const char *fmt, ...) {
    char value[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    size_t n = strlen(value);
    while (n && (value[n - 1] == '\n' || value[n - 1] == ' ' || value[n - 1] == '\r')) value[--n] = '\0';
    const char *v = value;
    while (*v == ' ') v++;
    printf("  %-*s ", KEY_WIDTH, key);
    for (const char *p = v; *p; p++) {
        putchar(*p);
        if (*p == '\n') printf("  %-*s ", KEY_WIDTH, "");
    }
    putchar('\n');
}

// ---- build -------------------------------------------------------------------------------------------

static void report_build(void) {
    section("build");
#if defined(__clang__)
    row("compiler", "clang %s", __VERSION__);
#elif defined(__GNUC__)
    row("compiler", "gcc %s", __VERSION__);
#else
    row("compiler", "%s", __VERSION__);
#endif
    const char *std = __STDC_VERSION__ >= 202311L ? "C23" : __STDC_VERSION__ >= 201710L ? "C17"
                    : __STDC_VERSION__ >= 201112L ? "C11" : "C99 or older";
    row("C standard", "%s (__STDC_VERSION__ %ldL)", std, (long)__STDC_VERSION__);
#ifdef __OPTIMIZE__
    row("optimization", "on (__OPTIMIZE__)");
#else
    row("optimization", "off (-O0)");
#endif
    char simd[256] = "";
#ifdef __SSE4_2__
    strcat(simd, " SSE4.2");
#endif
#ifdef __AVX__
    strcat(simd, " AVX");
#endif
#ifdef __AVX2__
    strcat(simd, " AVX2");
#endif
#ifdef __FMA__
    strcat(simd, " FMA");
#endif
#ifdef __AVX512F__
    strcat(simd, " AVX-512F");
#endif
#ifdef __ARM_NEON
    strcat(simd, " NEON");
#endif
    row("SIMD (compile time)", "%s", simd[0] ? simd + 1 : "baseline only");
    // GCC defines a macro for ASan and TSan only; UBSan is recognised by its runtime being loaded.
    char san[128] = "";
#if defined(__SANITIZE_ADDRESS__)
    strcat(san, " address");
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    strcat(san, " address");
#endif
#endif
#if defined(__SANITIZE_THREAD__)
    strcat(san, " thread");
#endif
    if (dlsym(RTLD_DEFAULT, "__ubsan_handle_add_overflow")) strcat(san, " undefined");
    row("sanitizers", "%s", san[0] ? san + 1 : "none");
#ifdef NDEBUG
    row("assert()", "off (NDEBUG)");
#else
    row("assert()", "on");
#endif
#ifdef _OPENMP
    row("OpenMP (compile time)", "%d", (int)_OPENMP);
#else
    row("OpenMP (compile time)", "not enabled");
#endif
}

// ---- libraries ---------------------------------------------------------------------------------------

static void report_libraries(void) {
    section("libraries");
#ifdef OPENBLAS_VERSION
    row("OpenBLAS (header)", "%s", OPENBLAS_VERSION);
#endif
    const char *cfg = openblas_get_config();
    row("OpenBLAS config", "%s", cfg ? cfg : "not available: openblas_get_config returned NULL");
    const char *core = openblas_get_corename();
    row("OpenBLAS core", "%s", core ? core : "unknown");
    row("OpenBLAS threads", "%d (of %d processors)", openblas_get_num_threads(), openblas_get_num_procs());
    row("OpenMP max threads", "%d (%d processors)", omp_get_max_threads(), omp_get_num_procs());
    const dnnl_version_t *dnnl = dnnl_version();
    row("oneDNN", "%d.%d.%d (cpu runtime %s)", dnnl->major, dnnl->minor, dnnl->patch,
        dnnl->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
    const sl_cpu_features *f = sl_cpu_features_get();
    char isa[256];
    sl_cpu_features_describe(isa, sizeof isa);
    row("CPU", "%s family %d model %d: %s", f->vendor[0] ? f->vendor : "?", f->family, f->model, isa);
    row("CPU GEMM (fp32)", "%s", sl_cpu_gemm_description());
    double r_blas, r_dnnl;
    sl_cpu_gemm_measure(&r_blas, &r_dnnl);
    row("CPU GEMM measured", "OpenBLAS %.0f GFLOP/s, oneDNN sgemm %.0f GFLOP/s (%d threads, a 512-row "
        "768 -> 2304 linear layer's forward, input and weight gradients)", r_blas, r_dnnl, omp_get_max_threads());

    // Both may be called before MPI_Init.
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    if (MPI_Get_library_version(lib, &len) == MPI_SUCCESS) {
        lib[len > 0 && len < (int)sizeof lib ? len : (int)sizeof lib - 1] = '\0';
        row("MPI library", "%s", lib);
    } else {
        row("MPI library", "not available: MPI_Get_library_version failed");
    }
    int major = 0, minor = 0;
    if (MPI_Get_version(&major, &minor) == MPI_SUCCESS) row("MPI standard", "%d.%d", major, minor);
    else row("MPI standard", "not available: MPI_Get_version failed");

    row("cJSON", "%s", cJSON_Version());
    char pcre[64] = "";
    if (pcre2_config(PCRE2_CONFIG_VERSION, pcre) > 0) row("PCRE2", "%s", pcre);
    else row("PCRE2", "not available: pcre2_config failed");
}

// ---- CUDA / NCCL (dlopen'ed) -------------------------------------------------------------------------

// The file a loaded symbol came from ("" when unknown).
static const char *lib_path(void *sym) {
    Dl_info info;
    if (sym && dladdr(sym, &info) && info.dli_fname) return info.dli_fname;
    return "";
}

typedef int (*fn_int_p)(int *);

// The CUDA driver API (libcuda.so.1): plain ints and strings, so no CUDA header is needed.
static void report_driver(void) {
    static const char *const names[] = {"libcuda.so.1", "libcuda.so", NULL};
    char why[1024];
    void *h = sl_cuda_dlopen(names, why, sizeof why);
    if (!h) {
        row("CUDA driver", "not available: no CUDA driver (libcuda.so.1 not found)");
        row("GPUs", "not available: no CUDA driver");
        return;
    }
    int (*cuInit)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    fn_int_p cuDriverGetVersion = (fn_int_p)dlsym(h, "cuDriverGetVersion");
    fn_int_p cuDeviceGetCount = (fn_int_p)dlsym(h, "cuDeviceGetCount");
    int (*cuDeviceGet)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
    int (*cuDeviceGetName)(char *, int, int) = (int (*)(char *, int, int))dlsym(h, "cuDeviceGetName");
    int (*cuDeviceGetAttribute)(int *, int, int) = (int (*)(int *, int, int))dlsym(h, "cuDeviceGetAttribute");
    int (*cuDeviceTotalMem)(size_t *, int) = (int (*)(size_t *, int))dlsym(h, "cuDeviceTotalMem_v2");
    int (*cuGetErrorString)(int, const char **) = (int (*)(int, const char **))dlsym(h, "cuGetErrorString");
    if (!cuInit || !cuDriverGetVersion || !cuDeviceGetCount || !cuDeviceGet || !cuDeviceGetName ||
        !cuDeviceGetAttribute || !cuDeviceTotalMem) {
        row("CUDA driver", "not available: %s lacks a driver API symbol (too old?)", lib_path((void *)cuInit));
        return;
    }
    int v = 0;
    if (cuDriverGetVersion(&v) == 0)
        row("CUDA driver", "%d.%d (supports CUDA up to this version; %s)", v / 1000, (v % 1000) / 10,
            lib_path((void *)cuInit));
    else
        row("CUDA driver", "not available: cuDriverGetVersion failed");
    int rc = cuInit(0);
    if (rc != 0) {
        const char *msg = NULL;
        if (cuGetErrorString) cuGetErrorString(rc, &msg);
        row("GPUs", "not available: cuInit failed: %s (CUresult %d)", msg ? msg : "unknown error", rc);
        return;
    }
    int count = 0;
    if (cuDeviceGetCount(&count) != 0) { row("GPUs", "not available: cuDeviceGetCount failed"); return; }
    row("GPUs", "%d", count);
    for (int i = 0; i < count; i++) {
        char key[32], name[256] = "?";
        int dev = 0, cc_major = 0, cc_minor = 0, sms = 0;
        size_t mem = 0;
        snprintf(key, sizeof key, "GPU %d", i);
        if (cuDeviceGet(&dev, i) != 0) { row(key, "not available: cuDeviceGet failed"); continue; }
        cuDeviceGetName(name, (int)sizeof name, dev);
        cuDeviceGetAttribute(&cc_major, 75, dev);   // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        cuDeviceGetAttribute(&cc_minor, 76, dev);   // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
        cuDeviceGetAttribute(&sms, 16, dev);        // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        cuDeviceTotalMem(&mem, dev);
        row(key, "%s, compute capability %d.%d, %d SMs, %.1f GiB", name, cc_major, cc_minor, sms,
            (double)mem / (1024.0 * 1024.0 * 1024.0));
    }
}

static void report_runtime(void) {
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                        NULL};
    char why[1024];
    void *h = sl_cuda_dlopen(names, why, sizeof why);
    if (!h) { row("CUDA runtime", "not available: libcudart not found (%s)", why); return; }
    fn_int_p get = (fn_int_p)dlsym(h, "cudaRuntimeGetVersion");
    int v = 0;
    if (!get || get(&v) != 0) { row("CUDA runtime", "not available: cudaRuntimeGetVersion failed"); return; }
    row("CUDA runtime", "%d.%d (%s)", v / 1000, (v % 1000) / 10, lib_path((void *)get));
}

static void report_nccl(void) {
    static const char *const names[] = {"libnccl.so.2", "libnccl.so", NULL};
    char why[1024];
    void *h = sl_cuda_dlopen(names, why, sizeof why);
    if (!h) { row("NCCL", "not available: libnccl not found (%s)", why); return; }
    fn_int_p get = (fn_int_p)dlsym(h, "ncclGetVersion");
    int v = 0;
    if (!get || get(&v) != 0) { row("NCCL", "not available: ncclGetVersion failed"); return; }
    // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before.
    int major = v >= 10000 ? v / 10000 : v / 1000;
    int rest = v >= 10000 ? v % 10000 : v % 1000;
    row("NCCL", "%d.%d.%d (%s)", major, rest / 100, rest % 100, lib_path((void *)get));
}

// cuBLASLt, which the CUDA ops backend dlopens for its GEMMs (the same names it tries).
static void report_cublaslt(void) {
    static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so", NULL};
    char why[1024];
    void *h = sl_cuda_dlopen(names, why, sizeof why);
    if (!h) { row("cuBLASLt", "not available: libcublasLt not found (%s)", why); return; }
    size_t (*get)(void) = (size_t (*)(void))dlsym(h, "cublasLtGetVersion");
    if (!get) { row("cuBLASLt", "not available: cublasLtGetVersion not found"); return; }
    size_t v = get();  // major*10000 + minor*100 + patch
    row("cuBLASLt", "%zu.%zu.%zu (%s)", v / 10000, v / 100 % 100, v % 100, lib_path((void *)get));
}

// cuDNN, which the CUDA attention dlopens (SHARDLM_ATTENTION=cudnn / auto): the file it would load.
static void report_cudnn(void) {
    char why[1280];
    void *h = sl_cudnn_dlopen(why, sizeof why);
    if (!h) { row("cuDNN", "not available: %s", why); return; }
    size_t (*get)(void) = (size_t (*)(void))dlsym(h, "cudnnGetVersion");
    if (!get) { row("cuDNN", "not available: cudnnGetVersion not found"); return; }
    size_t v = get();  // major*10000 + minor*100 + patch (cuDNN 9)
    row("cuDNN", "%zu.%zu.%zu (%s)", v / 10000, v / 100 % 100, v % 100, lib_path((void *)get));
}

static void report_cuda(void) {
    section("CUDA / GPUs");
    report_driver();
    report_runtime();
    report_cublaslt();
    report_cudnn();
    report_nccl();
}

// ---- backends ----------------------------------------------------------------------------------------

static void report_backends(void) {
    section("backends");
    row("comm self", "built in");
    row("comm mpi", "built in");
    if (sl_comm_nccl_built())
        row("comm nccl", "built in (libnccl / libcudart loaded at run time; see CUDA / GPUs below)");
    else
        row("comm nccl", "not built (no CUDA nccl.h / libnccl at build time, or NCCL=0)");
    row("ops cpu", "built in (%d threads)", sl_ops_cpu_threads());
#ifndef SHARDLM_CUDA_ARCH_DESC
#define SHARDLM_CUDA_ARCH_DESC "see CUDA_GENCODE"
#endif
    if (sl_ops_cuda_built())
        row("ops cuda", "built in (%s; cuBLASLt loaded at run time; fp32 and bf16 activation storage)",
            SHARDLM_CUDA_ARCH_DESC);
    else
        row("ops cuda", "not built (no nvcc at build time, or CUDA=0)");
}

// ---- launch environment ------------------------------------------------------------------------------

static void report_launch(void) {
    section("launch environment");
    sl_launch_env env;
    if (sl_launch_env_detect(&env)) {
        // A malformed launcher variable: name it and keep the report going.
        row("launcher", "not available: %s", sl_error());
        return;
    }
    row("launcher", "%s", sl_launcher_name(env.launcher));
    row("rank / world size", "%d / %d", env.rank, env.world_size);
    row("local rank / size", "%d / %d", env.local_rank, env.local_world_size);
    row("node rank", "%d", env.node_rank);
    row("master", "%s:%d", env.master_addr, env.master_port);
}

// ---- environment: the switches of settings.h ---------------------------------------------------------

static void report_settings(void) {
    section("environment (settings.h; docs/cli.md)");
    if (sl_settings_load()) row("malformed", "%s (its default is used)", sl_error());
    const char *name, *value, *meaning;
    for (int i = 0; sl_settings_row(i, &name, &value, &meaning) == 0; i++)
        row(name, "%s\n%s", value ? value : "(unset)", meaning);
}

int cmd_report(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        fprintf(stderr, "error: unknown flag '%s' (see shardlm report --help)\n", argv[i]);
        return 2;
    }
    printf("shardlm report\n");
    report_build();
    report_libraries();
    report_backends();
    report_launch();
    report_settings();
    report_cuda();
    fflush(stdout);
    return 0;
}
