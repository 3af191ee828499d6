/* crash.c - owns the fatal-signal handlers and the per-worker job texts of
 * the crash report (see cgs_crash.h). */
#include "cgs_crash.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "cg/text.h"
#include "cgs_log.h"

#define CQ_THREAD "cg-cq"
#define JOB_TEXT 768
#define WORKER_PREFIX "cg-worker-"

/* Each worker's job, written by that worker only, between jobs: what the
 * text is made of, not the text, which the handler formats only when a
 * report is written (formatting at every job start cost more than the
 * tiny row's kernel). The call the pointers are into outlives its job,
 * and the layer does not change while the job runs; the handler reads
 * the slot of the worker its thread belongs to, which is inside that job
 * (computing, or waiting for its OpenMP team). */
typedef struct job_slot {
  atomic_int set; /* 0: no job */
  uint64_t call_id;
  const char *peer;
  const cg_layer *layer;
} job_slot;

static job_slot slots[CGS_CRASH_CQ + 1]; /* the workers', the cq thread's */

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};

/* ---- the job texts (any thread, signal context included) ------------- */

/* The text functions used here are async-signal-safe (cg/text.h, and
 * cg_layer_text_geometry and cgs_log_value, which use only them). */

void cgs_crash_describe(char *buf, size_t cap, uint64_t call_id,
                        const char *peer, const cg_layer *l) {
  cg_text t;
  char who[160];
  cgs_log_value(who, sizeof who, peer ? peer : "?");
  cg_text_init(&t, buf, cap);
  cg_text_str(&t, "job: compute id=");
  cg_text_int(&t, (int64_t)call_id);
  cg_text_str(&t, " peer=");
  cg_text_str(&t, who);
  cg_text_str(&t, " ");
  cg_layer_text_geometry(&t, l);
}

void cgs_crash_job_start(unsigned worker, uint64_t call_id, const char *peer,
                         const cg_layer *layer) {
  if (worker > CGS_CRASH_CQ)
    return;
  job_slot *s = &slots[worker];
  atomic_store(&s->set, 0);
  s->call_id = call_id;
  s->peer = peer;
  s->layer = layer;
  atomic_store(&s->set, 1);
}

void cgs_crash_job_end(unsigned worker) {
  if (worker <= CGS_CRASH_CQ)
    atomic_store(&slots[worker].set, 0);
}

/* ---- the record (signal context: async-signal-safe only) -------------- */

/* A bounded line built without stdio. */
typedef struct rec {
  char buf[2048];
  size_t len;
} rec;

static void put(rec *r, const char *s) {
  while (*s && r->len < sizeof r->buf - 1)
    r->buf[r->len++] = *s++;
}

static void put_n(rec *r, const char *s, size_t n) {
  for (size_t i = 0; i < n && r->len < sizeof r->buf - 1; i++)
    r->buf[r->len++] = s[i];
}

