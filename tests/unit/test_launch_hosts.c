// test_launch_hosts.c: `shardlm launch`'s resource pool: hostfile parsing (good and malformed),
// DeepSpeed's --include/--exclude semantics, --num_nodes/--num_gpus caps and world-size resolution.
// launch_hosts.c lives with the CLI (not in libshardlm.a), so it is compiled into this test directly.
#include "test.h"

#include "cli/launch_hosts.c"

#include <unistd.h>

static int slots_are(const sl_launch_host *h, const char *want) {
    char buf[256];
    return sl_host_slots_string(h, buf, sizeof buf) == 0 && strcmp(buf, want) == 0;
}

// A pool from hostfile text; the test fails if parsing fails.
static sl_host_pool pool_of(const char *text) {
    sl_host_pool p = {0};
    int rc = sl_hostfile_parse(text, "hosts", &p);
    CHECK_MSG(rc == 0, "%s", sl_error());
    return p;
}

TEST(hostfile_parses_hosts_slots_comments_and_blank_lines) {
    sl_host_pool p = pool_of("# my cluster\n\nworker-1 slots=4\n  worker-2\tslots=2   # the small one\n\r\nworker-3 slots=1");
    CHECK(p.count == 3);
    if (p.count == 3) {
        CHECK(strcmp(p.hosts[0].name, "worker-1") == 0 && slots_are(&p.hosts[0], "0,1,2,3"));
        CHECK(strcmp(p.hosts[1].name, "worker-2") == 0 && slots_are(&p.hosts[1], "0,1"));
        CHECK(strcmp(p.hosts[2].name, "worker-3") == 0 && slots_are(&p.hosts[2], "0"));
    }
    CHECK(sl_host_pool_world_size(&p) == 7);
    sl_host_pool_free(&p);
    CHECK(p.count == 0 && p.hosts == NULL);
}

// Each malformed hostfile is refused with a message naming the source, the line and the problem.
static void check_bad(const char *text, const char *want) {
    sl_host_pool p = {0};
    int rc = sl_hostfile_parse(text, "hosts", &p);
    CHECK_MSG(rc == -1, "accepted: %s", text);
    CHECK_MSG(strstr(sl_error(), want) != NULL, "message '%s' lacks '%s'", sl_error(), want);
    sl_host_pool_free(&p);
}

TEST(hostfile_malformed_lines_are_errors_naming_file_and_line) {
    check_bad("a slots=2\nb\n", "hosts:2: expected 'HOST slots=N'");
    check_bad("a slots=2\nb slots=x\n", "hosts:2: slots must be a positive integer, found 'x'");
    check_bad("a slots=0\n", "hosts:1: slots must be a positive integer");
    check_bad("a slots=-1\n", "hosts:1: slots must be a positive integer");
    check_bad("a slots=2 extra\n", "hosts:1: expected 'HOST slots=N'");
    check_bad("a gpus=2\n", "hosts:1: expected");
    check_bad("a slots=2\n\na slots=1\n", "hosts:3: host 'a' is listed more than once");
    check_bad("# only a comment\n\n", "hosts: no hosts listed");
    check_bad("", "no hosts listed");
    check_bad("a slots=99999999999\n", "slots must be a positive integer");
}

TEST(hostfile_read_missing_and_real_file) {
    sl_host_pool p = {0};
    CHECK(sl_hostfile_read("/nonexistent/hostfile", &p) == -1);
    CHECK(strstr(sl_error(), "/nonexistent/hostfile") != NULL);
    char path[] = "/tmp/shardlm_test_hostfile_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char *text = "node-a slots=2\nnode-b slots=3\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    CHECK(sl_hostfile_read(path, &p) == 0);
    CHECK(p.count == 2 && sl_host_pool_world_size(&p) == 5);
    sl_host_pool_free(&p);
    unlink(path);
}

TEST(include_keeps_only_named_hosts_and_slots_in_hostfile_order) {
    sl_host_pool p = pool_of("w1 slots=4\nw2 slots=2\nw3 slots=2\n");
    // named out of order and with repeats: hostfile order, ascending distinct slots
    CHECK_MSG(sl_host_pool_filter(&p, "w3@w1:3,1,1", NULL) == 0, "%s", sl_error());
    CHECK(p.count == 2);
    if (p.count == 2) {
        CHECK(strcmp(p.hosts[0].name, "w1") == 0 && slots_are(&p.hosts[0], "1,3"));
        CHECK(strcmp(p.hosts[1].name, "w3") == 0 && slots_are(&p.hosts[1], "0,1"));
    }
    CHECK(sl_host_pool_world_size(&p) == 4);
    CHECK(sl_host_pool_has_slot(&p, "w1", 3) && !sl_host_pool_has_slot(&p, "w1", 0) && !sl_host_pool_has_slot(&p, "w2", 0));
    sl_host_pool_free(&p);
}

