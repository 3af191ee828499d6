/* harness.h - process helpers for the client's end-to-end tests: start a
 * convgrad-server on an ephemeral port and read its readiness line, run
 * the convgrad CLI and capture its output and exit code; and a request
 * with random inputs from a benchdnn descriptor. Every process a
 * test starts is stopped by the test (bounded waits, SIGKILL fallback). */
#ifndef CGC_TEST_HARNESS_H
#define CGC_TEST_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "cg/bdesc.h"
#include "cg/layer.h"
#include "cgc/client.h"

typedef struct th_server {
  pid_t pid;
  int port;
  char target[32]; /* "127.0.0.1:PORT", what cgc_channel_new takes */
  int out_fd;      /* read end of the server's stdout */
  char log[256];   /* the server's stderr (one line per request) */
} th_server;

/* Starts exe --listen 127.0.0.1:PORT (0: ephemeral) plus extra args
 * (NULL-terminated, may be NULL) and waits up to 60 s for the readiness
 * line. Returns 0 with s->port and s->target set, -1 on failure (message
 * on stderr). */
int th_server_start(th_server *s, const char *exe, int port,
                    const char *const *extra);
/* SIGTERM, wait up to 30 s, then SIGKILL. Safe on a zeroed struct. */
void th_server_stop(th_server *s);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int th_free_port(void);

/* Lines of path containing needle. */
int th_count_lines(const char *path, const char *needle);

typedef struct th_run {
  int code; /* exit code; 128+N when killed by signal N; -1 spawn failed */
  char out[65536];
  char err[8192];
} th_run;

/* Spawns argv (argv[0] a path) with stdout/stderr to temp files. */
pid_t th_spawn(const char *const *argv, char *outpath, char *errpath);
/* Waits up to timeout_s for pid, reading the captured files into r. */
void th_collect(pid_t pid, int timeout_s, const char *outpath,
                const char *errpath, th_run *r);
/* th_spawn + th_collect with a 300 s bound. */
void th_run_cmd(th_run *r, const char *const *argv);

/* Writes text to path; 0 or -1. */
int th_write_file(const char *path, const char *text);

/* A request of benchdnn descriptor desc for op in dtype dt and data
 * layout df, with random inputs it owns (in[], drawn from seed), and its
 * resolved layer. */
typedef struct th_problem {
  cg_bdesc_problem bp;
  cg_layer layer;
  cgc_request req;
  void *in[3];
} th_problem;
/* Returns 0, or -1 (message on stderr; th_problem_free still applies). */
int th_problem_init(th_problem *p, const char *desc, cg_op op, cg_dtype dt,
                    cg_data_format df, uint64_t seed);
void th_problem_free(th_problem *p);

/* At exit, unlinks this process's shared-memory objects, the ones
 * cgc_region_create names (/dev/shm/PREFIX<pid>-..., PREFIX convgrad- or
 * cgtest-) and the tests' own (/dev/shm/convgrad-WORD-<pid>...): a failed
 * assertion leaves its test without the cgc_region_free that would have,
 * and cmocka goes on to the next test and returns. */
void th_shm_unlink_at_exit(void);

#endif
