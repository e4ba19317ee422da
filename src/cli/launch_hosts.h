// launch_hosts.h: the resource pool of `shardlm launch`: which hosts take part and which slots
// (device indices) on each, resolved DeepSpeed's way: a hostfile (`host slots=N` lines) or the
// local host, optionally capped by --num_nodes / --num_gpus, then filtered by --include or
// --exclude ("host1:0,1@host2" syntax). Rank order is hosts in hostfile order, slots ascending.
// Functions return 0 on success and -1 with sl_errorf() set (message names file, line or host).
#ifndef SHARDLM_CLI_LAUNCH_HOSTS_H
#define SHARDLM_CLI_LAUNCH_HOSTS_H

#define SL_LAUNCH_HOST_NAME_MAX 256

typedef struct {
    char name[SL_LAUNCH_HOST_NAME_MAX];
    int slot_count;  // selected slots on this host
    int *slots;      // (slot_count) selected slot indices, ascending: the host's CUDA_VISIBLE_DEVICES
} sl_launch_host;

typedef struct {
    sl_launch_host *hosts;  // (count) in hostfile order
    int count;
} sl_host_pool;

void sl_host_pool_free(sl_host_pool *pool);

// Appends `name` with slots 0..nslots-1; a duplicate name or nslots < 1 is an error.
int sl_host_pool_add(sl_host_pool *pool, const char *name, int nslots);

// Parses hostfile text (`source` names it in errors): `host slots=N` per line, '#' comments and
// blank lines allowed. Appends to `pool` (which should be empty).
int sl_hostfile_parse(const char *text, const char *source, sl_host_pool *pool);
int sl_hostfile_read(const char *path, sl_host_pool *pool);

// Keeps the first num_nodes hosts and the first num_gpus slots of each (-1: no cap). Asking for
// more than the pool has is an error.
int sl_host_pool_limit(sl_host_pool *pool, int num_nodes, int num_gpus);

// DeepSpeed's --include / --exclude (NULL or "" = not given; both given is an error).
// include keeps only the named hosts (all their slots, or the listed ones); exclude removes the
// named slots (or whole hosts). Naming an unknown host or slot is an error; hosts left without
// slots are dropped; an empty result is an error.
int sl_host_pool_filter(sl_host_pool *pool, const char *include, const char *exclude);

// The highest slot index a filter spec names for `host` (-1 if none): sizes the implicit local pool.
int sl_host_spec_max_slot(const char *spec, const char *host);

// True if `host` is in the pool with `slot` selected.
int sl_host_pool_has_slot(const sl_host_pool *pool, const char *host, int slot);

// Total selected slots = world size.
int sl_host_pool_world_size(const sl_host_pool *pool);

// Writes "0,1,3" (the host's selected slots) into buf; returns 0, or -1 when cap is too small.
int sl_host_slots_string(const sl_launch_host *host, char *buf, int cap);

#endif
