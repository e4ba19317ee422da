// checkpoint.c: checkpoint directory mechanics (see checkpoint.h): temporary tag directories,
// durable commit by rename, the `latest` pointer, resolving a path to the directory to load, and
// flat-buffer tensor files for optimizer state.
// Invariants: ROOT/<tag> only ever holds a complete, fsync'd checkpoint; ROOT/latest only ever names
// such a directory (it is rewritten atomically after the rename is durable); replacing ROOT/<tag>
// swaps the directories atomically (renameat2 RENAME_EXCHANGE) or, where the filesystem lacks that,
// moves the old one aside to ROOT/.old-<tag>-<pid> first, which sl_ckpt_resolve falls back to.
#include "shardlm/checkpoint.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP 4096
#define TAG_MAX 128

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int join(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= cap) return sl_errorf("path too long: %s/%s", a, b);
    return 0;
}

static int check_tag(const char *tag, const char *where) {
    size_t n = strlen(tag);
    int ok = n > 0 && n <= TAG_MAX && tag[0] != '.' && strcmp(tag, "latest") != 0;
    for (size_t i = 0; ok && i < n; i++) {
        char c = tag[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    }
    if (!ok)
        return sl_errorf("%s: invalid checkpoint tag \"%.200s\" (expected 1-%d chars of [A-Za-z0-9._-], not starting "
                         "with '.', not \"latest\")", where, tag, TAG_MAX);
    return 0;
}

// fsync every regular file under dir (recursively), then dir itself.
static int fsync_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return sl_errorf("%s: cannot open directory: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[PATH_CAP];
        struct stat st;
        if (join(p, sizeof p, dir, e->d_name)) { rc = -1; break; }
        if (lstat(p, &st) != 0) { rc = sl_errorf("%s: stat failed: %s", p, strerror(errno)); break; }
        if (S_ISDIR(st.st_mode)) { rc = fsync_tree(p); continue; }
        if (!S_ISREG(st.st_mode)) continue;
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) { rc = sl_errorf("%s: cannot open: %s", p, strerror(errno)); break; }
        if (fsync(fd) != 0) rc = sl_errorf("%s: fsync failed: %s", p, strerror(errno));
        close(fd);
    }
    closedir(d);
    return rc ? rc : sl_fsync_dir(dir);
}

int sl_ckpt_begin(const char *root, const char *tag, char *tmp_dir, size_t cap) {
    if (check_tag(tag, root) || sl_mkdirs(root)) return -1;
    int n = snprintf(tmp_dir, cap, "%s/.tmp-%s-%d", root, tag, (int)getpid());
    if (n < 0 || (size_t)n >= cap) return sl_errorf("%s: temporary checkpoint path does not fit in %zu bytes", root, cap);
    if (is_dir(tmp_dir) && sl_remove_tree(tmp_dir)) return -1;   // our own leftover from an earlier failed attempt
    if (mkdir(tmp_dir, 0755) != 0) return sl_errorf("%s: mkdir failed: %s", tmp_dir, strerror(errno));
    return 0;
}

int sl_ckpt_abort(const char *tmp_dir) {
    const char *base = strrchr(tmp_dir, '/');
    base = base ? base + 1 : tmp_dir;
    if (strncmp(base, ".tmp-", 5) != 0)
        return sl_errorf("%s: refusing to remove a directory not named .tmp-* (not a temporary checkpoint)", tmp_dir);
    return sl_remove_tree(tmp_dir);
}

