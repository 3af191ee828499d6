/* ts.c - owns the e2e test support: server processes, raw gRPC calls and
 * reference-checked problems (see ts.h). */
#include "ts.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "cg/dtype.h"
#include "cg/reference.h"
#include "cgw.h"
#include "grpc/health/v1/health.pb-c.h"

double ts_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the server process ---- */

int ts_server_start(ts_server *s, const char *const *args) {
  return ts_server_start_bin(s, CGS_SERVER_PATH, args);
}

int ts_server_start_bin(ts_server *s, const char *path,
                        const char *const *args) {
  static int serial;
  memset(s, 0, sizeof *s);
  snprintf(s->log_path, sizeof s->log_path, "/tmp/cgs-test-%d-%d.log",
           (int)getpid(), serial++);
  int out[2];
  if (pipe(out) != 0)
    return -1;
  const char *argv[64];
  int n = 0;
  argv[n++] = path;
  argv[n++] = "--listen";
  argv[n++] = "127.0.0.1:0";
  /* Every test client is one peer, 127.0.0.1: the per-peer limits (which
   * test_server_attacks.py covers) would refuse the tests' own parallel
   * calls and drop the log lines they look for. args may set them. */
  argv[n++] = "--max-calls-per-peer";
  argv[n++] = "1000000";
  argv[n++] = "--peer-log-rate";
  argv[n++] = "0";
  for (int i = 0; args && args[i] && n < 62; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    /* Never outlive a test that dies (timeout, crash). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int log = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out[1], 1);
    if (log >= 0)
      dup2(log, 2);
    close(out[0]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(out[1]);
  s->pid = pid;
  s->stdout_fd = out[0];
  size_t len = 0;
  double t0 = ts_now_ms();
  while (len < sizeof s->ready - 1 && !memchr(s->ready, '\n', len)) {
    struct pollfd pfd = {.fd = out[0], .events = POLLIN};
    int left = (int)(60000 - (ts_now_ms() - t0));
    if (left <= 0 || poll(&pfd, 1, left) <= 0)
      break;
    ssize_t k = read(out[0], s->ready + len, sizeof s->ready - 1 - len);
    if (k <= 0)
      break;
    len += (size_t)k;
  }
  s->ready[len] = '\0';
  const char *p = strstr(s->ready, "listen=127.0.0.1:");
  if (!p) {
    fprintf(stderr, "server did not get ready: '%s' (log %s)\n", s->ready,
            s->log_path);
    ts_server_stop(s, SIGKILL, 5000);
    return -1;
  }
  s->port = atoi(p + strlen("listen=127.0.0.1:"));
  snprintf(s->target, sizeof s->target, "127.0.0.1:%d", s->port);
  return 0;
}

int ts_server_stop(ts_server *s, int sig, int timeout_ms) {
  if (s->pid <= 0)
    return -1;
  if (sig)
    kill(s->pid, sig);
  int status = 0, rc = -1;
  double t0 = ts_now_ms();
  for (;;) {
    pid_t w = waitpid(s->pid, &status, WNOHANG);
    if (w == s->pid) {
      rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    if (ts_now_ms() - t0 > timeout_ms) {
      fprintf(stderr, "server %d did not exit in %d ms: killing it\n",
              (int)s->pid, timeout_ms);
      kill(s->pid, SIGKILL);
      waitpid(s->pid, &status, 0);
      break;
    }
    usleep(10000);
  }
  close(s->stdout_fd);
  s->pid = 0;
  return rc;
}

int ts_group_grpc_init(void **state) {
  (void)state;
  grpc_init();
  return 0;
}

int ts_group_grpc_shutdown(void **state) {
  (void)state;
  grpc_shutdown();
  return 0;
}

int ts_server_log_count(const ts_server *s, const char *needle) {
  FILE *f = fopen(s->log_path, "r");
  if (!f)
    return 0;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle))
      n++;
  fclose(f);
  return n;
}

/* ---- raw calls ---- */

static grpc_channel *channel_with(const ts_server *s,
                                  const grpc_channel_args *args) {
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(s->target, creds, args);
  grpc_channel_credentials_release(creds);
  return ch;
}

grpc_channel *ts_channel(const ts_server *s) {
  return channel_with(s, NULL);
}

grpc_channel *ts_channel_small_window(const ts_server *s) {
  grpc_arg args[] = {
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
       .value.integer = 64 * 1024},
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_HTTP2_BDP_PROBE,
       .value.integer = 0},
  };
  grpc_channel_args cargs = {.num_args = 2, .args = args};
  return channel_with(s, &cargs);
}

