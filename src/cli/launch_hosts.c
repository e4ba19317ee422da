// launch_hosts.c: hostfile parsing and DeepSpeed's --include/--exclude filtering (see launch_hosts.h).
// Invariants: host names in a pool are unique; every host has slot_count >= 1 after a filter;
// each host's slots are ascending and distinct.
#include "cli/launch_hosts.h"

#include "shardlm/error.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sl_host_pool_free(sl_host_pool *pool) {
    for (int i = 0; i < pool->count; i++) free(pool->hosts[i].slots);
    free(pool->hosts);
    pool->hosts = NULL;
    pool->count = 0;
}

static int pool_find(const sl_host_pool *pool, const char *name) {
    for (int i = 0; i < pool->count; i++)
        if (strcmp(pool->hosts[i].name, name) == 0) return i;
    return -1;
}

int sl_host_pool_add(sl_host_pool *pool, const char *name, int nslots) {
    if (!name[0]) return sl_errorf("empty host name");
    if (strlen(name) >= SL_LAUNCH_HOST_NAME_MAX) return sl_errorf("host name '%.40s...' is too long", name);
    if (nslots < 1) return sl_errorf("host '%s': slots must be at least 1, got %d", name, nslots);
    if (nslots > 1 << 20) return sl_errorf("host '%s': %d slots is too many", name, nslots);
    if (pool_find(pool, name) >= 0) return sl_errorf("host '%s' is listed more than once", name);
    sl_launch_host *grown = realloc(pool->hosts, (size_t)(pool->count + 1) * sizeof *grown);
    if (!grown) return sl_errorf("out of memory adding host '%s'", name);
    pool->hosts = grown;
    sl_launch_host *h = &pool->hosts[pool->count];
    memset(h, 0, sizeof *h);
    h->slots = sl_malloc((size_t)nslots * sizeof(int), "host slots");
    if (!h->slots) return -1;
    snprintf(h->name, sizeof h->name, "%s", name);
    h->slot_count = nslots;
    for (int s = 0; s < nslots; s++) h->slots[s] = s;
    pool->count++;
    return 0;
}

