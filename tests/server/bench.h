/* bench.h - what the server's benchmarks share (bench.c): percentiles,
 * a bare gRPC C-core echo server in a child process with its client, and
 * convgrad problems called through libcgclient. Benchmarks print figures
 * and assert nothing. */
#ifndef BENCH_H
#define BENCH_H

#include <stddef.h>
#include <sys/types.h>

#include <grpc/grpc.h>

#include "cg/bdesc.h"
#include "cg/problem.h"
#include "cgc/client.h"

/* Largest message bench_echo_unary_us sends. */
#define BENCH_ECHO_MAX 4096
/* Message size of the bare server's streams (/echo/Source). */
#define BENCH_BARE_MSG ((uint64_t)1 << 20)

/* The p-quantile of v[n] (sorts v). */
double bench_percentile(double *v, int n, double p);
gpr_timespec bench_forever(void);
/* The last core this process may use. */
int bench_last_cpu(void);
/* An --idle-us argument: microseconds, 0 to 999,999 (usleep's range). */
int bench_idle_us(const char *arg);
/* Sleeps us microseconds (nothing for 0). */
void bench_idle(int us);
/* What /proc/PID/stat says of pid, all threads: user + system CPU
 * seconds (in clock ticks) and minor page faults. Zeros when unreadable. */
typedef struct bench_proc {
  double cpu_s;
  double minflt;
} bench_proc;
bench_proc bench_proc_stat(pid_t pid);
/* CPU seconds this process has used, all threads. */
double bench_own_cpu_seconds(void);

/* Forks the bare echo server (no convgrad code, convgrad-server's malloc
 * settings) listening on addrs, a comma list of "127.0.0.1:0" and
 * "unix:PATH" entries, pinned to cpu unless it is negative; call it
 * before grpc_init. Returns its pid and writes its TCP port (the last
 * entry's when all are unix sockets: non-zero once it listens). Methods:
 * "/echo/Unary" returns its message, "/echo/Sink" swallows a stream and
 * answers one small message, "/echo/Source" streams N bytes in
 * BENCH_BARE_MSG messages (N: the request's 8 little-endian bytes); one
 * call at a time. */
pid_t bench_echo_start(const char *addrs, int cpu, int *port);
/* One raw call of method sending send[nsend], on a fresh pluck queue;
 * returns seconds and the bytes received. */
double bench_echo_call(grpc_channel *ch, const char *method,
                       grpc_byte_buffer *const *send, int nsend,
                       size_t *recv_bytes);
/* One call of method as a lean unary client makes it: one batch sending
 * msg (gRPC takes its slices: pass a copy to send it again) with the
 * half-close and taking the first answer message and the status. Returns
 * microseconds, or a negative figure when the status is not OK. */
double bench_unary_us(grpc_channel *ch, const char *method,
                      grpc_byte_buffer *msg);
/* One unary echo of bytes (at most BENCH_ECHO_MAX), as bench_unary_us. */
double bench_echo_unary_us(grpc_channel *ch, size_t bytes);

/* A convgrad problem with random inputs and room for its output. */
typedef struct bench_prob {
  cg_bdesc_problem bp;
  cg_geom g;
  void *in[2], *out;
} bench_prob;

/* Returns 0, or -1 after printing why. */
int bench_prob_init(bench_prob *p, const cg_bdesc *d, cg_op op, cg_dtype dt);
void bench_prob_free(bench_prob *p);
/* The request of p, its tensors sent from p's inputs. */
void bench_request_of(cgc_request *r, const bench_prob *p);
/* One call of r whose result lands in out (cap bytes), as a trainer
 * reusing its gradient buffers would receive it; *ms its time. Returns 0
 * or the client's error code (printed). */
int bench_call_into(cgc_channel *ch, const cgc_request *r, void *out,
                    size_t cap, double *ms);
/* One call of p into out. */
int bench_e2e_once(cgc_channel *ch, const bench_prob *p, void *out, double *ms);

#endif
