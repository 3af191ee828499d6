/* harness.c - see harness.h: spawning and stopping servers and CLI runs
 * for the client's end-to-end tests. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cg/dtype.h"
#include "harness.h"

extern char **environ;

static double th_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits for pid up to timeout_s; returns the wait status or -1. */
static int th_wait(pid_t pid, double timeout_s) {
  double until = th_now() + timeout_s;
  int st;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return st;
    if (r < 0 || th_now() > until)
      return -1;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

int th_server_start(th_server *s, const char *exe, int port,
                    const char *const *extra) {
  const char *argv[32];
  char listen[64];
  int pipefd[2], n = 0;
  posix_spawn_file_actions_t fa;
  static int seq;
  memset(s, 0, sizeof *s);
  s->out_fd = -1;
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  snprintf(s->log, sizeof s->log, "/tmp/cgc-test-server-%d-%d.log",
           (int)getpid(), seq++);
  argv[n++] = exe;
  argv[n++] = "--listen";
  argv[n++] = listen;
  for (int i = 0; extra && extra[i] && n < 30; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  if (pipe(pipefd) != 0)
    return -1;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  posix_spawn_file_actions_addopen(&fa, 2, s->log, O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  int rc = posix_spawn(&s->pid, exe, &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(pipefd[1]);
  if (rc != 0) {
    fprintf(stderr, "harness: cannot start %s: %s\n", exe, strerror(rc));
    close(pipefd[0]);
    s->pid = 0;
    return -1;
  }
  s->out_fd = pipefd[0];
  char line[1024];
  size_t len = 0;
  double until = th_now() + 60;
  while (len < sizeof line - 1 && th_now() < until) {
    struct pollfd p = {s->out_fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0)
      continue;
    ssize_t r = read(s->out_fd, line + len, sizeof line - 1 - len);
    if (r <= 0)
      break;
    len += (size_t)r;
    line[len] = '\0';
    if (strchr(line, '\n'))
      break;
  }
  line[len] = '\0';
  const char *l = strstr(line, "listen=");
  const char *colon = l ? strchr(l, ' ') : NULL;
  if (!l || !strchr(line, '\n')) {
    fprintf(stderr, "harness: no readiness line from %s (got '%s')\n", exe,
            line);
    th_server_stop(s);
    return -1;
  }
  /* listen=HOST:PORT: the port follows the last ':' before the space. */
  const char *p = colon ? colon : l + strlen(l);
  while (p > l && p[-1] != ':')
    p--;
  s->port = atoi(p);
  snprintf(s->target, sizeof s->target, "127.0.0.1:%d", s->port);
  return s->port > 0 ? 0 : -1;
}

void th_server_stop(th_server *s) {
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    if (th_wait(s->pid, 30) < 0) {
      kill(s->pid, SIGKILL);
      th_wait(s->pid, 10);
    }
  }
  if (s->out_fd >= 0)
    close(s->out_fd);
  s->pid = 0;
  s->out_fd = -1;
}

int th_free_port(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
  if (fd < 0)
    return -1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

int th_count_lines(const char *path, const char *needle) {
  char line[4096];
  int n = 0;
  FILE *fp = fopen(path, "r");
  if (!fp)
    return -1;
  while (fgets(line, sizeof line, fp))
    n += strstr(line, needle) != NULL;
  fclose(fp);
  return n;
}

pid_t th_spawn(const char *const *argv, char *outpath, char *errpath) {
  static int seq;
  posix_spawn_file_actions_t fa;
  pid_t pid;
  sprintf(outpath, "/tmp/cgc-test-%d-%d.out", (int)getpid(), seq);
  sprintf(errpath, "/tmp/cgc-test-%d-%d.err", (int)getpid(), seq++);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, outpath,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, errpath,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

static void th_slurp(const char *path, char *buf, size_t cap) {
  FILE *fp = fopen(path, "r");
  size_t n = 0;
  if (fp) {
    n = fread(buf, 1, cap - 1, fp);
    fclose(fp);
  }
  buf[n] = '\0';
  unlink(path);
}

void th_collect(pid_t pid, int timeout_s, const char *outpath,
                const char *errpath, th_run *r) {
  r->code = -1;
  if (pid > 0) {
    int st = th_wait(pid, timeout_s);
    if (st < 0) {
      kill(pid, SIGKILL);
      th_wait(pid, 10);
    } else if (WIFEXITED(st)) {
      r->code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      r->code = 128 + WTERMSIG(st);
    }
  }
  th_slurp(outpath, r->out, sizeof r->out);
  th_slurp(errpath, r->err, sizeof r->err);
}

void th_run_cmd(th_run *r, const char *const *argv) {
  char o[128], e[128];
  pid_t pid = th_spawn(argv, o, e);
  th_collect(pid, 300, o, e, r);
}

int th_write_file(const char *path, const char *text) {
  FILE *fp = fopen(path, "w");
  if (!fp)
    return -1;
  int ok = fputs(text, fp) >= 0;
  return fclose(fp) == 0 && ok ? 0 : -1;
}

/* 1 when name is PREFIX-[word-...]PID[-...], PREFIX convgrad or cgtest:
 * the keys cgc_region_create and these tests give this process's
 * objects (tests/shm_leftovers.py reads them the same way). */
static int th_shm_own(const char *name, const char *pid) {
  static const char *const prefixes[] = {"convgrad-", "cgtest-"};
  const char *p = NULL;
  for (size_t i = 0; !p && i < sizeof prefixes / sizeof prefixes[0]; i++)
    if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
      p = name + strlen(prefixes[i]);
  while (p && *p >= 'a' && *p <= 'z') {
    const char *w = p;
    while (*w >= 'a' && *w <= 'z')
      w++;
    p = *w == '-' ? w + 1 : NULL;
  }
  if (!p || strncmp(p, pid, strlen(pid)) != 0)
    return 0;
  p += strlen(pid);
  return *p == '-' || *p == '\0';
}

static void th_shm_unlink_own(void) {
  char pid[32], key[300];
  DIR *d = opendir("/dev/shm");
  if (!d)
    return;
  snprintf(pid, sizeof pid, "%ld", (long)getpid());
  for (struct dirent *e; (e = readdir(d));) {
    if (!th_shm_own(e->d_name, pid))
      continue;
    snprintf(key, sizeof key, "/%s", e->d_name);
    if (shm_unlink(key) == 0)
      fprintf(stderr, "harness: removed %s at exit (no test freed it)\n", key);
  }
  closedir(d);
}

void th_shm_unlink_at_exit(void) {
  atexit(th_shm_unlink_own);
}

int th_problem_init(th_problem *p, const char *desc, cg_op op, cg_dtype dt,
                    cg_data_format df, uint64_t seed) {
  cg_bdesc d;
  char err[256];
  int deconv = op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS ||
               op == CG_OP_DECONV_BWD;
  memset(p, 0, sizeof *p);
  if (cg_bdesc_parse(desc, deconv, &d, err, sizeof err) != 0 ||
      cg_bdesc_problem_init(&p->bp, &d, op, dt, df, CG_WEIGHTS_DEFAULT, err,
                            sizeof err) != 0 ||
      cg_layer_resolve(&p->bp.problem, &p->layer, err, sizeof err) != 0) {
    fprintf(stderr, "%s %s: %s\n", desc, cg_op_name(op), err);
    return -1;
  }
  cgc_request_init(&p->req);
  p->req.op = op;
  p->req.attrs = p->bp.problem.attrs;
  for (int i = 0; i < p->layer.ninputs; i++) {
    size_t n = p->layer.in_bytes[i];
    const cg_ints *dims = &p->bp.problem.input_dims[i];
    cgc_tensor_view *v = &p->req.inputs[i];
    p->in[i] = malloc(n);
    if (!p->in[i]) {
      fprintf(stderr, "out of memory\n");
      return -1;
    }
    cg_fill_uniform(dt, p->in[i], n / cg_dtype_size(dt), &seed);
    v->dtype = dt;
    v->rank = (int)dims->len;
    memcpy(v->dims, dims->v, dims->len * sizeof(int64_t));
    v->data = p->in[i];
    v->nbytes = n;
  }
  return 0;
}

void th_problem_free(th_problem *p) {
  for (int i = 0; i < 3; i++)
    free(p->in[i]);
}