int sl_ckpt_commit(const char *root, const char *tag, const char *tmp_dir) {
    char final[PATH_CAP], latest[PATH_CAP];
    if (check_tag(tag, root) || join(final, sizeof final, root, tag) || join(latest, sizeof latest, root, "latest"))
        return -1;
    if (!is_dir(tmp_dir)) return sl_errorf("%s: temporary checkpoint directory does not exist", tmp_dir);
    if (fsync_tree(tmp_dir)) return sl_error_context("committing checkpoint %s", final);
    if (!is_dir(final)) {
        if (rename(tmp_dir, final) != 0)
            return sl_errorf("%s: rename from %s failed: %s", final, tmp_dir, strerror(errno));
    } else if (renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        // tmp_dir now holds the previous checkpoint; `final` was never absent.
        if (sl_fsync_dir(root) || sl_remove_tree(tmp_dir)) return -1;
    } else {
        char old[PATH_CAP];
        int n = snprintf(old, sizeof old, "%s/.old-%s-%d", root, tag, (int)getpid());
        if (n < 0 || (size_t)n >= sizeof old) return sl_errorf("%s: path too long", root);
        if (is_dir(old) && sl_remove_tree(old)) return -1;
        if (rename(final, old) != 0) return sl_errorf("%s: moving the old checkpoint aside failed: %s", final, strerror(errno));
        if (rename(tmp_dir, final) != 0) {
            int e = errno;
            rename(old, final);   // put the old one back
            return sl_errorf("%s: rename from %s failed: %s", final, tmp_dir, strerror(e));
        }
        if (sl_fsync_dir(root) || sl_remove_tree(old)) return -1;
    }
    if (sl_fsync_dir(root)) return -1;
    char text[TAG_MAX + 2];
    int n = snprintf(text, sizeof text, "%s\n", tag);
    return sl_write_file_atomic(latest, text, (size_t)n);
}

// Finds ROOT/.old-<tag>-<pid> left by an interrupted replace; 0 and the path if found.
static int find_old_copy(const char *root, const char *tag, char *out, size_t cap) {
    char prefix[TAG_MAX + 8];
    snprintf(prefix, sizeof prefix, ".old-%s-", tag);
    DIR *d = opendir(root);
    if (!d) return -1;
    int rc = -1;
    for (struct dirent *e; rc != 0 && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        if (join(out, cap, root, e->d_name) == 0 && is_dir(out)) rc = 0;
    }
    closedir(d);
    return rc;
}

int sl_ckpt_resolve(const char *path, char *dir_out, size_t cap) {
    char latest[PATH_CAP];
    if (!is_dir(path)) return sl_errorf("%s: checkpoint path is not a directory", path);
    if (join(latest, sizeof latest, path, "latest")) return -1;
    struct stat st;
    if (stat(latest, &st) == 0) {
        char *text = sl_read_text_file(latest, NULL);
        if (!text) return -1;
        size_t n = strlen(text);
        while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ' || text[n - 1] == '\t')) text[--n] = '\0';
        int rc = check_tag(text, latest);
        if (!rc) rc = join(dir_out, cap, path, text);
        if (!rc && !is_dir(dir_out)) {
            if (find_old_copy(path, text, dir_out, cap) != 0)
                rc = sl_errorf("%s names checkpoint \"%s\", but %s/%s does not exist", latest, text, path, text);
        }
        free(text);
        return rc;
    }
    // No `latest`: a tag directory holds files; a root holds only directories.
    DIR *d = opendir(path);
    if (!d) return sl_errorf("%s: cannot open directory: %s", path, strerror(errno));
    int files = 0, subdirs = 0, tmps = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char p[PATH_CAP];
        if (strncmp(e->d_name, ".tmp-", 5) == 0) { tmps++; continue; }
        if (e->d_name[0] == '.' || join(p, sizeof p, path, e->d_name) || stat(p, &st) != 0) continue;
        if (S_ISREG(st.st_mode)) files++;
        else if (S_ISDIR(st.st_mode)) subdirs++;
    }
    closedir(d);
    if (files > 0) {
        int n = snprintf(dir_out, cap, "%s", path);
        return n < 0 || (size_t)n >= cap ? sl_errorf("%s: path too long", path) : 0;
    }
    if (subdirs > 0)
        return sl_errorf("%s: no `latest` file; this looks like a checkpoint root without a committed checkpoint "
                         "(pass a tag directory explicitly)", path);
    if (tmps > 0)
        return sl_errorf("%s: holds only incomplete temporary checkpoints (.tmp-*), no committed one", path);
    return sl_errorf("%s: empty directory: neither a checkpoint root (no `latest`) nor a tag directory", path);
}

