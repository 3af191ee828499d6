/* bench.c - owns the benchmarks' shared pieces: the bare echo server and
 * client, and convgrad problems called through libcgclient. */
#include "bench.h"

#include <malloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "cg/dtype.h"
#include "ts.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bench_percentile(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)(p * (n - 1) + 0.5);
  return v[i];
}

gpr_timespec bench_forever(void) {
  return gpr_inf_future(GPR_CLOCK_REALTIME);
}

bench_proc bench_proc_stat(pid_t pid) {
  bench_proc r = {0, 0};
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  unsigned long long minflt = 0, ut = 0, st = 0;
  /* After the command: state (3), fields 4..9, minflt (10), 11..13,
   * utime (14), stime (15). */
  if (!p ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %llu %*u %*u %*u %llu %llu",
             &minflt, &ut, &st) != 3)
    return r;
  r.cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
  r.minflt = (double)minflt;
  return r;
}

double bench_own_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int echo_batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops,
                      size_t n) {
  if (grpc_call_start_batch(call, ops, n, ops, NULL) != GRPC_CALL_OK)
    return 0;
  grpc_event ev = grpc_completion_queue_next(cq, bench_forever(), NULL);
  return ev.success;
}

/* Serves one call at a time: "/echo/Unary" returns its message,
 * "/echo/Sink" swallows a stream and answers with one small message,
 * "/echo/Source" streams N bytes in 1 MiB messages (N: the request's
 * 8 little-endian bytes). */
static void echo_serve(grpc_server *srv, grpc_completion_queue *cq) {
  /* What Source streams: memory of the requested size, as a result tensor
   * is, not one cache-resident MiB sent over and over. Grown as needed and
   * kept for the child's life. */
  uint8_t *src = NULL;
  uint64_t src_cap = 0;
  for (;;) {
    grpc_call *call = NULL;
    grpc_call_details det;
    grpc_metadata_array md;
    grpc_call_details_init(&det);
    grpc_metadata_array_init(&md);
    if (grpc_server_request_call(srv, &call, &det, &md, cq, cq, &det) !=
        GRPC_CALL_OK)
      return;
    grpc_event ev = grpc_completion_queue_next(cq, bench_forever(), NULL);
    if (!ev.success)
      return;
    char *method = grpc_slice_to_c_string(det.method);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    echo_batch(call, cq, ops, 1);
    grpc_byte_buffer *in = NULL, *out = NULL;
    uint64_t count = 0;
    for (;;) {
      memset(ops, 0, sizeof ops);
      ops[0].op = GRPC_OP_RECV_MESSAGE;
      ops[0].data.recv_message.recv_message = &in;
      if (!echo_batch(call, cq, ops, 1) || !in)
        break;
      if (strcmp(method, "/echo/Unary") == 0) {
        out = in;
        break;
      }
      if (strcmp(method, "/echo/Source") == 0) {
        grpc_byte_buffer_reader r;
        grpc_byte_buffer_reader_init(&r, in);
        grpc_slice s = grpc_byte_buffer_reader_readall(&r);
        for (size_t b = 0; b < 8 && b < GRPC_SLICE_LENGTH(s); b++)
          count |= (uint64_t)GRPC_SLICE_START_PTR(s)[b] << (8 * b);
        grpc_slice_unref(s);
        grpc_byte_buffer_reader_destroy(&r);
        grpc_byte_buffer_destroy(in);
        break;
      }
      grpc_byte_buffer_destroy(in);
      in = NULL;
    }
    if (strcmp(method, "/echo/Sink") == 0) {
      grpc_slice s = grpc_slice_from_static_string("done");
      out = grpc_raw_byte_buffer_create(&s, 1);
    }
    if (count > src_cap) {
      uint8_t *grown = realloc(src, count);
      if (!grown)
        count = 0;
      else {
        src = grown;
        memset(src, 0x5a, count);
        src_cap = count;
      }
    }
    for (uint64_t off = 0; off < count; off += BENCH_BARE_MSG) {
      grpc_slice part = grpc_slice_from_static_buffer(
          src + off,
          count - off < BENCH_BARE_MSG ? count - off : BENCH_BARE_MSG);
      grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&part, 1);
      memset(ops, 0, sizeof ops);
      ops[0].op = GRPC_OP_SEND_MESSAGE;
      ops[0].data.send_message.send_message = bb;
      echo_batch(call, cq, ops, 1);
      grpc_byte_buffer_destroy(bb);
    }
    int cancelled;
    grpc_slice details = grpc_empty_slice();
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (out) {
      ops[n].op = GRPC_OP_SEND_MESSAGE;
      ops[n++].data.send_message.send_message = out;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[n++].data.send_status_from_server.status_details = &details;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &cancelled;
    echo_batch(call, cq, ops, n);
    if (out)
      grpc_byte_buffer_destroy(out);
    gpr_free(method);
    grpc_call_unref(call);
    grpc_call_details_destroy(&det);
    grpc_metadata_array_destroy(&md);
  }
}

