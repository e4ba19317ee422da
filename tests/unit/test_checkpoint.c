// test_checkpoint.c: checkpoint directory mechanics: commit moves `latest`; a crash before commit
// (temporary directory or half-written file left behind, stale latest.tmp) leaves the previous
// checkpoint and `latest` intact and loadable; replacing a tag; resolve's errors; flat tensor files.
#include "test.h"

#include "shardlm/checkpoint.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void make_root(const char *name) {
    snprintf(root, sizeof root, "/tmp/sl_test_ckpt_%d_%s", (int)getpid(), name);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "  rm failed\n");
}

static void remove_root(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "  rm failed\n");
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

// Number of entries in root whose name starts with prefix.
static int count_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return n;
}

static void read_latest(char *out, size_t cap) {
    char p[300];
    snprintf(p, sizeof p, "%s/latest", root);
    char *t = sl_read_text_file(p, NULL);
    snprintf(out, cap, "%s", t ? t : "(missing)");
    free(t);
}

// Writes one checkpoint `tag` holding a tensor "m" of 8 floats all equal to `value`.
static int save_ckpt(const char *tag, float value) {
    char tmp[512], file[600];
    if (sl_ckpt_begin(root, tag, tmp, sizeof tmp)) return -1;
    float x[8];
    for (int i = 0; i < 8; i++) x[i] = value;
    const char *names[1] = {"m"};
    const float *data[1] = {x};
    size_t numel[1] = {8};
    snprintf(file, sizeof file, "%s/optim.safetensors", tmp);
    if (sl_ckpt_save_tensors(file, 1, names, data, numel)) { sl_ckpt_abort(tmp); return -1; }
    return sl_ckpt_commit(root, tag, tmp);
}

// Resolves `path` and loads tensor "m"; returns its first value (or -1 on failure).
static float load_ckpt(const char *path) {
    char dir[512], file[600];
    if (sl_ckpt_resolve(path, dir, sizeof dir)) return -1.0f;
    float x[8] = {0};
    float *data[1] = {x};
    const char *names[1] = {"m"};
    size_t numel[1] = {8};
    snprintf(file, sizeof file, "%s/optim.safetensors", dir);
    if (sl_ckpt_load_tensors(file, 1, names, data, numel)) return -1.0f;
    for (int i = 1; i < 8; i++) if (x[i] != x[0]) return -1.0f;
    return x[0];
}

TEST(commit_moves_latest) {
    make_root("commit");
    char latest[64], tagdir[400];
    CHECK_MSG(save_ckpt("step_000100", 1.0f) == 0, "%s", sl_error());
    read_latest(latest, sizeof latest);
    CHECK(strcmp(latest, "step_000100\n") == 0);
    CHECK(load_ckpt(root) == 1.0f);
    CHECK_MSG(save_ckpt("step_000200", 2.0f) == 0, "%s", sl_error());
    read_latest(latest, sizeof latest);
    CHECK(strcmp(latest, "step_000200\n") == 0);
    CHECK(load_ckpt(root) == 2.0f);
    snprintf(tagdir, sizeof tagdir, "%s/step_000100", root);
    CHECK(load_ckpt(tagdir) == 1.0f);                 // a tag directory resolves to itself
    char dir[512];
    CHECK(sl_ckpt_resolve(tagdir, dir, sizeof dir) == 0 && strcmp(dir, tagdir) == 0);
    CHECK(count_prefix(root, ".tmp-") == 0 && count_prefix(root, ".old-") == 0 && count_prefix(root, "latest.") == 0);
    remove_root();
}

TEST(crash_before_commit_keeps_previous_checkpoint) {
    make_root("crash");
    char latest[64], tmp[512], file[600];
    CHECK(save_ckpt("step_1", 1.0f) == 0);
    // a save that dies halfway: temporary directory with a half-written file, never committed
    CHECK(sl_ckpt_begin(root, "step_2", tmp, sizeof tmp) == 0);
    snprintf(file, sizeof file, "%s/optim.safetensors", tmp);
    FILE *f = fopen(file, "wb");
    fputs("\x40\x00\x00\x00\x00\x00\x00\x00{\"m\": {\"dtype\"", f);
    fclose(f);
    // and a dead process's temporary dir, and a torn rewrite of latest
    char dead[400], torn[400];
    snprintf(dead, sizeof dead, "%s/.tmp-step_3-99999999", root);
    CHECK(mkdir(dead, 0755) == 0);
    snprintf(torn, sizeof torn, "%s/latest.tmp.99999999", root);
    f = fopen(torn, "wb");
    fputs("step_", f);
    fclose(f);
    read_latest(latest, sizeof latest);
    CHECK(strcmp(latest, "step_1\n") == 0);
    CHECK(load_ckpt(root) == 1.0f);
    CHECK_MSG(sl_ckpt_load_tensors(file, 0, NULL, NULL, NULL) == -1 && strstr(sl_error(), file), "%s", sl_error());
    // a dead process's .old-TAG copy: kept while it is TAG's only copy, removed once TAG exists
    char old_only[400], old_done[400];
    snprintf(old_only, sizeof old_only, "%s/.old-step_5-99999999", root);
    snprintf(old_done, sizeof old_done, "%s/.old-step_1-99999999", root);
    CHECK(mkdir(old_only, 0755) == 0 && mkdir(old_done, 0755) == 0);
    // stale cleanup removes the dead process's leftovers, not ours
    CHECK(sl_ckpt_clean_stale(root) == 3);
    CHECK(!is_dir(dead) && is_dir(tmp) && is_dir(old_only) && !is_dir(old_done));
    CHECK(sl_ckpt_abort(tmp) == 0 && !is_dir(tmp));
    CHECK(load_ckpt(root) == 1.0f);
    // a retried save of the same tag after the crash works
    CHECK(save_ckpt("step_2", 2.0f) == 0 && load_ckpt(root) == 2.0f);
    remove_root();
}

