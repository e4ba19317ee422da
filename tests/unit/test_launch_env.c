// test_launch_env.c: launch-environment detection for each launcher (shardlm, torchrun, Open MPI,
// MPICH/Hydra, SLURM, none) from variables set with setenv, launcher priority, SLURM hostlist and
// tasks-per-node parsing, malformed and inconsistent values (errors name the variable), exporting
// torchrun's names, and rank-aware logging (log.h) to per-rank files.
#include <stdio.h>
#include <unistd.h>

#include "shardlm/error.h"
#include "shardlm/launch_env.h"
#include "shardlm/log.h"
#include "test.h"

static const char *all_vars[] = {
    "SHARDLM_RANK", "SHARDLM_WORLD_SIZE", "SHARDLM_LOCAL_RANK", "SHARDLM_LOCAL_WORLD_SIZE", "SHARDLM_NODE_RANK",
    "SHARDLM_MASTER_ADDR", "SHARDLM_MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

static int detect(sl_launch_env *e) {
    int rc = sl_launch_env_detect(e);
    CHECK_MSG(rc == 0, "%s", sl_error());
    return rc;
}

// Detection must fail with a message containing `needle`.
static void expect_error(const char *needle) {
    sl_launch_env e;
    CHECK(sl_launch_env_detect(&e) == -1);
    CHECK_MSG(strstr(sl_error(), needle) != NULL, "expected \"%s\" in \"%s\"", needle, sl_error());
}

TEST(no_launcher_is_one_process) {
    clear_env();
    sl_launch_env e;
    if (detect(&e)) return;
    CHECK(e.launcher == SL_LAUNCHER_NONE);
    CHECK(e.rank == 0 && e.world_size == 1 && e.local_rank == 0 && e.local_world_size == 1 && e.node_rank == 0);
    CHECK(strcmp(e.master_addr, "127.0.0.1") == 0 && e.master_port == 29500);
    CHECK(strcmp(sl_launcher_name(e.launcher), "none") == 0);
}

TEST(shardlm_launcher) {
    clear_env();
    setenv("SHARDLM_RANK", "5", 1);
    setenv("SHARDLM_WORLD_SIZE", "8", 1);
    setenv("SHARDLM_LOCAL_RANK", "1", 1);
    setenv("SHARDLM_LOCAL_WORLD_SIZE", "4", 1);
    setenv("SHARDLM_NODE_RANK", "1", 1);
    setenv("SHARDLM_MASTER_ADDR", "head0", 1);
    setenv("SHARDLM_MASTER_PORT", "1234", 1);
    setenv("MASTER_ADDR", "ignored", 1);
    setenv("RANK", "0", 1);   // torchrun's names come second
    setenv("WORLD_SIZE", "2", 1);
    sl_launch_env e;
    if (detect(&e)) return;
    CHECK(e.launcher == SL_LAUNCHER_SHARDLM);
    CHECK(e.rank == 5 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 4 && e.node_rank == 1);
    CHECK(strcmp(e.master_addr, "head0") == 0 && e.master_port == 1234);
    // Only the required pair: one node holding the job.
    clear_env();
    setenv("SHARDLM_RANK", "2", 1);
    setenv("SHARDLM_WORLD_SIZE", "3", 1);
    if (detect(&e)) return;
    CHECK(e.local_rank == 2 && e.local_world_size == 3 && e.node_rank == 0);
    clear_env();
    setenv("SHARDLM_RANK", "2", 1);
    expect_error("SHARDLM_WORLD_SIZE is not");
}

TEST(torchrun) {
    clear_env();
    setenv("RANK", "6", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "2", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("GROUP_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "29400", 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);   // lower priority
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    sl_launch_env e;
    if (detect(&e)) return;
    CHECK(e.launcher == SL_LAUNCHER_TORCHRUN);
    CHECK(e.rank == 6 && e.world_size == 8 && e.local_rank == 2 && e.local_world_size == 4 && e.node_rank == 1);
    CHECK(strcmp(e.master_addr, "10.0.0.1") == 0 && e.master_port == 29400);
    unsetenv("GROUP_RANK");
    setenv("NODE_RANK", "1", 1);
    if (detect(&e)) return;
    CHECK(e.node_rank == 1);
    // RANK alone is not enough to mean torchrun.
    clear_env();
    setenv("RANK", "3", 1);
    if (detect(&e)) return;
    CHECK(e.launcher == SL_LAUNCHER_NONE && e.world_size == 1);
}

TEST(open_mpi) {
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_NODE_RANK", "1", 1);
    sl_launch_env e;
    if (detect(&e)) return;
    CHECK(e.launcher == SL_LAUNCHER_OPENMPI);
    CHECK(e.rank == 3 && e.world_size == 4 && e.local_rank == 1 && e.local_world_size == 2);
    CHECK(e.node_rank == 1);   // rank / local_world_size
    CHECK(strcmp(e.master_addr, "127.0.0.1") == 0);
    setenv("MASTER_ADDR", "nodeA", 1);
    if (detect(&e)) return;
    CHECK(strcmp(e.master_addr, "nodeA") == 0);
}

TEST(mpich_hydra) {
    clear_env();
    setenv("PMI_RANK", "4", 1);
    setenv("PMI_SIZE", "6", 1);
    setenv("MPI_LOCALRANKID", "1", 1);
    setenv("MPI_LOCALNRANKS", "3", 1);
    sl_launch_env e;
    if (detect(&e)) return;
    CHECK(e.launcher == SL_LAUNCHER_MPICH);
    CHECK(e.rank == 4 && e.world_size == 6 && e.local_rank == 1 && e.local_world_size == 3 && e.node_rank == 1);
}

TEST(slurm_srun) {
    clear_env();
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "7", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x3),1", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[07-09,12],login", 1);
    sl_launch_env e;
    if (detect(&e)) return;
    CHECK(e.launcher == SL_LAUNCHER_SLURM);
    CHECK(e.rank == 5 && e.world_size == 7 && e.local_rank == 1 && e.local_world_size == 2 && e.node_rank == 2);
    CHECK_MSG(strcmp(e.master_addr, "gpu07") == 0, "%s", e.master_addr);
    // The step's own values win over the job's.
    setenv("SLURM_STEP_NUM_TASKS", "6", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "3(x2)", 1);
    setenv("SLURM_STEP_NODELIST", "a[3-4]", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_PROCID", "4", 1);
    if (detect(&e)) return;
    CHECK(e.world_size == 6 && e.local_world_size == 3 && e.node_rank == 1);
    CHECK(strcmp(e.master_addr, "a3") == 0);
    // MASTER_ADDR overrides the hostlist.
    setenv("MASTER_ADDR", "chosen", 1);
    if (detect(&e)) return;
    CHECK(strcmp(e.master_addr, "chosen") == 0);
    // --ntasks-per-node without a list.
    clear_env();
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "1", 1);
    if (detect(&e)) return;
    CHECK(e.local_world_size == 2 && e.node_rank == 1);
    clear_env();
    setenv("SLURM_PROCID", "0", 1);
    expect_error("SLURM_NTASKS");
}

TEST(hostlist_parsing) {
    int n = 0;
    char host[64];
    CHECK(sl_hostlist_count("node[01-04,07]", &n) == 0 && n == 5);
    CHECK(sl_hostlist_nth("node[01-04,07]", 0, host, sizeof host) == 0 && strcmp(host, "node01") == 0);
    CHECK(sl_hostlist_nth("node[01-04,07]", 3, host, sizeof host) == 0 && strcmp(host, "node04") == 0);
    CHECK(sl_hostlist_nth("node[01-04,07]", 4, host, sizeof host) == 0 && strcmp(host, "node07") == 0);
    CHECK(sl_hostlist_nth("node[01-04,07]", 5, host, sizeof host) == -1);
    CHECK(strstr(sl_error(), "has 5 hosts") != NULL);
    CHECK(sl_hostlist_count("a,b[1-3]-ib,c[9-11]", &n) == 0 && n == 7);
    CHECK(sl_hostlist_nth("a,b[1-3]-ib,c[9-11]", 2, host, sizeof host) == 0 && strcmp(host, "b2-ib") == 0);
    CHECK(sl_hostlist_nth("a,b[1-3]-ib,c[9-11]", 6, host, sizeof host) == 0 && strcmp(host, "c11") == 0);
    CHECK(sl_hostlist_nth("single", 0, host, sizeof host) == 0 && strcmp(host, "single") == 0);
    const char *bad[] = {"", "node[1-", "node[]", "node[3-1]", "node[1,]", "a,", ",a", "n[1]x[2]", "n[a]", "n[1-2x]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(sl_hostlist_count(bad[i], &n) == -1, "\"%s\" accepted", bad[i]);
    CHECK(sl_hostlist_nth("verylonghostname", 0, host, 4) == -1);
}

TEST(tasks_per_node_parsing) {
    int t = 0;
    CHECK(sl_slurm_tasks_on_node("2(x3),1", 0, &t) == 0 && t == 2);
    CHECK(sl_slurm_tasks_on_node("2(x3),1", 2, &t) == 0 && t == 2);
    CHECK(sl_slurm_tasks_on_node("2(x3),1", 3, &t) == 0 && t == 1);
    CHECK(sl_slurm_tasks_on_node("4", 0, &t) == 0 && t == 4);
    CHECK(sl_slurm_tasks_on_node("1,3(x2)", 2, &t) == 0 && t == 3);
    CHECK(sl_slurm_tasks_on_node("2(x3),1", 4, &t) == -1);
    CHECK(strstr(sl_error(), "covers 4 nodes") != NULL);
    const char *bad[] = {"", "x", "2(x)", "2(x0)", "2(3)", "2,", "2(x2", "2;3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(sl_slurm_tasks_on_node(bad[i], 0, &t) == -1, "\"%s\" accepted", bad[i]);
}

TEST(malformed_values_name_the_variable) {
    struct {
        const char *rank_var, *rank, *size_var, *size, *needle;
    } cases[] = {
        {"RANK", "x1", "WORLD_SIZE", "4", "RANK=\"x1\""},
        {"RANK", "-1", "WORLD_SIZE", "4", "RANK=\"-1\""},
        {"RANK", "1", "WORLD_SIZE", "4 ", "WORLD_SIZE=\"4 \""},
        {"RANK", "4", "WORLD_SIZE", "4", "RANK=4 is not below"},
        {"RANK", "0", "WORLD_SIZE", "0", "WORLD_SIZE is 0"},
        {"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "99999999999", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "2.5", "PMI_SIZE", "4", "PMI_RANK"},
        {"SLURM_PROCID", "7", "SLURM_NTASKS", "4", "SLURM_PROCID=7"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_env();
        setenv(cases[i].rank_var, cases[i].rank, 1);
        setenv(cases[i].size_var, cases[i].size, 1);
        expect_error(cases[i].needle);
    }
    clear_env();
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "2", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    expect_error("LOCAL_RANK=2 is not below the local world size 2");
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "8", 1);
    expect_error("local world size 8");
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_PORT", "70000", 1);
    expect_error("MASTER_PORT=70000");
    setenv("MASTER_PORT", "http", 1);
    expect_error("MASTER_PORT=\"http\"");
    unsetenv("MASTER_PORT");
    setenv("GROUP_RANK", "one", 1);
    expect_error("GROUP_RANK");
    clear_env();
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x", 1);
    expect_error("SLURM_TASKS_PER_NODE");
    setenv("SLURM_TASKS_PER_NODE", "2", 1);
    setenv("SLURM_JOB_NODELIST", "n[1-", 1);
    expect_error("SLURM_JOB_NODELIST");
    clear_env();
}

TEST(export_sets_torchrun_names) {
    clear_env();
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
    setenv("SLURM_JOB_NODELIST", "cn[100-101]", 1);
    sl_launch_env e;
    if (detect(&e)) return;
    clear_env();
    CHECK(sl_launch_env_export(&e) == 0);
    CHECK(strcmp(getenv("RANK"), "3") == 0);
    CHECK(strcmp(getenv("WORLD_SIZE"), "4") == 0);
    CHECK(strcmp(getenv("LOCAL_RANK"), "1") == 0);
    CHECK(strcmp(getenv("LOCAL_WORLD_SIZE"), "2") == 0);
    CHECK(strcmp(getenv("NODE_RANK"), "1") == 0);
    CHECK(strcmp(getenv("MASTER_ADDR"), "cn100") == 0);
    CHECK(strcmp(getenv("MASTER_PORT"), "29500") == 0);
    // Round trip: the exported names detect as torchrun with the same values.
    sl_launch_env t;
    if (detect(&t)) return;
    CHECK(t.launcher == SL_LAUNCHER_TORCHRUN && t.rank == 3 && t.world_size == 4 && t.local_rank == 1 &&
          t.local_world_size == 2 && t.node_rank == 1 && strcmp(t.master_addr, "cn100") == 0);
    CHECK(sl_launch_env_export(NULL) == -1);
    clear_env();
}

static int file_contains(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, needle) != NULL;
}

TEST(log_files_per_rank) {
    char dir[] = "/tmp/shardlm_test_log_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    char sub[256], path[320];
    snprintf(sub, sizeof sub, "%s/logs/run1", dir);
    CHECK_MSG(sl_log_init(1, 2, sub, 0) == 0, "%s", sl_error());
    sl_log(SL_LOG_INFO, "hello from rank %d", 1);   // not printed (rank 1), but written to the file
    sl_log(SL_LOG_DEBUG, "hidden debug line");
    sl_log(SL_LOG_WARN, "careful\n");
    sl_log_close();
    snprintf(path, sizeof path, "%s/rank_1.log", sub);
    CHECK(file_contains(path, "[rank 1] hello from rank 1\n"));
    CHECK(file_contains(path, "[rank 1] warning: careful\n"));
    CHECK(!file_contains(path, "hidden"));
    // Appends on the next run.
    CHECK(sl_log_init(1, 2, sub, 1) == 0);
    sl_log_set_level(SL_LOG_DEBUG);
    sl_log(SL_LOG_DEBUG, "second run");
    sl_log_close();
    sl_log_set_level(SL_LOG_INFO);
    CHECK(file_contains(path, "hello from rank 1") && file_contains(path, "debug: second run"));
    CHECK(sl_log_init(2, 2, NULL, 0) == -1);
    CHECK(strstr(sl_error(), "rank 2 of world size 2") != NULL);
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    CHECK(sl_log_init(0, 1, path, 0) == -1);   // a file where the directory should be
    CHECK(strstr(sl_error(), path) != NULL);
    sl_log_close();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN()
