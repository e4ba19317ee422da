// cuda_dlopen.c: the search order for CUDA's shared libraries (see cuda_dlopen.h).
#include "shardlm/settings.h"
#include "shardlm/cuda_dlopen.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef SHARDLM_CUDA_LIBDIR
#define SHARDLM_CUDA_LIBDIR "/usr/local/cuda/lib64"   // the Makefile's default CUDA_HOME
#endif

void *sl_cuda_dlopen(const char *const *names, char *why, size_t cap) {
    const char *dirs[2] = {SHARDLM_CUDA_LIBDIR, NULL};
    char home[sizeof sl_settings_get()->cuda_home + 8];
    const char *cuda_home = sl_settings_get()->cuda_home;
    if (cuda_home && *cuda_home) {
        snprintf(home, sizeof home, "%s/lib64", cuda_home);
        dirs[1] = home;
    }
    why[0] = '\0';
    for (const char *const *n = names; *n; n++) {
        char path[2048];
        for (int d = 0; d < 2; d++) {
            if (!dirs[d]) continue;
            snprintf(path, sizeof path, "%s/%s", dirs[d], *n);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h) return h;
        }
        void *h = dlopen(*n, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        if (!why[0]) {
            const char *e = dlerror();
            snprintf(why, cap, "%s", e ? e : "not found");
        }
    }
    return NULL;
}

void *sl_cudnn_dlopen(char *why, size_t cap) {
    const char *file = sl_settings_get()->cudnn_library;
    if (file && *file) {
        void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            snprintf(why, cap, "SHARDLM_CUDNN_LIBRARY=%s: %s", file, e ? e : "not loaded");
        }
        return h;
    }
    static const char *const names[] = {"libcudnn.so.9", "libcudnn.so", NULL};
    return sl_cuda_dlopen(names, why, cap);
}