TEST(replacing_an_existing_tag) {
    make_root("replace");
    CHECK(save_ckpt("best", 1.0f) == 0);
    CHECK(save_ckpt("other", 5.0f) == 0);
    CHECK_MSG(save_ckpt("best", 3.0f) == 0, "%s", sl_error());
    char tagdir[400], latest[64];
    snprintf(tagdir, sizeof tagdir, "%s/best", root);
    CHECK(load_ckpt(tagdir) == 3.0f && load_ckpt(root) == 3.0f);
    read_latest(latest, sizeof latest);
    CHECK(strcmp(latest, "best\n") == 0);
    CHECK(count_prefix(root, ".tmp-") == 0 && count_prefix(root, ".old-") == 0);
    remove_root();
}

TEST(resolve_errors_and_recovery) {
    make_root("resolve");
    char dir[512], p[400];
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == -1 && strstr(sl_error(), root) && strstr(sl_error(), "not a directory"));
    CHECK(sl_mkdirs(root) == 0);
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == -1 && strstr(sl_error(), "empty"));
    snprintf(p, sizeof p, "%s/.tmp-a-1", root);
    CHECK(mkdir(p, 0755) == 0);
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == -1 && strstr(sl_error(), "incomplete"));
    snprintf(p, sizeof p, "%s/step_9", root);
    CHECK(mkdir(p, 0755) == 0);
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == -1 && strstr(sl_error(), "no `latest`"));
    snprintf(p, sizeof p, "%s/latest", root);
    CHECK(sl_write_file_atomic(p, "step_7\n", 7) == 0);
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == -1 && strstr(sl_error(), "step_7") && strstr(sl_error(), "does not exist"));
    CHECK(sl_write_file_atomic(p, "../../etc\n", 10) == 0);
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == -1 && strstr(sl_error(), "invalid checkpoint tag"));
    CHECK(sl_write_file_atomic(p, "step_9", 6) == 0);   // no newline is fine
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == 0 && strstr(dir, "/step_9"));
    // interrupted replace on a filesystem without RENAME_EXCHANGE: the old copy moved aside is used
    CHECK(sl_write_file_atomic(p, "step_8\n", 7) == 0);
    snprintf(p, sizeof p, "%s/.old-step_8-4242", root);
    CHECK(mkdir(p, 0755) == 0);
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == 0 && strcmp(dir, p) == 0);
    // capacity too small
    CHECK(sl_ckpt_resolve(root, dir, 8) == -1);
    remove_root();
}

TEST(begin_rejects_bad_tags_and_abort_is_careful) {
    make_root("tags");
    char tmp[512];
    const char *bad[] = {"", "../x", "a/b", "latest", ".hidden", "sp ace"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(sl_ckpt_begin(root, bad[i], tmp, sizeof tmp) == -1 && strstr(sl_error(), "invalid checkpoint tag"),
                  "tag \"%s\"", bad[i]);
    CHECK(sl_ckpt_begin(root, "ok", tmp, 10) == -1);   // does not fit
    CHECK(sl_ckpt_begin(root, "ok", tmp, sizeof tmp) == 0 && is_dir(tmp));
    CHECK(sl_ckpt_begin(root, "ok", tmp, sizeof tmp) == 0 && is_dir(tmp));   // again: fresh and empty
    CHECK(sl_ckpt_abort(root) == -1 && strstr(sl_error(), "refusing") && is_dir(root));
    CHECK(sl_ckpt_commit(root, "ok", "/tmp/sl_no_such_tmp_dir") == -1 && strstr(sl_error(), "does not exist"));
    CHECK(sl_ckpt_abort(tmp) == 0 && !is_dir(tmp));
    remove_root();
}

TEST(flat_tensor_files_check_sizes) {
    make_root("flat");
    CHECK(sl_mkdirs(root) == 0);
    char path[400];
    snprintf(path, sizeof path, "%s/moments.safetensors", root);
    float m[5] = {1, 2, 3, 4, 5}, v[3] = {0.5f, 0.25f, 0.125f};
    const char *names[2] = {"exp_avg", "exp_avg_sq"};
    const float *data[2] = {m, v};
    size_t numel[2] = {5, 3};
    CHECK(sl_ckpt_save_tensors(path, 2, names, data, numel) == 0);
    float rm[5], rv[3];
    float *out[2] = {rm, rv};
    CHECK(sl_ckpt_load_tensors(path, 2, names, out, numel) == 0);
    CHECK(memcmp(rm, m, sizeof m) == 0 && memcmp(rv, v, sizeof v) == 0);
    size_t wrong[2] = {5, 4};
    CHECK(sl_ckpt_load_tensors(path, 2, names, out, wrong) == -1 && strstr(sl_error(), "exp_avg_sq") &&
          strstr(sl_error(), "expected shape [4], found [3]"));
    const char *missing[1] = {"step"};
    CHECK(sl_ckpt_load_tensors(path, 1, missing, out, numel) == -1 && strstr(sl_error(), "\"step\" missing"));
    remove_root();
}

TEST_MAIN()