int bench_idle_us(const char *arg) {
  int us = atoi(arg);
  return us <= 0 ? 0 : us < 1000000 ? us : 999999;
}

void bench_idle(int us) {
  if (us > 0)
    usleep((useconds_t)us);
}

int bench_last_cpu(void) {
  cpu_set_t set;
  int last = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
      if (CPU_ISSET(cpu, &set))
        last = cpu;
  return last;
}

pid_t bench_echo_start(const char *addrs, int cpu, int *port) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof set, &set);
    }
    /* The malloc settings convgrad-server runs with (server/main.c). With
     * glibc's defaults, whether gRPC's read buffers come from fresh mmaps
     * (page faults, zeroing) or warm heap depends on the order of earlier
     * frees, and the bare uploads ran at 1.4-1.6 GB/s in most processes
     * and 2.8-3.3 GB/s in others: a bound that moved by 2x between runs. */
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 256 * 1024 * 1024);
    grpc_init();
    grpc_server *srv = grpc_server_create(NULL, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv, cq, NULL);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    int p = 0;
    char list[512];
    snprintf(list, sizeof list, "%s", addrs);
    for (char *save, *a = strtok_r(list, ",", &save); a;
         a = strtok_r(NULL, ",", &save)) {
      int got = grpc_server_add_http2_port(srv, a, cr);
      if (got <= 0)
        _exit(1);
      if (!p || strncmp(a, "unix:", 5) != 0)
        p = got; /* the TCP port when there is one */
    }
    grpc_server_credentials_release(cr);
    grpc_server_start(srv);
    if (write(fd[1], &p, sizeof p) != sizeof p)
      _exit(1);
    echo_serve(srv, cq);
    _exit(0);
  }
  close(fd[1]);
  if (read(fd[0], port, sizeof *port) != sizeof *port)
    *port = 0;
  close(fd[0]);
  return pid;
}

/* A client call with its own pluck queue and metadata arrays. */
typedef struct call_state {
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata_array md, tr;
} call_state;

static void open_call(call_state *c, grpc_channel *ch, const char *method) {
  c->cq = grpc_completion_queue_create_for_pluck(NULL);
  c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                     grpc_slice_from_static_string(method),
                                     NULL, bench_forever(), NULL);
  grpc_metadata_array_init(&c->md);
  grpc_metadata_array_init(&c->tr);
}

static void close_call(call_state *c) {
  grpc_metadata_array_destroy(&c->md);
  grpc_metadata_array_destroy(&c->tr);
  grpc_call_unref(c->call);
  grpc_completion_queue_shutdown(c->cq);
  while (grpc_completion_queue_pluck(c->cq, NULL, bench_forever(), NULL).type !=
         GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(c->cq);
}

double bench_echo_call(grpc_channel *ch, const char *method,
                       grpc_byte_buffer *const *send, int nsend,
                       size_t *recv_bytes) {
  double t0 = ts_now_ms();
  call_state c;
  open_call(&c, ch, method);
  grpc_call *call = c.call;
  grpc_completion_queue *cq = c.cq;
  grpc_status_code code;
  grpc_slice details;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n++].data.recv_initial_metadata.recv_initial_metadata = &c.md;
  grpc_call_start_batch(call, ops, n, &c.md, NULL);
  for (int i = 0; i < nsend; i++) {
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_MESSAGE;
    ops[0].data.send_message.send_message = send[i];
    grpc_call_start_batch(call, ops, 1, &ops[5], NULL);
    grpc_completion_queue_pluck(cq, &ops[5], bench_forever(), NULL);
  }
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[1].data.recv_status_on_client.trailing_metadata = &c.tr;
  ops[1].data.recv_status_on_client.status = &code;
  ops[1].data.recv_status_on_client.status_details = &details;
  grpc_call_start_batch(call, ops, 2, &c.tr, NULL);
  grpc_completion_queue_pluck(cq, &c.md, bench_forever(), NULL);
  *recv_bytes = 0;
  for (;;) {
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    grpc_call_start_batch(call, &op, 1, &op, NULL);
    grpc_completion_queue_pluck(cq, &op, bench_forever(), NULL);
    if (!bb)
      break;
    *recv_bytes += grpc_byte_buffer_length(bb);
    grpc_byte_buffer_destroy(bb);
  }
  grpc_completion_queue_pluck(cq, &c.tr, bench_forever(), NULL);
  double t = (ts_now_ms() - t0) / 1e3;
  grpc_slice_unref(details);
  close_call(&c);
  return t;
}