// pid at the end of NAME (after the last '-' or '.'), or -1.
static long trailing_pid(const char *name) {
    const char *s = strrchr(name, '-'), *t = strrchr(name, '.');
    if (t > s) s = t;
    if (!s || !s[1]) return -1;
    char *end;
    long pid = strtol(s + 1, &end, 10);
    return *end || pid <= 0 ? -1 : pid;
}

// For NAME = .old-TAG-PID: 1 when ROOT/TAG exists, so the old copy is no longer needed.
static int old_copy_superseded(const char *root, const char *name) {
    char tag[TAG_MAX + 1], p[PATH_CAP];
    const char *start = name + 5, *dash = strrchr(name, '-');
    size_t n = dash > start ? (size_t)(dash - start) : 0;
    if (n == 0 || n > TAG_MAX) return 0;
    memcpy(tag, start, n);
    tag[n] = '\0';
    return join(p, sizeof p, root, tag) == 0 && is_dir(p);
}

int sl_ckpt_clean_stale(const char *root) {
    DIR *d = opendir(root);
    if (!d) return sl_errorf("%s: cannot open directory: %s", root, strerror(errno));
    int removed = 0, rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        int kind = strncmp(e->d_name, ".tmp-", 5) == 0 || strncmp(e->d_name, ".old-", 5) == 0 ||
                   strncmp(e->d_name, "latest.tmp.", 11) == 0;
        long pid = kind ? trailing_pid(e->d_name) : -1;
        if (pid < 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno == EPERM) continue;   // still running
        char p[PATH_CAP];
        // .old-TAG-PID is the only copy of TAG while ROOT/TAG is missing (sl_ckpt_resolve loads it)
        if (strncmp(e->d_name, ".old-", 5) == 0 && !old_copy_superseded(root, e->d_name)) continue;
        if (join(p, sizeof p, root, e->d_name) || sl_remove_tree(p)) rc = -1;
        else removed++;
    }
    closedir(d);
    return rc ? rc : removed;
}

int sl_ckpt_open_tensors(sl_st_writer **w, const char *path, int n, const char **names, const size_t *numel) {
    *w = NULL;
    sl_st_desc *desc = sl_calloc((size_t)(n > 0 ? n : 1), sizeof *desc, "checkpoint tensor list");
    if (!desc) return -1;
    for (int i = 0; i < n; i++) {
        desc[i].name = names[i];
        desc[i].ndim = 1;
        desc[i].shape[0] = (int64_t)numel[i];
    }
    const char *mk[] = {"format"}, *mv[] = {"shardlm-flat"};
    int rc = sl_st_writer_open(w, path, n, desc, 1, mk, mv);
    free(desc);
    return rc;
}

int sl_ckpt_save_tensors(const char *path, int n, const char **names, const float **data, const size_t *numel) {
    sl_st_writer *w;
    if (sl_ckpt_open_tensors(&w, path, n, names, numel)) return -1;
    for (int i = 0; i < n; i++)
        if (numel[i] && sl_st_writer_write(w, data[i], numel[i])) {
            sl_st_writer_abort(w);
            return -1;
        }
    return sl_st_writer_finish(w);
}

int sl_ckpt_load_tensors(const char *path, int n, const char **names, float **data, const size_t *numel) {
    sl_st_file f;
    if (sl_st_open(&f, path)) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int k = sl_st_find(&f, names[i]);
        if (k < 0) { rc = sl_errorf("%s: tensor \"%s\" missing", path, names[i]); break; }
        const sl_st_tensor *t = &f.tensors[k];
        if (t->ndim != 1 || t->numel != numel[i]) {
            char s[128];
            rc = sl_errorf("%s: tensor \"%s\": expected shape [%zu], found %s", path, names[i], numel[i],
                           sl_st_shape_str(s, sizeof s, t->ndim, t->shape));
            break;
        }
        rc = sl_st_read_f32(&f, k, data[i], numel[i]);
    }
    sl_st_close(&f);
    return rc;
}
