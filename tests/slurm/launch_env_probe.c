// launch_env_probe.c: prints what sl_launch_env_detect reads from this process's environment, one
// line: "probe LAUNCHER | rank R of W | local L of LW | node N | master ADDR:PORT". Built by
// tests/cli/test_slurm.sh and tests/cli/test_two_nodes.sh against the build's libshardlm.a and run
// under srun / mpirun, so the tests see the library's own view of each launcher's variables.
#include <stdio.h>

#include "shardlm/error.h"
#include "shardlm/launch_env.h"

int main(void) {
    sl_launch_env env;
    if (sl_launch_env_detect(&env) != 0) {
        fprintf(stderr, "probe error: %s\n", sl_error());
        return 1;
    }
    printf("probe %s | rank %d of %d | local %d of %d | node %d | master %s:%d\n", sl_launcher_name(env.launcher),
           env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank, env.master_addr,
           env.master_port);
    return 0;
}