double bench_unary_us(grpc_channel *ch, const char *method,
                      grpc_byte_buffer *msg) {
  double t0 = ts_now_ms();
  call_state c;
  open_call(&c, ch, method);
  grpc_call *call = c.call;
  grpc_completion_queue *cq = c.cq;
  grpc_status_code code = GRPC_STATUS_UNKNOWN;
  grpc_slice details;
  grpc_byte_buffer *answer = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = msg;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &c.md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &answer;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &c.tr;
  ops[5].data.recv_status_on_client.status = &code;
  ops[5].data.recv_status_on_client.status_details = &details;
  if (grpc_call_start_batch(call, ops, 6, ops, NULL) == GRPC_CALL_OK)
    grpc_completion_queue_pluck(cq, ops, bench_forever(), NULL);
  double us = (ts_now_ms() - t0) * 1e3;
  if (answer)
    grpc_byte_buffer_destroy(answer);
  grpc_slice_unref(details);
  close_call(&c);
  return code == GRPC_STATUS_OK ? us : -1;
}

double bench_echo_unary_us(grpc_channel *ch, size_t bytes) {
  static char payload[BENCH_ECHO_MAX];
  grpc_slice sl = grpc_slice_from_static_buffer(
      payload, bytes < sizeof payload ? bytes : sizeof payload);
  grpc_byte_buffer *msg = grpc_raw_byte_buffer_create(&sl, 1);
  double us = bench_unary_us(ch, "/echo/Unary", msg);
  grpc_byte_buffer_destroy(msg);
  return us;
}

int bench_prob_init(bench_prob *p, const cg_bdesc *d, cg_op op, cg_dtype dt) {
  char err[256];
  memset(p, 0, sizeof *p);
  if (cg_bdesc_problem_init(&p->bp, d, op, dt, CG_DATA_DEFAULT,
                            CG_WEIGHTS_DEFAULT, err, sizeof err) != 0 ||
      cg_problem_resolve(&p->bp.problem, &p->g, err, sizeof err) != 0) {
    fprintf(stderr, "%s: %s\n", d->name, err);
    return -1;
  }
  uint64_t seed = 37;
  for (int i = 0; i < 2; i++) {
    p->in[i] = malloc(p->g.in_bytes[i]);
    if (!p->in[i])
      return -1;
    cg_fill_uniform(dt, p->in[i], p->g.in_elems[i], &seed);
  }
  p->out = malloc(p->g.out_bytes);
  return p->out ? 0 : -1;
}

void bench_prob_free(bench_prob *p) {
  free(p->in[0]);
  free(p->in[1]);
  free(p->out);
}

void bench_request_of(cgc_request *r, const bench_prob *p) {
  cgc_request_init(r);
  r->op = p->g.op;
  r->attrs = p->bp.problem.attrs;
  for (int i = 0; i < 2; i++) {
    cgc_tensor_view *v = &r->inputs[i];
    v->dtype = p->g.dtype;
    v->rank = (int)p->bp.problem.input_dims[i].len;
    memcpy(v->dims, p->bp.problem.input_dims[i].v,
           sizeof(int64_t) * (size_t)v->rank);
    v->data = p->in[i];
    v->nbytes = p->g.in_bytes[i];
  }
  if (p->bp.problem.has_shape_input) {
    r->has_shape_input = 1;
    r->shape_input = p->bp.problem.shape_input;
  }
  r->deadline_ms = 600000;
}

int bench_call_into(cgc_channel *ch, const cgc_request *r, void *out,
                    size_t cap, double *ms) {
  cgc_tensor t;
  cgc_status st;
  double t0 = ts_now_ms();
  int rc = cgc_compute_into(ch, r, out, cap, &t, NULL, &st);
  *ms = ts_now_ms() - t0;
  if (rc != 0)
    fprintf(stderr, "  compute failed: %s\n", st.message);
  return rc;
}

int bench_e2e_once(cgc_channel *ch, const bench_prob *p, void *out,
                   double *ms) {
  cgc_request r;
  bench_request_of(&r, p);
  return bench_call_into(ch, &r, out, p->g.out_bytes, ms);
}