// Parses a non-negative decimal integer filling [s, s+n); -1 if malformed.
static long parse_count(const char *s, size_t n) {
    if (n == 0 || n > 9) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

// One hostfile line without its comment: "host slots=N" (whitespace-separated, nothing else).
static int parse_hostfile_line(char *line, const char *source, int lineno, sl_host_pool *pool) {
    char *words[3];
    int nwords = 0;
    for (char *tok = strtok(line, " \t\r"); tok; tok = strtok(NULL, " \t\r")) {
        if (nwords == 3) break;
        words[nwords++] = tok;
    }
    if (nwords == 0) return 0;
    if (nwords != 2 || strncmp(words[1], "slots=", 6) != 0)
        return sl_errorf("%s:%d: expected 'HOST slots=N', found '%s%s%s'", source, lineno, words[0],
                         nwords > 1 ? " " : "", nwords > 1 ? words[1] : "");
    long n = parse_count(words[1] + 6, strlen(words[1] + 6));
    if (n < 1) return sl_errorf("%s:%d: slots must be a positive integer, found '%s'", source, lineno, words[1] + 6);
    if (pool_find(pool, words[0]) >= 0)
        return sl_errorf("%s:%d: host '%s' is listed more than once", source, lineno, words[0]);
    if (sl_host_pool_add(pool, words[0], (int)n) != 0) return sl_error_context("%s:%d: ", source, lineno);
    return 0;
}

int sl_hostfile_parse(const char *text, const char *source, sl_host_pool *pool) {
    int lineno = 0;
    const char *p = text;
    while (*p) {
        lineno++;
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *line = sl_malloc(len + 1, "hostfile line");
        if (!line) return -1;
        memcpy(line, p, len);
        line[len] = '\0';
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        int rc = parse_hostfile_line(line, source, lineno, pool);
        free(line);
        if (rc != 0) return -1;
        p += len + (end ? 1 : 0);
    }
    if (pool->count == 0) return sl_errorf("%s: no hosts listed (expected lines 'HOST slots=N')", source);
    return 0;
}

int sl_hostfile_read(const char *path, sl_host_pool *pool) {
    FILE *f = fopen(path, "rb");
    if (!f) return sl_errorf("hostfile %s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *text = sl_malloc(cap, "hostfile");
    if (!text) { fclose(f); return -1; }
    size_t got;
    while ((got = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            if (cap >= (1u << 24)) { free(text); fclose(f); return sl_errorf("hostfile %s: larger than 16 MiB", path); }
            char *grown = realloc(text, cap * 2);
            if (!grown) { free(text); fclose(f); return sl_errorf("hostfile %s: out of memory", path); }
            text = grown;
            cap *= 2;
        }
    }
    int read_error = ferror(f);
    fclose(f);
    text[len] = '\0';
    if (read_error) { free(text); return sl_errorf("hostfile %s: read error", path); }
    if (memchr(text, '\0', len)) { free(text); return sl_errorf("hostfile %s: contains a NUL byte (not a text file)", path); }
    int rc = sl_hostfile_parse(text, path, pool);
    free(text);
    return rc;
}

int sl_host_pool_limit(sl_host_pool *pool, int num_nodes, int num_gpus) {
    // check everything first so that a refused cap leaves the pool as it was
    int nodes = num_nodes >= 0 ? num_nodes : pool->count;
    if (num_nodes >= 0 && num_nodes < 1) return sl_errorf("--num_nodes must be at least 1, got %d", num_nodes);
    if (nodes > pool->count)
        return sl_errorf("--num_nodes %d asks for more hosts than the %d available", num_nodes, pool->count);
    if (num_gpus >= 0) {
        if (num_gpus < 1) return sl_errorf("--num_gpus must be at least 1, got %d", num_gpus);
        for (int i = 0; i < nodes; i++)
            if (num_gpus > pool->hosts[i].slot_count)
                return sl_errorf("--num_gpus %d asks for more slots than host '%s' has (%d)", num_gpus,
                                 pool->hosts[i].name, pool->hosts[i].slot_count);
    }
    for (int i = nodes; i < pool->count; i++) free(pool->hosts[i].slots);
    pool->count = nodes;
    if (num_gpus >= 0)
        for (int i = 0; i < pool->count; i++) pool->hosts[i].slot_count = num_gpus;
    return 0;
}

static int host_has_slot(const sl_launch_host *h, int slot) {
    for (int i = 0; i < h->slot_count; i++)
        if (h->slots[i] == slot) return 1;
    return 0;
}

static void describe_slots(const sl_launch_host *h, char *buf, int cap) {
    if (sl_host_slots_string(h, buf, cap) != 0) snprintf(buf, (size_t)cap, "%d slots", h->slot_count);
}

// One node spec of a filter, "host" or "host:0,1,3", split into name and slot list.
// Returns the number of slots (0 = whole host), or -1 with an error.
static int parse_node_spec(const char *spec, size_t len, const char *flag, char *name, int *slots, int max_slots) {
    const char *colon = memchr(spec, ':', len);
    size_t name_len = colon ? (size_t)(colon - spec) : len;
    if (name_len == 0) return sl_errorf("%s: empty host name in '%.*s'", flag, (int)len, spec);
    if (name_len >= SL_LAUNCH_HOST_NAME_MAX) return sl_errorf("%s: host name too long", flag);
    memcpy(name, spec, name_len);
    name[name_len] = '\0';
    if (!colon) return 0;
    int n = 0;
    const char *p = colon + 1, *end = spec + len;
    if (p == end) return sl_errorf("%s: host '%s' has ':' but no slot list", flag, name);
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        long v = parse_count(p, (size_t)(stop - p));
        if (v < 0)
            return sl_errorf("%s: slot '%.*s' on host '%s' is not a non-negative integer", flag, (int)(stop - p), p, name);
        if (n == max_slots) return sl_errorf("%s: too many slots listed for host '%s'", flag, name);
        slots[n++] = (int)v;
        if (!comma) break;
        p = comma + 1;
    }
    return n;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

enum { SPEC_MAX_SLOTS = 4096 };

int sl_host_spec_max_slot(const char *spec, const char *host) {
    int best = -1;
    if (!spec || !spec[0]) return -1;
    int *slots = malloc(SPEC_MAX_SLOTS * sizeof(int));
    if (!slots) return -1;
    char name[SL_LAUNCH_HOST_NAME_MAX];
    const char *p = spec;
    for (;;) {
        const char *at = strchr(p, '@');
        size_t len = at ? (size_t)(at - p) : strlen(p);
        int n = parse_node_spec(p, len, "spec", name, slots, SPEC_MAX_SLOTS);
        if (n > 0 && strcmp(name, host) == 0)
            for (int i = 0; i < n; i++)
                if (slots[i] > best) best = slots[i];
        if (!at) break;
        p = at + 1;
    }
    free(slots);
    return best;
}

// Applies one filter (include = 1 builds from nothing, include = 0 removes from the pool).
static int apply_filter(sl_host_pool *pool, const char *spec, int include) {
    const char *flag = include ? "--include" : "--exclude";
    int count = pool->count;
    // chosen[h][s] over each host's current slot list; for include start empty, for exclude start full
    char **chosen = calloc((size_t)count, sizeof *chosen);
    int *slots = malloc(SPEC_MAX_SLOTS * sizeof(int));
    int rc = -1;
    if (!chosen || !slots) { sl_errorf("out of memory parsing %s", flag); goto done; }
    for (int h = 0; h < count; h++) {
        chosen[h] = malloc((size_t)pool->hosts[h].slot_count);
        if (!chosen[h]) { sl_errorf("out of memory parsing %s", flag); goto done; }
        memset(chosen[h], include ? 0 : 1, (size_t)pool->hosts[h].slot_count);
    }
    char name[SL_LAUNCH_HOST_NAME_MAX];
    const char *p = spec;
    for (;;) {
        const char *at = strchr(p, '@');
        size_t len = at ? (size_t)(at - p) : strlen(p);
        int n = parse_node_spec(p, len, flag, name, slots, SPEC_MAX_SLOTS);
        if (n < 0) goto done;
        int h = pool_find(pool, name);
        if (h < 0) {
            sl_errorf("%s: host '%s' is not in the host pool (%s%s)", flag, name, pool->hosts[0].name,
                      count > 1 ? ", ..." : "");
            goto done;
        }
        sl_launch_host *host = &pool->hosts[h];
        if (n == 0) {
            memset(chosen[h], include ? 1 : 0, (size_t)host->slot_count);
        } else {
            for (int i = 0; i < n; i++) {
                int idx = -1;
                for (int s = 0; s < host->slot_count; s++)
                    if (host->slots[s] == slots[i]) idx = s;
                if (idx < 0) {
                    char have[256];
                    describe_slots(host, have, sizeof have);
                    sl_errorf("%s: no slot %d on host '%s' (it has slots %s)", flag, slots[i], name, have);
                    goto done;
                }
                chosen[h][idx] = include ? 1 : 0;
            }
        }
        if (!at) break;
        p = at + 1;
    }
    // compact: keep chosen slots, drop hosts left empty (hostfile order is kept)
    int kept = 0;
    for (int h = 0; h < count; h++) {
        sl_launch_host host = pool->hosts[h];
        int m = 0;
        for (int s = 0; s < host.slot_count; s++)
            if (chosen[h][s]) host.slots[m++] = host.slots[s];
        host.slot_count = m;
        if (m == 0) { free(host.slots); continue; }
        qsort(host.slots, (size_t)m, sizeof(int), cmp_int);
        pool->hosts[kept++] = host;
    }
    pool->count = kept;
    if (kept == 0) { sl_errorf("%s '%s' leaves no slots to run on", flag, spec); goto done; }
    rc = 0;
done:
    if (chosen)
        for (int h = 0; h < count; h++) free(chosen[h]);
    free(chosen);
    free(slots);
    return rc;
}

int sl_host_pool_filter(sl_host_pool *pool, const char *include, const char *exclude) {
    int has_inc = include && include[0], has_exc = exclude && exclude[0];
    if (has_inc && has_exc) return sl_errorf("--include and --exclude cannot be used together");
    if (!has_inc && !has_exc) return 0;
    if (pool->count == 0) return sl_errorf("no hosts to filter");
    return apply_filter(pool, has_inc ? include : exclude, has_inc);
}

int sl_host_pool_world_size(const sl_host_pool *pool) {
    int n = 0;
    for (int i = 0; i < pool->count; i++) n += pool->hosts[i].slot_count;
    return n;
}

int sl_host_slots_string(const sl_launch_host *host, char *buf, int cap) {
    int off = 0;
    if (cap < 1) return -1;
    buf[0] = '\0';
    for (int i = 0; i < host->slot_count; i++) {
        int w = snprintf(buf + off, (size_t)(cap - off), "%s%d", i ? "," : "", host->slots[i]);
        if (w < 0 || w >= cap - off) return -1;
        off += w;
    }
    return 0;
}

int sl_host_pool_has_slot(const sl_host_pool *pool, const char *host, int slot) {
    int h = pool_find(pool, host);
    return h >= 0 && host_has_slot(&pool->hosts[h], slot);
}
