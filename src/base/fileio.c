// fileio.c: whole-file reads and atomic writes. Nothing already on disk is replaced until the new
// content is complete and fsync'd: we write to a temporary name in the same directory, then rename.
#include "shardlm/fileio.h"
#include "shardlm/error.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *sl_not_a_file(unsigned mode) {
    if (S_ISDIR(mode)) return "is a directory, expected a file";
    if (S_ISREG(mode)) return NULL;
    return S_ISFIFO(mode) ? "is a FIFO, expected a regular file"
           : S_ISCHR(mode) || S_ISBLK(mode) ? "is a device, expected a regular file"
           : "is not a regular file, expected a file";
}

char *sl_read_text_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) { sl_errorf("%s: cannot open: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { fclose(f); sl_errorf("%s: cannot stat: %s", path, strerror(errno)); return NULL; }
    const char *why = sl_not_a_file(st.st_mode);
    if (why) { fclose(f); sl_errorf("%s: %s", path, why); return NULL; }
    size_t n = (size_t)st.st_size;
    char *buf = sl_malloc(n + 1, path);
    if (!buf) { fclose(f); return NULL; }
    if (fread(buf, 1, n, f) != n) {
        free(buf); fclose(f); sl_errorf("%s: short read (file changed while reading?)", path); return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    if (len_out) *len_out = n;
    return buf;
}

int sl_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return sl_errorf("%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? 0 : sl_errorf("%s: fsync failed: %s", dir, strerror(errno));
}

int sl_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return sl_errorf("%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno; close(fd); unlink(tmp);
            return sl_errorf("%s: write failed: %s", tmp, strerror(e));
        }
        p += w; left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) { unlink(tmp); return sl_errorf("%s: fsync/close failed", tmp); }
    if (rename(tmp, path) != 0) {
        int e = errno; unlink(tmp);
        return sl_errorf("%s: rename from %s failed: %s", path, tmp, strerror(e));
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    return sl_fsync_dir(dirname(dir));
}

int sl_mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return sl_errorf("%s: mkdir failed: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return sl_errorf("%s: mkdir failed: %s", buf, strerror(errno));
    return 0;
}

static int remove_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

int sl_remove_tree(const char *path) {
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return sl_errorf("%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

unsigned long long sl_fnv1a64(unsigned long long h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}