static gpr_timespec deadline_in(int64_t ms) {
  if (ms <= 0)
    return gpr_inf_future(GPR_CLOCK_REALTIME);
  return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                      gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Runs one batch to completion; returns its success flag. */
static int run_batch(ts_call *c, const grpc_op *ops, size_t n, void *tag) {
  if (grpc_call_start_batch(c->call, ops, n, tag, NULL) != GRPC_CALL_OK)
    return 0;
  grpc_event ev = grpc_completion_queue_pluck(
      c->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int ts_call_open(ts_call *c, grpc_channel *ch, const char *method,
                 int64_t deadline_ms) {
  memset(c, 0, sizeof *c);
  c->cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_metadata_array_init(&c->md);
  grpc_metadata_array_init(&c->trailing);
  c->details = grpc_empty_slice();
  c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                     grpc_slice_from_static_string(method),
                                     NULL, deadline_in(deadline_ms), NULL);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &c->trailing;
  ops[0].data.recv_status_on_client.status = &c->code;
  ops[0].data.recv_status_on_client.status_details = &c->details;
  if (grpc_call_start_batch(c->call, ops, 1, &c->status_started, NULL) !=
      GRPC_CALL_OK)
    return -1;
  c->status_started = 1;
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  memset(&ops[0].data, 0, sizeof ops[0].data);
  return run_batch(c, ops, 1, &c->md) ? 0 : -1;
}

int ts_call_send(ts_call *c, const void *bytes, size_t len) {
  grpc_slice s = grpc_slice_from_copied_buffer(bytes, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = bb;
  int ok = run_batch(c, &op, 1, &op);
  grpc_byte_buffer_destroy(bb);
  return ok ? 0 : -1;
}

int ts_call_send_msg(ts_call *c, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  protobuf_c_message_pack(m, buf);
  int rc = ts_call_send(c, buf, n);
  free(buf);
  return rc;
}

int ts_call_close_send(ts_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  return run_batch(c, &op, 1, &op) ? 0 : -1;
}

int ts_call_recv(ts_call *c, grpc_byte_buffer **bb) {
  grpc_op ops[2];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  *bb = NULL;
  if (!c->got_md) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &c->md;
    c->got_md = 1;
  }
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = bb;
  return run_batch(c, ops, n, ops) ? 0 : -1;
}

grpc_status_code ts_call_finish(ts_call *c, char *msg, size_t len) {
  if (!c->got_md) {
    /* grpc does not deliver the status before the initial metadata was
     * asked for. */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_INITIAL_METADATA;
    op.data.recv_initial_metadata.recv_initial_metadata = &c->md;
    c->got_md = 1;
    run_batch(c, &op, 1, &op);
  }
  if (c->status_started == 1) {
    grpc_completion_queue_pluck(c->cq, &c->status_started,
                                gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    c->status_started = 2;
  }
  if (msg) {
    size_t n = GRPC_SLICE_LENGTH(c->details);
    if (n >= len)
      n = len - 1;
    memcpy(msg, GRPC_SLICE_START_PTR(c->details), n);
    msg[n] = '\0';
  }
  return c->code;
}

void ts_call_cancel(ts_call *c) {
  grpc_call_cancel(c->call, NULL);
}

void ts_call_free(ts_call *c) {
  if (c->call) {
    if (c->status_started == 1) {
      grpc_call_cancel(c->call, NULL);
      ts_call_finish(c, NULL, 0);
    }
    grpc_call_unref(c->call);
  }
  grpc_metadata_array_destroy(&c->md);
  grpc_metadata_array_destroy(&c->trailing);
  grpc_slice_unref(c->details);
  grpc_completion_queue_shutdown(c->cq);
  while (grpc_completion_queue_pluck(c->cq, NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
             .type != GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(c->cq);
  memset(c, 0, sizeof *c);
}

/* ---- Compute ---- */

int ts_compute(grpc_channel *ch, const Convgrad__V1__ComputeHeader *h0,
               const void *const *data, const size_t *len, const ts_opts *o,
               ts_result *r) {
  ts_opts def = {0};
  if (!o)
    o = &def;
  memset(r, 0, sizeof *r);
  size_t chunk = o->chunk_bytes ? o->chunk_bytes : (1u << 20);
  ts_call c;
  /* When the server is unreachable every step fails; the status says why. */
  int alive = ts_call_open(&c, ch, "/convgrad.v1.ConvGrad/Compute",
                           o->deadline_ms ? o->deadline_ms : 60000) == 0;
  /* Header with the first inline_bytes of each tensor. */
  Convgrad__V1__ComputeHeader h = *h0;
  Convgrad__V1__Tensor t[3], *tp[3];
  size_t sent[3] = {0, 0, 0};
  for (size_t i = 0; i < h.n_inputs && i < 3; i++) {
    t[i] = *h0->inputs[i];
    size_t k = len[i] < o->inline_bytes ? len[i] : o->inline_bytes;
    t[i].data.data = (uint8_t *)data[i];
    t[i].data.len = k;
    sent[i] = k;
    tp[i] = &t[i];
  }
  h.inputs = tp;
  h.response_chunk_bytes = o->response_chunk_bytes;
  Convgrad__V1__ComputeRequest req = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  req.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  req.header = &h;
  alive = alive && ts_call_send_msg(&c, &req.base) == 0;
  for (size_t i = 0; alive && i < h.n_inputs && i < 3; i++) {
    while (alive && sent[i] < len[i]) {
      size_t k = len[i] - sent[i] < chunk ? len[i] - sent[i] : chunk;
      Convgrad__V1__DataChunk dc = CONVGRAD__V1__DATA_CHUNK__INIT;
      dc.input = (uint32_t)i;
      dc.data.data = (uint8_t *)data[i] + sent[i];
      dc.data.len = k;
      Convgrad__V1__ComputeRequest m = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
      m.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_CHUNK;
      m.chunk = &dc;
      alive = ts_call_send_msg(&c, &m.base) == 0;
      sent[i] += k;
    }
  }
  if (alive)
    ts_call_close_send(&c);
  /* Response: header, then chunks. */
  for (;;) {
    grpc_byte_buffer *bb;
    if (ts_call_recv(&c, &bb) != 0 || !bb)
      break;
    Convgrad__V1__ComputeResponse *m =
        (Convgrad__V1__ComputeResponse *)cgw_unpack(
            &convgrad__v1__compute_response__descriptor, bb);
    grpc_byte_buffer_destroy(bb);
    if (!m) {
      snprintf(r->msg, sizeof r->msg, "test: malformed response");
      break;
    }
    if (m->kind_case == CONVGRAD__V1__COMPUTE_RESPONSE__KIND_HEADER &&
        !r->hdr) {
      r->hdr = m->header;
      m->header = NULL;
      m->kind_case = CONVGRAD__V1__COMPUTE_RESPONSE__KIND__NOT_SET;
      r->data = malloc(r->hdr->total_bytes ? r->hdr->total_bytes : 1);
      if (r->hdr->data.len && r->hdr->data.len <= r->hdr->total_bytes) {
        memcpy(r->data, r->hdr->data.data, r->hdr->data.len);
        r->nbytes = r->hdr->data.len;
      }
    } else if (m->kind_case == CONVGRAD__V1__COMPUTE_RESPONSE__KIND_CHUNK &&
               r->hdr && r->nbytes + m->chunk.len <= r->hdr->total_bytes) {
      memcpy(r->data + r->nbytes, m->chunk.data, m->chunk.len);
      r->nbytes += m->chunk.len;
      r->nchunks++;
      if (m->chunk.len > r->max_chunk)
        r->max_chunk = m->chunk.len;
    } else {
      snprintf(r->msg, sizeof r->msg, "test: unexpected response message");
      protobuf_c_message_free_unpacked(&m->base, NULL);
      break;
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
  }
  char msg[512];
  r->code = ts_call_finish(&c, msg, sizeof msg);
  if (!r->msg[0])
    snprintf(r->msg, sizeof r->msg, "%s", msg);
  ts_call_free(&c);
  return 0;
}

void ts_result_free(ts_result *r) {
  if (r->hdr)
    protobuf_c_message_free_unpacked(&r->hdr->base, NULL);
  free(r->data);
  memset(r, 0, sizeof *r);
}

int ts_health(grpc_channel *ch, const char *service) {
  ts_call c;
  int rc = -GRPC_STATUS_UNKNOWN;
  /* Each step may fail when the server is gone; the status says why. */
  ts_call_open(&c, ch, "/grpc.health.v1.Health/Check", 10000);
  Grpc__Health__V1__HealthCheckRequest req =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)service;
  ts_call_send_msg(&c, &req.base);
  ts_call_close_send(&c);
  grpc_byte_buffer *bb = NULL;
  ts_call_recv(&c, &bb);
  grpc_status_code code = ts_call_finish(&c, NULL, 0);
  if (code != GRPC_STATUS_OK) {
    rc = -(int)code;
  } else if (bb) {
    Grpc__Health__V1__HealthCheckResponse *m =
        (Grpc__Health__V1__HealthCheckResponse *)cgw_unpack(
            &grpc__health__v1__health_check_response__descriptor, bb);
    if (m) {
      rc = m->status;
      protobuf_c_message_free_unpacked(&m->base, NULL);
    }
  }
  if (bb)
    grpc_byte_buffer_destroy(bb);
  ts_call_free(&c);
  return rc;
}

/* ---- problems ---- */

/* dims of a data tensor (n, c, sp) in fmt order */
static int data_dims(int64_t *out, cg_data_format fmt, int64_t n, int64_t c,
                     const int64_t *sp, int nsp) {
  int k = 0;
  out[k++] = n;
  if (fmt == CG_DATA_NCX)
    out[k++] = c;
  for (int i = 0; i < nsp; i++)
    out[k++] = sp[i];
  if (fmt != CG_DATA_NCX)
    out[k++] = c;
  return k;
}

/* dims of weights: "O" and "I" as the format letters name them */
static int weights_dims(int64_t *out, cg_weights_format f, int64_t o, int64_t i,
                        const int64_t *ks, int nsp) {
  int k = 0;
  if (f == CG_WEIGHTS_OIX || f == CG_WEIGHTS_IOX) {
    out[k++] = f == CG_WEIGHTS_OIX ? o : i;
    out[k++] = f == CG_WEIGHTS_OIX ? i : o;
    for (int s = 0; s < nsp; s++)
      out[k++] = ks[s];
  } else {
    for (int s = 0; s < nsp; s++)
      out[k++] = ks[s];
    out[k++] = f == CG_WEIGHTS_XIO ? i : o;
    out[k++] = f == CG_WEIGHTS_XIO ? o : i;
  }
  return k;
}

ts_desc ts_tiny_desc(uint64_t seed) {
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .groups = 1,
               .mb = 1,
               .ic = 4,
               .oc = 4,
               .nsp = 2,
               .is = {8, 8},
               .ks = {3, 3},
               .stride = 1,
               .pad = 1,
               .dil = 1,
               .seed = seed};
  return d;
}

/* tp's problem, geometry and wire form for d, without its tensors. */
static int problem_describe(ts_problem *tp, const ts_desc *d) {
  memset(tp, 0, sizeof *tp);
  int deconv =
      d->op == CG_OP_DECONV_BWD_DATA || d->op == CG_OP_DECONV_BWD_WEIGHTS;
  cg_weights_format wf = d->wfmt  ? d->wfmt
                         : deconv ? CG_WEIGHTS_XOI
                                  : CG_WEIGHTS_XIO;
  cg_data_format df = d->dfmt ? d->dfmt : CG_DATA_NXC;
  int64_t g = d->groups ? d->groups : 1;
  int64_t os[CG_MAX_SPATIAL];
  for (int s = 0; s < d->nsp; s++) {
    int64_t ek = (d->ks[s] - 1) * d->dil + 1;
    os[s] = deconv ? d->stride * (d->is[s] - 1) + ek - 2 * d->pad
                   : (d->is[s] + 2 * d->pad - ek) / d->stride + 1;
    tp->strides[s] = d->stride;
    tp->pads_begin[s] = tp->pads_end[s] = d->pad;
    tp->dilations[s] = d->dil;
  }
  /* weights dims: conv O=OC, I=ICg; deconv IOX/XOI: I=IC, O=OCg;
   * deconv OIX/XIO (older spelling): O=OCg, I=IC */
  int64_t wdims[CG_MAX_RANK];
  int wr = deconv ? weights_dims(wdims, wf, d->oc / g, d->ic, d->ks, d->nsp)
                  : weights_dims(wdims, wf, d->oc, d->ic / g, d->ks, d->nsp);
  int64_t src[CG_MAX_RANK], dst[CG_MAX_RANK];
  int r = data_dims(src, df, d->mb, d->ic, d->is, d->nsp);
  data_dims(dst, df, d->mb, d->oc, os, d->nsp);
  cg_problem *p = &tp->p;
  cg_problem_init(p);
  p->op = d->op;
  p->dtype = d->dtype;
  p->attrs.strides = (cg_ints){tp->strides, (size_t)d->nsp};
  p->attrs.pads_begin = (cg_ints){tp->pads_begin, (size_t)d->nsp};
  p->attrs.pads_end = (cg_ints){tp->pads_end, (size_t)d->nsp};
  p->attrs.dilations = (cg_ints){tp->dilations, (size_t)d->nsp};
  p->attrs.groups = g;
  p->attrs.data_format = df;
  p->attrs.weights_format = wf;
  int shape_len = 0;
  switch (d->op) {
  case CG_OP_CONV_BWD_DATA:
  case CG_OP_DECONV_BWD_DATA:
    memcpy(tp->dims[0], dst, sizeof dst);
    memcpy(tp->dims[1], wdims, sizeof wdims);
    if (d->op == CG_OP_CONV_BWD_DATA) {
      memcpy(tp->shape_attr, src, sizeof src);
      shape_len = r;
      p->attrs.dst_shape = (cg_ints){tp->shape_attr, (size_t)r};
    }
    break;
  default:
    memcpy(tp->dims[0], src, sizeof src);
    memcpy(tp->dims[1], dst, sizeof dst);
    memcpy(tp->shape_attr, wdims, sizeof wdims);
    shape_len = wr;
    p->attrs.weights_shape = (cg_ints){tp->shape_attr, (size_t)wr};
    break;
  }
  int r1 =
      (d->op == CG_OP_CONV_BWD_DATA || d->op == CG_OP_DECONV_BWD_DATA) ? wr : r;
  p->input_dims[0] = (cg_ints){tp->dims[0], (size_t)r};
  p->input_dims[1] = (cg_ints){tp->dims[1], (size_t)r1};
  char err[256];
  int rc = cg_problem_resolve(p, &tp->g, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "ts_problem_init: %s\n", err);
    return rc;
  }

  /* wire form */
  Convgrad__V1__Attributes a = CONVGRAD__V1__ATTRIBUTES__INIT;
  a.n_strides = a.n_pads_begin = a.n_pads_end = a.n_dilations = (size_t)d->nsp;
  a.strides = tp->strides;
  a.pads_begin = tp->pads_begin;
  a.pads_end = tp->pads_end;
  a.dilations = tp->dilations;
  a.groups = g;
  a.data_format = (Convgrad__V1__Layout)df;
  a.weights_format = (Convgrad__V1__Layout)(wf + 2);
  if (d->op == CG_OP_CONV_BWD_DATA) {
    a.n_dst_shape = (size_t)shape_len;
    a.dst_shape = tp->shape_attr;
  } else if (cg_op_outputs_weights(d->op)) {
    a.n_weights_shape = (size_t)shape_len;
    a.weights_shape = tp->shape_attr;
  }
  tp->attrs = a;
  for (int i = 0; i < 2; i++) {
    Convgrad__V1__Tensor t = CONVGRAD__V1__TENSOR__INIT;
    t.dtype = (Convgrad__V1__DType)d->dtype;
    t.n_shape = p->input_dims[i].len;
    t.shape = tp->dims[i];
    tp->tensors[i] = t;
    tp->tensor_ptrs[i] = &tp->tensors[i];
  }
  Convgrad__V1__ComputeHeader h = CONVGRAD__V1__COMPUTE_HEADER__INIT;
  h.op = (Convgrad__V1__Op)d->op;
  h.attrs = &tp->attrs;
  h.n_inputs = 2;
  h.inputs = tp->tensor_ptrs;
  tp->header = h;
  return 0;
}

int ts_problem_init(ts_problem *tp, const ts_desc *d) {
  int rc = problem_describe(tp, d);
  if (rc != 0)
    return rc;
  for (int i = 0; i < 2; i++) {
    tp->in[i] = malloc(tp->g.in_bytes[i]);
    if (!tp->in[i])
      return CG_ENOMEM;
    uint64_t state = (d->seed + (uint64_t)i) * 2654435761u + 1;
    cg_fill_uniform(d->dtype, tp->in[i], tp->g.in_elems[i], &state);
  }
  return 0;
}

int ts_problem_reference(ts_problem *tp) {
  char err[256];
  tp->ref = malloc(tp->g.out_bytes);
  if (!tp->ref)
    return CG_ENOMEM;
  int rc =
      cg_reference_run(&tp->g, tp->in[0], tp->in[1], tp->ref, err, sizeof err);
  if (rc != 0)
    fprintf(stderr, "reference: %s\n", err);
  return rc;
}

size_t ts_problem_check(const ts_problem *tp, const void *out) {
  size_t bad = 0;
  cg_dtype dt = tp->g.dtype;
  double rel = dt == CG_DTYPE_F32    ? 1e-4
               : dt == CG_DTYPE_BF16 ? 1.0 / 64
                                     : 1.0 / 512;
  double abs_tol = dt == CG_DTYPE_F32    ? 1e-3
                   : dt == CG_DTYPE_BF16 ? 2e-2
                                         : 4e-3;
  for (size_t i = 0; i < tp->g.out_elems; i++) {
    double got = cg_load_f32(dt, out, i), want = cg_load_f32(dt, tp->ref, i);
    if (!(fabs(got - want) <= abs_tol + rel * fabs(want))) {
      if (bad < 5)
        fprintf(stderr, "  out[%zu] = %g, reference %g\n", i, got, want);
      bad++;
    }
  }
  return bad;
}

int ts_problem_run(grpc_channel *ch, ts_problem *tp, const ts_opts *o) {
  if (!tp->ref && ts_problem_reference(tp) != 0)
    return -1;
  const void *data[2] = {tp->in[0], tp->in[1]};
  size_t len[2] = {tp->g.in_bytes[0], tp->g.in_bytes[1]};
  ts_result r;
  if (ts_compute(ch, &tp->header, data, len, o, &r) != 0) {
    fprintf(stderr, "ts_problem_run: transport failure\n");
    return -1;
  }
  int rc = -1;
  if (r.code != GRPC_STATUS_OK) {
    fprintf(stderr, "ts_problem_run %s: status %d: %s\n", cg_op_name(tp->g.op),
            r.code, r.msg);
    goto out;
  }
  if (!r.hdr || r.hdr->total_bytes != tp->g.out_bytes ||
      r.nbytes != tp->g.out_bytes || r.hdr->n_shape != (size_t)tp->g.in_rank ||
      r.hdr->dtype != (Convgrad__V1__DType)tp->g.dtype) {
    fprintf(stderr,
            "ts_problem_run: bad result header or length (%zu of %zu)\n",
            r.nbytes, tp->g.out_bytes);
    goto out;
  }
  for (int i = 0; i < tp->g.in_rank; i++)
    if (r.hdr->shape[i] != tp->g.out_dims[i]) {
      fprintf(stderr, "ts_problem_run: shape[%d] %lld, want %lld\n", i,
              (long long)r.hdr->shape[i], (long long)tp->g.out_dims[i]);
      goto out;
    }
  size_t bad = ts_problem_check(tp, r.data);
  if (bad) {
    fprintf(stderr, "ts_problem_run %s %s: %zu of %zu elements differ\n",
            cg_op_name(tp->g.op), cg_dtype_name(tp->g.dtype), bad,
            tp->g.out_elems);
    goto out;
  }
  rc = 0;
out:
  ts_result_free(&r);
  return rc;
}

void ts_problem_free(ts_problem *tp) {
  free(tp->in[0]);
  free(tp->in[1]);
  free(tp->ref);
  memset(tp, 0, sizeof *tp);
}

/* FLOPs of the problem d describes. */
static double desc_flops(const ts_desc *d) {
  ts_problem tp;
  return problem_describe(&tp, d) == 0 ? tp.g.flops : 0;
}

/* Grows d (by grow) until it has want FLOPs or grow says it is as big as
 * it may get. */
static void grow_to(ts_desc *d, int (*grow)(ts_desc *d), double want) {
  for (ts_desc next = *d; desc_flops(d) < want && grow(&next) == 0;)
    *d = next;
}

/* Grows d (by grow) until one run of it on the server takes min_ms, or
 * grow says it is as big as it may get; tp and *took are the last run.
 * A run too short is followed by the size its own rate says reaches
 * min_ms (with a margin), skipping the steps between: every run moves
 * the problem's tensors, which costs more than the compute under a
 * sanitizer (under ThreadSanitizer the doublings to a 1 s weights problem
 * took 40 s, all but 2 of them in copies and page faults). *rate is the
 * FLOPs per ms of the kind's last slow run in this process, 0 before the
 * first: a test's next slow problem of that kind starts at the size it
 * says (its servers are the same binary on the same cores), so only the
 * first one climbs from the small sizes (under ThreadSanitizer the three
 * runs below server_shutdown's second weights problem took 14 s). */
static int grow_until_slow(grpc_channel *ch, ts_desc *d,
                           int (*grow)(ts_desc *d), ts_problem *tp,
                           double min_ms, double min_flops, double *took,
                           double *rate) {
  int runs = 0;
  grow_to(d, grow, fmax(min_flops, *rate * 1.25 * min_ms));
  for (;;) {
    if (ts_problem_init(tp, d) != 0)
      return -1;
    const void *data[2] = {tp->in[0], tp->in[1]};
    size_t len[2] = {tp->g.in_bytes[0], tp->g.in_bytes[1]};
    ts_result r;
    if (ts_compute(ch, &tp->header, data, len, NULL, &r) != 0) {
      ts_problem_free(tp);
      return -1;
    }
    runs++;
    /* The worker's time, not the call's: under a sanitizer the client's
     * upload can take longer than the compute, and the tests reason about
     * how long the job holds its worker. */
    *took = r.hdr ? r.hdr->compute_ms : 0;
    grpc_status_code code = r.code;
    ts_result_free(&r);
    if (code != GRPC_STATUS_OK) {
      fprintf(stderr, "slow problem: mb %lld: status %d: %s\n",
              (long long)d->mb, code, r.msg);
      ts_problem_free(tp);
      return -1;
    }
    if (*took >= min_ms && tp->g.flops >= min_flops)
      break;
    /* A run's rate is only an estimate of the next one's (a small run
     * pays fixed costs, a big one fresh memory), so the size jumped to is
     * run and checked like any other; 1.25 makes a second jump rare. */
    double want = tp->g.flops * 1.25 * min_ms / (*took > 1 ? *took : 1);
    if (want < min_flops)
      want = min_flops;
    ts_desc bigger = *d;
    if (grow(&bigger) != 0)
      break;
    grow_to(&bigger, grow, want);
    ts_problem_free(tp);
    *d = bigger;
  }
  if (*took > 0)
    *rate = tp->g.flops / *took;
  fprintf(stderr,
          "  slow problem: mb %lld, kernel %lld, %.1f GFLOP, %.0f ms "
          "(%d runs)\n",
          (long long)d->mb, (long long)d->ks[0], tp->g.flops / 1e9, *took,
          runs);
  return 0;
}

/* 361 MFLOP and 100 KB of inputs a row: a weights gradient of few
 * channels and a big kernel, which oneDNN computes at a fraction of its
 * peak (here 20 GFLOP/s on one thread against 60-130 with 256 channels
 * and a 5x5 kernel), so a second of it moves 5-12 times fewer bytes
 * (inputs and diff_weights): under a sanitizer the bytes cost, not the
 * FLOPs (0.1 s a MB under ThreadSanitizer). Past mb 256 a fast machine
 * gets a bigger kernel, up to 21. */
static int grow_weights_problem(ts_desc *d) {
  if (d->mb < 256) {
    d->mb *= 2;
    return 0;
  }
  if (d->ks[0] >= 21)
    return -1;
  d->ks[0] = d->ks[1] = d->ks[0] + 2;
  d->pad++;
  return 0;
}

int ts_problem_slow(grpc_channel *ch, ts_problem *tp, double min_ms,
                    double *took) {
  ts_desc d = {.op = CG_OP_CONV_BWD_WEIGHTS,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC,
               .groups = 1,
               .mb = 8,
               .ic = 64,
               .oc = 64,
               .nsp = 2,
               .is = {14, 14},
               .ks = {15, 15},
               .stride = 1,
               .pad = 7,
               .dil = 1,
               .seed = 32};
  static double rate; /* the tests call from one thread */
  return grow_until_slow(ch, &d, grow_weights_problem, tp, min_ms, 0, took,
                         &rate);
}

/* 4.3 GFLOP and 200 KB a row: mb 256 holds 100 MB of a 160M budget, so a
 * fast machine gets a bigger kernel instead, up to 21. */
static int grow_data_problem(ts_desc *d) {
  if (d->mb < 256) {
    d->mb *= 2;
    return 0;
  }
  if (d->ks[0] >= 21)
    return -1;
  d->ks[0] = d->ks[1] = d->ks[0] + 2;
  d->pad = d->ks[0] / 2;
  return 0;
}

int ts_problem_slow_bwd_data(grpc_channel *ch, ts_problem *tp, double min_ms,
                             double *took) {
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC,
               .groups = 1,
               .mb = 4,
               .ic = 128,
               .oc = 128,
               .nsp = 2,
               .is = {14, 14},
               .ks = {13, 13},
               .stride = 1,
               .pad = 6,
               .dil = 1,
               .seed = 34};
  /* Slow is not enough: the server slices a job of at least two slices'
   * work (16 GFLOP per thread each, pool.c), so on a core slow enough
   * that min_ms is a single slice's work the job would run whole. Four
   * slices' work on two threads, in rows of about 1 GFLOP. */
  static double rate; /* the tests call from one thread */
  return grow_until_slow(ch, &d, grow_data_problem, tp, min_ms, 4 * 32e9, took,
                         &rate);
}

/* ---- background calls ---- */

struct ts_bg_state {
  grpc_channel *ch;
  ts_problem tp;   /* by value: g, in[] and ref; its header points elsewhere */
  uint8_t *header; /* tp's header, packed */
  size_t header_len;
  int64_t deadline_ms;
  grpc_status_code code;
  char msg[512];
  int checked;
};

static void *bg_main(void *p) {
  struct ts_bg_state *st = p;
  Convgrad__V1__ComputeHeader *h =
      convgrad__v1__compute_header__unpack(NULL, st->header_len, st->header);
  const void *data[2] = {st->tp.in[0], st->tp.in[1]};
  size_t len[2] = {st->tp.g.in_bytes[0], st->tp.g.in_bytes[1]};
  ts_opts o = {.deadline_ms = st->deadline_ms};
  ts_result r;
  if (h && ts_compute(st->ch, h, data, len, &o, &r) == 0) {
    st->code = r.code;
    snprintf(st->msg, sizeof st->msg, "%s", r.msg);
    st->checked = r.code == GRPC_STATUS_OK && st->tp.ref &&
                  r.nbytes == st->tp.g.out_bytes &&
                  ts_problem_check(&st->tp, r.data) == 0;
    ts_result_free(&r);
  }
  if (h)
    convgrad__v1__compute_header__free_unpacked(h, NULL);
  return NULL;
}

int ts_bg_start(ts_bg *b, grpc_channel *ch, const ts_problem *tp,
                int64_t deadline_ms) {
  memset(b, 0, sizeof *b);
  b->code = GRPC_STATUS_UNKNOWN;
  struct ts_bg_state *st = calloc(1, sizeof *st);
  if (!st)
    return -1;
  st->ch = ch;
  st->tp = *tp;
  st->header_len = convgrad__v1__compute_header__get_packed_size(&tp->header);
  st->header = malloc(st->header_len ? st->header_len : 1);
  st->deadline_ms = deadline_ms;
  st->code = GRPC_STATUS_UNKNOWN;
  if (!st->header) {
    free(st);
    return -1;
  }
  convgrad__v1__compute_header__pack(&tp->header, st->header);
  if (pthread_create(&b->th, NULL, bg_main, st) != 0) {
    free(st->header);
    free(st);
    return -1;
  }
  b->st = st;
  return 0;
}

void ts_bg_join(ts_bg *b) {
  pthread_join(b->th, NULL);
  b->code = b->st->code;
  memcpy(b->msg, b->st->msg, sizeof b->msg);
  b->checked = b->st->checked;
  free(b->st->header);
  free(b->st);
  b->st = NULL;
}

struct ts_watch_state {
  grpc_channel *ch;
  int seen[16];
  int nseen;
  grpc_status_code code;
};

static void *watch_main(void *p) {
  struct ts_watch_state *w = p;
  ts_call c;
  if (ts_call_open(&c, w->ch, "/grpc.health.v1.Health/Watch", 120000) == 0) {
    Grpc__Health__V1__HealthCheckRequest req =
        GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    ts_call_send_msg(&c, &req.base);
    ts_call_close_send(&c);
    grpc_byte_buffer *bb;
    while (ts_call_recv(&c, &bb) == 0 && bb) {
      Grpc__Health__V1__HealthCheckResponse *m =
          (Grpc__Health__V1__HealthCheckResponse *)cgw_unpack(
              &grpc__health__v1__health_check_response__descriptor, bb);
      grpc_byte_buffer_destroy(bb);
      if (m && w->nseen < 16)
        w->seen[w->nseen++] = m->status;
      if (m)
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    w->code = ts_call_finish(&c, NULL, 0);
  }
  ts_call_free(&c);
  return NULL;
}

int ts_watch_start(ts_watch *w, grpc_channel *ch) {
  memset(w, 0, sizeof *w);
  w->code = GRPC_STATUS_UNKNOWN;
  struct ts_watch_state *st = calloc(1, sizeof *st);
  if (!st)
    return -1;
  st->ch = ch;
  st->code = GRPC_STATUS_UNKNOWN;
  if (pthread_create(&w->th, NULL, watch_main, st) != 0) {
    free(st);
    return -1;
  }
  w->st = st;
  return 0;
}

void ts_watch_join(ts_watch *w) {
  pthread_join(w->th, NULL);
  memcpy(w->seen, w->st->seen, sizeof w->seen);
  w->nseen = w->st->nseen;
  w->code = w->st->code;
  free(w->st);
  w->st = NULL;
}

int ts_server_wait_log(const ts_server *s, const char *needle, int count,
                       int timeout_ms) {
  double t0 = ts_now_ms();
  while (ts_server_log_count(s, needle) < count) {
    if (ts_now_ms() - t0 > timeout_ms) {
      fprintf(stderr, "timed out waiting for %d log lines with '%s'\n", count,
              needle);
      return -1;
    }
    usleep(5000);
  }
  return 0;
}

int ts_fixture_start(ts_server *s, grpc_channel **ch, const char *const *args) {
  grpc_init();
  if (ts_server_start(s, args) != 0)
    return -1;
  *ch = ts_channel(s);
  return 0;
}

int ts_fixture_stop(ts_server *s, grpc_channel *ch) {
  grpc_channel_destroy(ch);
  int rc = ts_server_stop(s, SIGTERM, 30000);
  grpc_shutdown();
  return rc == 0 ? 0 : -1;
}

Convgrad__V1__ServerInfo *ts_server_info(grpc_channel *ch) {
  ts_call c;
  Convgrad__V1__ServerInfo *info = NULL;
  grpc_byte_buffer *bb = NULL;
  if (ts_call_open(&c, ch, "/convgrad.v1.ConvGrad/GetServerInfo", 10000) != 0)
    return NULL;
  Convgrad__V1__ServerInfoRequest req = CONVGRAD__V1__SERVER_INFO_REQUEST__INIT;
  if (ts_call_send_msg(&c, &req.base) == 0 && ts_call_close_send(&c) == 0 &&
      ts_call_recv(&c, &bb) == 0 && bb &&
      ts_call_finish(&c, NULL, 0) == GRPC_STATUS_OK) {
    grpc_byte_buffer_reader rd;
    grpc_byte_buffer_reader_init(&rd, bb);
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    info = convgrad__v1__server_info__unpack(NULL, GRPC_SLICE_LENGTH(s),
                                             GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
  }
  if (bb)
    grpc_byte_buffer_destroy(bb);
  ts_call_free(&c);
  return info;
}

/* splitmix64 */
static uint64_t rnd(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int64_t rnd_in(uint64_t *state, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rnd(state) % (uint64_t)(hi - lo + 1));
}

int ts_random_problem(ts_problem *tp, uint64_t *state) {
  static const cg_op ops[4] = {CG_OP_CONV_BWD_DATA, CG_OP_CONV_BWD_WEIGHTS,
                               CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS};
  static const cg_dtype dts[3] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F16};
  for (int attempt = 0; attempt < 100; attempt++) {
    ts_desc d;
    memset(&d, 0, sizeof d);
    d.op = ops[rnd_in(state, 0, 3)];
    d.dtype = dts[rnd_in(state, 0, 2)];
    int deconv = d.op >= CG_OP_DECONV_BWD_DATA;
    d.dfmt = rnd_in(state, 0, 1) ? CG_DATA_NCX : CG_DATA_NXC;
    d.wfmt = (cg_weights_format)rnd_in(state, 1, deconv ? 4 : 2);
    d.nsp = (int)rnd_in(state, 1, 3);
    d.groups = rnd_in(state, 1, 2);
    d.mb = rnd_in(state, 1, 2);
    int64_t wide = rnd_in(state, 0, 3) == 0 ? 8 : 1;
    d.ic = d.groups * rnd_in(state, 1, 4) * wide;
    d.oc = d.groups * rnd_in(state, 1, 4);
    d.stride = rnd_in(state, 1, 2);
    d.dil = rnd_in(state, 1, 2);
    d.pad = rnd_in(state, 0, 1);
    for (int a = 0; a < d.nsp; a++) {
      d.ks[a] = rnd_in(state, 1, 3);
      d.is[a] = rnd_in(state, 2, d.nsp == 3 ? 4 : 7);
    }
    d.seed = rnd(state);
    if (ts_problem_init(tp, &d) == 0)
      return 0;
  }
  return -1;
}