static void put_uint(rec *r, uint64_t v, int width) {
  char d[24];
  int n = 0;
  do {
    d[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n < width)
    d[n++] = '0';
  while (n)
    put_n(r, &d[--n], 1);
}

static void put_hex(rec *r, uintptr_t v) {
  char d[2 + 2 * sizeof v];
  int n = 0;
  do {
    d[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  put(r, "0x");
  while (n)
    put_n(r, &d[--n], 1);
}

/* The log's timestamp format, from the epoch by arithmetic alone
 * (gmtime_r is not async-signal-safe): days to a civil date. */
static void put_time(rec *r) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t secs = ts.tv_sec, days = secs / 86400, sod = secs % 86400;
  int64_t z = days + 719468, era = z / 146097, doe = z - era * 146097;
  int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  int64_t mp = (5 * doy + 2) / 153, day = doy - (153 * mp + 2) / 5 + 1;
  int64_t month = mp < 10 ? mp + 3 : mp - 9;
  int64_t year = yoe + era * 400 + (month <= 2);
  put_uint(r, (uint64_t)year, 4);
  put(r, "-");
  put_uint(r, (uint64_t)month, 2);
  put(r, "-");
  put_uint(r, (uint64_t)day, 2);
  put(r, "T");
  put_uint(r, (uint64_t)(sod / 3600), 2);
  put(r, ":");
  put_uint(r, (uint64_t)(sod / 60 % 60), 2);
  put(r, ":");
  put_uint(r, (uint64_t)(sod % 60), 2);
  put(r, ".");
  put_uint(r, (uint64_t)(ts.tv_nsec / 1000000), 3);
  put(r, "Z error crash");
}

static const char *signal_name(int sig) {
  return sig == SIGSEGV  ? "SIGSEGV"
         : sig == SIGBUS ? "SIGBUS"
         : sig == SIGILL ? "SIGILL"
         : sig == SIGFPE ? "SIGFPE"
                         : "?";
}

/* si_code: how the signal came about. */
static const char *code_name(int sig, int code) {
  if (code == SI_USER)
    return "SI_USER";
  if (code == SI_TKILL)
    return "SI_TKILL";
  if (code <= 0)
    return "SI_QUEUE";
  switch (sig) {
  case SIGSEGV:
    return code == SEGV_MAPERR   ? "SEGV_MAPERR"
           : code == SEGV_ACCERR ? "SEGV_ACCERR"
                                 : "SEGV_OTHER";
  case SIGBUS:
    return code == BUS_ADRALN   ? "BUS_ADRALN"
           : code == BUS_ADRERR ? "BUS_ADRERR"
           : code == BUS_OBJERR ? "BUS_OBJERR"
                                : "BUS_OTHER";
  case SIGILL:
    return code == ILL_ILLOPC ? "ILL_ILLOPC" : "ILL_OTHER";
  default:
    return code == FPE_INTDIV ? "FPE_INTDIV" : "FPE_OTHER";
  }
}

/* The slot of the worker a thread named name belongs to (its OpenMP
 * threads inherit its name), CGS_CRASH_CQ for the cq thread, or -1. */
static int worker_of(const char *name) {
  if (strcmp(name, CQ_THREAD) == 0)
    return CGS_CRASH_CQ;
  size_t n = strlen(WORKER_PREFIX);
  if (strncmp(name, WORKER_PREFIX, n) != 0 || !name[n])
    return -1;
  int w = 0;
  for (const char *p = name + n; *p; p++) {
    if (*p < '0' || *p > '9')
      return -1;
    w = w * 10 + (*p - '0');
    if (w >= (int)CGS_CRASH_CQ)
      return -1;
  }
  return w;
}

static void on_fatal(int sig, siginfo_t *si, void *uctx) {
  /* One record: a second thread faulting meanwhile waits to be killed. */
  static atomic_flag reporting = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&reporting))
    for (;;)
      pause();
  rec r = {.len = 0};
  char name[17] = "";
  prctl(PR_GET_NAME, name);
  put_time(&r);
  put(&r, " signal=");
  put(&r, signal_name(sig));
  put(&r, " code=");
  put(&r, code_name(sig, si->si_code));
  if (si->si_code <= 0) {
    put(&r, " sender_pid=");
    put_uint(&r, (uint64_t)si->si_pid, 1);
  } else {
    put(&r, " addr=");
    put_hex(&r, (uintptr_t)si->si_addr);
  }
#if defined(__x86_64__) && defined(REG_RIP)
  put(&r, " ip=");
  put_hex(&r, (uintptr_t)((ucontext_t *)uctx)->uc_mcontext.gregs[REG_RIP]);
#else
  (void)uctx;
#endif
  /* Thread names are ours or gRPC's: printable, no spaces or quotes. */
  put(&r, " thread=");
  put(&r, name[0] ? name : "?");
  put(&r, " tid=");
  put_uint(&r, (uint64_t)syscall(SYS_gettid), 1);
  int w = worker_of(name);
  if (w >= 0 && atomic_load(&slots[w].set)) {
    char job[JOB_TEXT];
    cgs_crash_describe(job, sizeof job, slots[w].call_id, slots[w].peer,
                       slots[w].layer);
    put(&r, " ");
    put(&r, job);
  } else {
    put(&r, " job=none");
  }
  put(&r, "\n");
  for (size_t off = 0; off < r.len;) {
    ssize_t n = write(STDERR_FILENO, r.buf + off, r.len - off);
    if (n <= 0)
      break;
    off += (size_t)n;
  }
  /* Die of the signal: the default action, now or as the faulting
   * instruction runs again (the guard of cgs_region.h may have called
   * this handler with the signal unblocked). */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, NULL);
  raise(sig);
}

int cgs_crash_install(char *err, size_t errlen) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
    if (sigaction(fatal_signals[i], &sa, NULL) != 0) {
      snprintf(err, errlen, "crash report: cannot handle %s",
               signal_name(fatal_signals[i]));
      return -1;
    }
  return 0;
}
