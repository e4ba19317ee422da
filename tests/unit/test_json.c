// test_json.c: strict JSON parsing (sl_json_parse_strict: trailing data, repeated keys, the byte
// offset of a syntax error, the nesting limit named) and range-checked integer reads.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/json_get.h"

static cJSON *parse(const char *text) { return sl_json_parse_strict(text, strlen(text), "cfg.json"); }

TEST(strict_parse_accepts_plain_json) {
    cJSON *r = parse("  {\"a\": {\"b\": [1, {\"c\": 2}, {\"c\": 3}]}, \"d\": \"x\"}\n\t \r\n");
    CHECK_MSG(r != NULL, "%s", sl_error());
    CHECK(r && cJSON_GetObjectItemCaseSensitive(r, "d"));
    cJSON_Delete(r);
}

TEST(strict_parse_refuses_trailing_data) {
    CHECK(parse("{\"a\": 1} x") == NULL);
    CHECK_MSG(strstr(sl_error(), "cfg.json: unexpected data after the JSON value at byte 9 (line 1, column 10)"),
              "%s", sl_error());
    CHECK(parse("{\"a\": 1}\n{\"a\": 2}") == NULL);
    CHECK_MSG(strstr(sl_error(), "at byte 9 (line 2, column 1)"), "%s", sl_error());
}

TEST(strict_parse_refuses_repeated_keys) {
    CHECK(parse("{\"lr\": 1, \"lr\": 2}") == NULL);
    CHECK_MSG(strstr(sl_error(), "cfg.json: key \"lr\" appears twice in the top-level object; expected each key once"),
              "%s", sl_error());
    CHECK(parse("{\"optimizer\": {\"params\": {\"lr\": 1, \"eps\": 2, \"lr\": 3}}}") == NULL);
    CHECK_MSG(strstr(sl_error(), "key \"lr\" appears twice in object optimizer.params"), "%s", sl_error());
    CHECK(parse("{\"files\": [{\"a\": 1}, {\"b\": 1, \"b\": 2}]}") == NULL);
    CHECK_MSG(strstr(sl_error(), "key \"b\" appears twice in object files[1]"), "%s", sl_error());
    // the same key in different objects is fine
    cJSON *r = parse("{\"a\": {\"x\": 1}, \"b\": {\"x\": 2}}");
    CHECK(r != NULL);
    cJSON_Delete(r);
}

TEST(strict_parse_gives_the_offset_and_the_nesting_limit) {
    CHECK(parse("{\"a\": 1,\n \"b\": tru}") == NULL);
    CHECK_MSG(strstr(sl_error(), "cfg.json: malformed JSON at byte 15 (line 2, column 7)"), "%s", sl_error());
    CHECK(parse("{\"a\": [1, 2") == NULL);
    CHECK_MSG(strstr(sl_error(), "unexpected end of input"), "%s", sl_error());
    size_t n = 3000;
    char *deep = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) { deep[i] = '['; deep[2 * n - 1 - i] = ']'; }
    deep[2 * n] = '\0';
    CHECK(parse(deep) == NULL);
    CHECK_MSG(strstr(sl_error(), "nested deeper than 1000 levels (the parser's nesting limit) at byte 1000"), "%s",
              sl_error());
    free(deep);
}

TEST(get_i64_checks_the_range) {
    cJSON *r = parse("{\"step\": 1e30, \"ok\": 12, \"neg\": -3, \"frac\": 1.5, \"s\": \"7\"}");
    int64_t v = 77;
    CHECK(sl_json_get_i64(r, "step", &v, 1, 0, SL_JSON_INT_EXACT, "ts.json") == -1 && v == 77);
    CHECK_MSG(strstr(sl_error(), "ts.json: \"step\" must be an integer in [0, 9007199254740992], found 1e+30"), "%s",
              sl_error());
    CHECK(sl_json_get_i64(r, "ok", &v, 1, 0, 100, "ts.json") == 0 && v == 12);
    CHECK(sl_json_get_i64(r, "neg", &v, 1, 0, 100, "ts.json") == -1 && strstr(sl_error(), "found -3"));
    CHECK(sl_json_get_i64(r, "frac", &v, 1, 0, 100, "ts.json") == -1 && strstr(sl_error(), "found 1.5"));
    CHECK(sl_json_get_i64(r, "s", &v, 1, 0, 100, "ts.json") == -1 && strstr(sl_error(), "found a string"));
    CHECK(sl_json_get_i64(r, "missing", &v, 1, 0, 100, "ts.json") == -1 && strstr(sl_error(), "missing required"));
    CHECK(sl_json_get_i64(r, "missing", &v, 0, 0, 100, "ts.json") == 0);
    cJSON_Delete(r);
}

TEST_MAIN()
