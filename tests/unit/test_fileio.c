// test_fileio.c: the shared file helpers refuse what is not a regular file (a directory used to
// "seek" to 2^63 bytes and fail as an out-of-memory), and read regular files whole.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/fileio.h"

#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/sl_test_fileio_%d", (int)getpid());
    CHECK(sl_mkdirs(dir) == 0);
}

TEST(read_text_file_refuses_a_directory) {
    make_dir();
    size_t n = 123;
    char *text = sl_read_text_file(dir, &n);
    CHECK(text == NULL);
    CHECK_MSG(strstr(sl_error(), dir) && strstr(sl_error(), "is a directory, expected a file"), "%s", sl_error());
    CHECK_MSG(!strstr(sl_error(), "out of memory"), "%s", sl_error());
    CHECK(n == 123);
    free(text);
    sl_remove_tree(dir);
}

TEST(read_text_file_refuses_a_fifo) {
    make_dir();
    char p[300];
    snprintf(p, sizeof p, "%s/fifo", dir);
    CHECK(mkfifo(p, 0600) == 0);
    // O_RDONLY on a FIFO blocks until a writer appears: keep one open
    FILE *w = fopen(p, "w+");
    char *text = sl_read_text_file(p, NULL);
    CHECK(text == NULL);
    CHECK_MSG(strstr(sl_error(), "is a FIFO, expected a regular file"), "%s", sl_error());
    if (w) fclose(w);
    free(text);
    sl_remove_tree(dir);
}

TEST(read_text_file_reads_a_regular_file) {
    make_dir();
    char p[300];
    snprintf(p, sizeof p, "%s/f.txt", dir);
    CHECK(sl_write_file_atomic(p, "abc\0d", 5) == 0);
    size_t n = 0;
    char *text = sl_read_text_file(p, &n);
    CHECK(text && n == 5 && memcmp(text, "abc\0d", 6) == 0);
    free(text);
    text = sl_read_text_file("/nonexistent/x.json", NULL);
    CHECK(!text && strstr(sl_error(), "/nonexistent/x.json: cannot open"));
    sl_remove_tree(dir);
}

TEST(not_a_file_names_the_kind) {
    CHECK(sl_not_a_file(S_IFREG | 0644) == NULL);
    CHECK(strstr(sl_not_a_file(S_IFDIR | 0755), "directory"));
    CHECK(strstr(sl_not_a_file(S_IFCHR | 0644), "device"));
}

TEST_MAIN()
