// test_manifest.c: checkpoint manifests: the FNV-1a 64 of the published test vectors, verification
// of sizes and checksums (a flipped byte is named), format-2 manifests hashed from the old mistyped
// offset basis still verifying, and which directories need a manifest before their weights load.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/manifest.h"

#include <inttypes.h>
#include <unistd.h>

static char dir[256];

static void put(const char *name, const char *text) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    CHECK(sl_write_file_atomic(p, text, strlen(text)) == 0);
}

// A tag directory with model.safetensors / config.json / trainer_state.json and a manifest of
// `format` whose hashes start from `basis`.
static void make_ckpt(const char *name, const char *format, uint64_t basis) {
    snprintf(dir, sizeof dir, "/tmp/sl_test_manifest_%d_%s", (int)getpid(), name);
    sl_remove_tree(dir);
    CHECK(sl_mkdirs(dir) == 0);
    const char *files[3] = {"model.safetensors", "config.json", "trainer_state.json"};
    const char *texts[3] = {"weights-bytes", "{\"n_layer\": 1}", "{\"step\": 2}"};
    char manifest[4096];
    int n = snprintf(manifest, sizeof manifest, "{\"format\": \"%s\", \"state_tensors\": [], \"optimizer_shards\": [], "
                     "\"files\": [", format);
    for (int i = 0; i < 3; i++) {
        put(files[i], texts[i]);
        char p[400];
        uint64_t h = 0, b = 0;
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        CHECK(sl_file_fnv1a64(p, basis, &h, &b) == 0 && b == strlen(texts[i]));
        n += snprintf(manifest + n, sizeof manifest - (size_t)n, "%s{\"file\": \"%s\", \"bytes\": %" PRIu64
                      ", \"fnv1a64\": \"%016" PRIx64 "\"}", i ? ", " : "", files[i], b, h);
    }
    snprintf(manifest + n, sizeof manifest - (size_t)n, "]}");
    put("manifest.json", manifest);
}

TEST(fnv1a64_matches_the_published_vectors) {
    CHECK(sl_fnv1a64(SL_FNV1A64_INIT, "", 0) == 0xcbf29ce484222325ULL);
    CHECK(sl_fnv1a64(SL_FNV1A64_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL);
    CHECK(sl_fnv1a64(SL_FNV1A64_INIT, "foobar", 6) == 0x85944171f73967e8ULL);
}

TEST(verified_checkpoint_loads_and_a_flipped_byte_is_named) {
    make_ckpt("flip", SL_MANIFEST_FORMAT, SL_FNV1A64_INIT);
    CHECK_MSG(sl_manifest_verify_weights_dir(dir) == 0, "%s", sl_error());
    put("model.safetensors", "weights-bytez");   // same size, one byte different
    CHECK(sl_manifest_verify_weights_dir(dir) == -1);
    CHECK_MSG(strstr(sl_error(), "model.safetensors: checksum") && strstr(sl_error(), "(corrupted)") &&
              strstr(sl_error(), "--no-verify"), "%s", sl_error());
    put("model.safetensors", "weights-bytes!");
    CHECK(sl_manifest_verify_weights_dir(dir) == -1);
    CHECK_MSG(strstr(sl_error(), "model.safetensors: 13 bytes expected by the manifest, 14 found"), "%s", sl_error());
    sl_remove_tree(dir);
}

TEST(format_2_manifests_verify_with_the_old_basis) {
    make_ckpt("v2", SL_MANIFEST_FORMAT_V2, SL_FNV1A64_INIT_V2);
    CHECK_MSG(sl_manifest_verify_weights_dir(dir) == 0, "%s", sl_error());
    // old hashes under the new format's name do not verify
    make_ckpt("v2as3", SL_MANIFEST_FORMAT, SL_FNV1A64_INIT_V2);
    CHECK(sl_manifest_verify_weights_dir(dir) == -1 && strstr(sl_error(), "differs from the manifest's"));
    sl_remove_tree(dir);
}

TEST(which_directories_need_a_manifest) {
    make_ckpt("nomanifest", SL_MANIFEST_FORMAT, SL_FNV1A64_INIT);
    char p[400];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    unlink(p);
    CHECK(sl_manifest_verify_weights_dir(dir) == -1);
    CHECK_MSG(strstr(sl_error(), "without manifest.json") && strstr(sl_error(), "--no-verify"), "%s", sl_error());
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    unlink(p);
    CHECK_MSG(sl_manifest_verify_weights_dir(dir) == 0, "a Hugging Face directory: %s", sl_error());
    sl_remove_tree(dir);
}

TEST(manifest_fields_are_checked) {
    make_ckpt("fields", SL_MANIFEST_FORMAT, SL_FNV1A64_INIT);
    put("manifest.json", "{\"format\": \"shardlm-checkpoint-3\", \"optimizer_shards\": [], \"files\": "
                         "[{\"file\": \"config.json\", \"bytes\": 1e30, \"fnv1a64\": \"00\"}]}");
    CHECK(sl_manifest_verify_weights_dir(dir) == -1);
    CHECK_MSG(strstr(sl_error(), "entry \"config.json\": \"bytes\" must be an integer in [0, 9007199254740992], found "
                                 "1e+30"), "%s", sl_error());
    put("manifest.json", "{\"format\": \"shardlm-checkpoint-9\", \"optimizer_shards\": [], \"files\": []}");
    CHECK(sl_manifest_verify_weights_dir(dir) == -1 && strstr(sl_error(), "format must be \"shardlm-checkpoint-3\""));
    sl_manifest m;
    put("manifest.json", "{\"format\": \"shardlm-checkpoint-3\", \"files\": [], \"optimizer_shards\": ["
                         "{\"file\": \"a\", \"bytes\": 1, \"fnv1a64\": \"0\", \"begin\": 0, \"end\": 6},"
                         "{\"file\": \"b\", \"bytes\": 1, \"fnv1a64\": \"0\", \"begin\": 5, \"end\": 10}]}");
    CHECK(sl_manifest_load(&m, dir, 10, SL_VERIFY_NONE) == -1 && strstr(sl_error(), "gap or overlap at 6"));
    put("manifest.json", "{\"format\": \"shardlm-checkpoint-3\", \"files\": [], \"optimizer_shards\": ["
                         "{\"file\": \"a\", \"bytes\": 1, \"fnv1a64\": \"0\", \"begin\": 0, \"end\": 2.5}]}");
    CHECK(sl_manifest_load(&m, dir, 10, SL_VERIFY_NONE) == -1 && strstr(sl_error(), "\"end\" must be an integer"));
    sl_remove_tree(dir);
}

TEST_MAIN()