TEST(exclude_removes_slots_and_whole_hosts) {
    sl_host_pool p = pool_of("w1 slots=4\nw2 slots=2\nw3 slots=2\n");
    CHECK_MSG(sl_host_pool_filter(&p, NULL, "w1:0,2@w2") == 0, "%s", sl_error());
    CHECK(p.count == 2);
    if (p.count == 2) {
        CHECK(strcmp(p.hosts[0].name, "w1") == 0 && slots_are(&p.hosts[0], "1,3"));
        CHECK(strcmp(p.hosts[1].name, "w3") == 0 && slots_are(&p.hosts[1], "0,1"));
    }
    sl_host_pool_free(&p);
    // excluding every slot of a host drops the host
    p = pool_of("w1 slots=2\nw2 slots=1\n");
    CHECK(sl_host_pool_filter(&p, "", "w1:0,1") == 0);
    CHECK(p.count == 1 && strcmp(p.hosts[0].name, "w2") == 0);
    sl_host_pool_free(&p);
}

static void check_filter_error(const char *inc, const char *exc, const char *want) {
    sl_host_pool p = pool_of("w1 slots=2\nw2 slots=2\n");
    CHECK_MSG(sl_host_pool_filter(&p, inc, exc) == -1, "accepted include=%s exclude=%s", inc ? inc : "", exc ? exc : "");
    CHECK_MSG(strstr(sl_error(), want) != NULL, "message '%s' lacks '%s'", sl_error(), want);
    sl_host_pool_free(&p);
}

TEST(filter_errors_name_the_problem) {
    check_filter_error("w9", NULL, "--include: host 'w9' is not in the host pool");
    check_filter_error(NULL, "w9:0", "--exclude: host 'w9' is not in the host pool");
    check_filter_error("w1:5", NULL, "--include: no slot 5 on host 'w1' (it has slots 0,1)");
    check_filter_error("w1:x", NULL, "slot 'x' on host 'w1' is not a non-negative integer");
    check_filter_error("w1:", NULL, "has ':' but no slot list");
    check_filter_error("w1:0,", NULL, "is not a non-negative integer");
    check_filter_error("@w1", NULL, "empty host name");
    check_filter_error("w1", "w2", "--include and --exclude cannot be used together");
    check_filter_error(NULL, "w1@w2", "leaves no slots");
}

TEST(no_filter_is_a_no_op) {
    sl_host_pool p = pool_of("w1 slots=2\n");
    CHECK(sl_host_pool_filter(&p, NULL, NULL) == 0 && sl_host_pool_filter(&p, "", "") == 0);
    CHECK(p.count == 1 && sl_host_pool_world_size(&p) == 2);
    sl_host_pool_free(&p);
}

TEST(num_nodes_and_num_gpus_cap_the_pool) {
    sl_host_pool p = pool_of("w1 slots=4\nw2 slots=4\nw3 slots=4\n");
    CHECK(sl_host_pool_limit(&p, 2, 3) == 0);
    CHECK(p.count == 2 && sl_host_pool_world_size(&p) == 6 && slots_are(&p.hosts[1], "0,1,2"));
    // then include picks among what is left
    CHECK(sl_host_pool_filter(&p, "w2:1,2", NULL) == 0);
    CHECK(p.count == 1 && slots_are(&p.hosts[0], "1,2"));
    sl_host_pool_free(&p);
    p = pool_of("w1 slots=4\nw2 slots=2\n");
    CHECK(sl_host_pool_limit(&p, 3, -1) == -1 && strstr(sl_error(), "--num_nodes 3") != NULL);
    CHECK(sl_host_pool_limit(&p, -1, 3) == -1 && strstr(sl_error(), "host 'w2' has (2)") != NULL);
    CHECK(sl_host_pool_limit(&p, -1, -1) == 0 && sl_host_pool_world_size(&p) == 6);
    sl_host_pool_free(&p);
}

TEST(local_pool_and_include_spec_sizing) {
    // without a hostfile the launcher builds "localhost" with enough slots for the include spec
    CHECK(sl_host_spec_max_slot("localhost:1,3", "localhost") == 3);
    CHECK(sl_host_spec_max_slot("other:7@localhost:2", "localhost") == 2);
    CHECK(sl_host_spec_max_slot("localhost", "localhost") == -1);
    CHECK(sl_host_spec_max_slot("", "localhost") == -1);
    sl_host_pool p = {0};
    CHECK(sl_host_pool_add(&p, "localhost", 4) == 0);
    CHECK(sl_host_pool_add(&p, "localhost", 1) == -1);
    CHECK(sl_host_pool_add(&p, "other", 0) == -1);
    CHECK(sl_host_pool_filter(&p, "localhost:0,2", NULL) == 0);
    CHECK(p.count == 1 && slots_are(&p.hosts[0], "0,2") && sl_host_pool_world_size(&p) == 2);
    sl_host_pool_free(&p);
}

TEST_MAIN()
