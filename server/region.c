/* region.c - owns the shared-memory region table, the mappings and the
 * SIGBUS guard (see cgs_region.h). */
#include "cgs_region.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cg/text.h"

/* ---- the SIGBUS guard ------------------------------------------------- */

/* Mappings the guard knows. More than --max-regions' bound: unregistered
 * regions stay mapped while calls use them. Read by the signal handler
 * without locks; written under guard_mu. */
#define GUARD_SLOTS 8192

typedef struct guard_slot {
  _Atomic uintptr_t base; /* 0: free */
  _Atomic size_t len;
  atomic_int broken; /* the guard replaced the mapping */
} guard_slot;

static guard_slot slots[GUARD_SLOTS];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous_bus;
static int guard_installed;

/* Async-signal-safe: atomics, mmap and sigaction only. A fault inside a
 * region means its object shrank: zero pages replace the whole mapping
 * (what Wayland compositors do with clients' pools), the access then
 * completes, and the call sees the region broken. Any other SIGBUS goes to
 * the handler before ours, or kills the process as it would have. */
static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
  uintptr_t a = (uintptr_t)si->si_addr;
  for (int i = 0; i < GUARD_SLOTS; i++) {
    uintptr_t b = atomic_load(&slots[i].base);
    size_t n = atomic_load(&slots[i].len);
    if (b && a - b < n) {
      if (mmap((void *)b, n, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
        atomic_store(&slots[i].broken, 1);
        return;
      }
      break;
    }
  }
  if ((previous_bus.sa_flags & SA_SIGINFO) && previous_bus.sa_sigaction) {
    previous_bus.sa_sigaction(sig, si, uctx);
  } else if (previous_bus.sa_handler != SIG_DFL &&
             previous_bus.sa_handler != SIG_IGN) {
    previous_bus.sa_handler(sig);
  } else {
    /* Returning re-runs the access, which now takes the default action. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
  }
}

static int guard_install(void) {
  pthread_mutex_lock(&guard_mu);
  int rc = 0;
  if (!guard_installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    rc = sigaction(SIGBUS, &sa, &previous_bus);
    guard_installed = rc == 0;
  }
  pthread_mutex_unlock(&guard_mu);
  return rc;
}

/* A free slot for [base, base + len), or -1. */
static int guard_add(void *base, size_t len) {
  pthread_mutex_lock(&guard_mu);
  int slot = -1;
  for (int i = 0; i < GUARD_SLOTS && slot < 0; i++)
    if (!atomic_load(&slots[i].base)) {
      atomic_store(&slots[i].broken, 0);
      atomic_store(&slots[i].len, len);
      atomic_store(&slots[i].base, (uintptr_t)base);
      slot = i;
    }
  pthread_mutex_unlock(&guard_mu);
  return slot;
}

/* Before the mapping goes. */
static void guard_remove(int slot) {
  pthread_mutex_lock(&guard_mu);
  atomic_store(&slots[slot].base, 0);
  atomic_store(&slots[slot].len, 0);
  pthread_mutex_unlock(&guard_mu);
}

/* ---- regions ---------------------------------------------------------- */

struct cgs_region {
  atomic_uint refs; /* the table's while registered, and one per use */
  char owner[160];
  char name[CGS_REGION_NAME_MAX];
  char key[CGS_REGION_KEY_MAX];
  uint64_t offset, byte_size; /* the registered range of the object */
  uint64_t dev, ino;          /* the object, for overlaps across regions */
  int fd;                     /* kept for fstat before each use */
  void *map;                  /* from the page below offset */
  size_t map_len;
  unsigned char *data; /* offset's byte in map */
  int slot;            /* in the guard */
  /* CLOCK_MONOTONIC ns of the registration or the last call's start or
   * end, for cgs_regions_expire. */
  _Atomic uint64_t used_ns;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct cgs_regions {
  pthread_mutex_t mu;
  cgs_region **tab; /* registered, in registration order */
  unsigned n, max;
  uint64_t max_bytes;
  char prefix[CGS_REGION_KEY_MAX]; /* --shm-prefix */
};

int cgs_regions_new(cgs_regions **out, unsigned max_regions, uint64_t max_bytes,
                    const char *key_prefix, char *msg, size_t msglen) {
  *out = NULL;
  if (strlen(key_prefix) >= sizeof((cgs_regions *)0)->prefix) {
    snprintf(msg, msglen, "key prefix: longer than %zu characters",
             sizeof((cgs_regions *)0)->prefix - 1);
    return -1;
  }
  if (guard_install() != 0) {
    snprintf(msg, msglen, "cannot install the SIGBUS handler: %s",
             strerror(errno));
    return -1;
  }
  cgs_regions *rs = calloc(1, sizeof *rs);
  if (rs)
    rs->tab = calloc(max_regions ? max_regions : 1, sizeof(cgs_region *));
  if (!rs || !rs->tab) {
    free(rs);
    snprintf(msg, msglen, "out of memory");
    return -1;
  }
  pthread_mutex_init(&rs->mu, NULL);
  rs->max = max_regions;
  rs->max_bytes = max_bytes;
  snprintf(rs->prefix, sizeof rs->prefix, "%s", key_prefix);
  *out = rs;
  return 0;
}

void cgs_region_release(cgs_region *r) {
  atomic_store(&r->used_ns, now_ns());
  if (atomic_fetch_sub(&r->refs, 1) != 1)
    return;
  guard_remove(r->slot);
  munmap(r->map, r->map_len);
  close(r->fd);
  free(r);
}

void cgs_regions_free(cgs_regions *rs) {
  if (!rs)
    return;
  for (unsigned i = 0; i < rs->n; i++)
    cgs_region_release(rs->tab[i]);
  pthread_mutex_destroy(&rs->mu);
  free(rs->tab);
  free(rs);
}

static int still_whole(const cgs_region *r, const char *field,
                       grpc_status_code *code, char *msg, size_t msglen);

/* owner's entry called name, or -1; under rs->mu. */
static int find(const cgs_regions *rs, const char *owner, const char *name) {
  for (unsigned i = 0; i < rs->n; i++)
    if (!strcmp(rs->tab[i]->owner, owner) && !strcmp(rs->tab[i]->name, name))
      return (int)i;
  return -1;
}

static grpc_status_code open_error(int err) {
  switch (err) {
  case ENOENT:
    return GRPC_STATUS_NOT_FOUND;
  case EACCES:
  case EPERM:
    return GRPC_STATUS_PERMISSION_DENIED;
  case EMFILE:
  case ENFILE:
  case ENOMEM:
    return GRPC_STATUS_RESOURCE_EXHAUSTED;
  default:
    return GRPC_STATUS_INVALID_ARGUMENT;
  }
}

/* Opens and maps a new region; NULL with *code and msg. */
static cgs_region *map_region(const char *owner, const char *name,
                              const char *key, uint64_t offset,
                              uint64_t byte_size, grpc_status_code *code,
                              char *msg, size_t msglen) {
  int fd = shm_open(key, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    *code = open_error(err);
    if (err == ENOENT)
      snprintf(msg, msglen,
               "key: no shared-memory object %s on the server's host (regions "
               "work only for clients on the same host or IPC namespace)",
               key);
    else
      snprintf(msg, msglen, "key: cannot open %s: %s", key, strerror(err));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen, "key: %s is not a shared-memory object", key);
    close(fd);
    return NULL;
  }
  if (offset + byte_size > (uint64_t)st.st_size) {
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen,
             "byte_size: [%" PRIu64 ", %" PRIu64 ") ends past %s's %" PRIu64
             " bytes",
             offset, offset + byte_size, key, (uint64_t)st.st_size);
    close(fd);
    return NULL;
  }
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t from = offset - offset % page;
  cgs_region *r = calloc(1, sizeof *r);
  void *map = MAP_FAILED;
  if (r && byte_size + (offset - from) <= SIZE_MAX)
    map = mmap(NULL, (size_t)(byte_size + (offset - from)),
               PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)from);
  if (map == MAP_FAILED) {
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, msglen, "byte_size: cannot map %" PRIu64 " bytes of %s: %s",
             byte_size, key, r ? strerror(errno) : "out of memory");
    free(r);
    close(fd);
    return NULL;
  }
  r->map = map;
  r->map_len = (size_t)(byte_size + (offset - from));
  r->slot = guard_add(r->map, r->map_len);
  if (r->slot < 0) {
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, msglen,
             "name: %d regions are still mapped for calls using them; retry "
             "later",
             GUARD_SLOTS);
    munmap(r->map, r->map_len);
    free(r);
    close(fd);
    return NULL;
  }
  atomic_init(&r->refs, 1);
  snprintf(r->owner, sizeof r->owner, "%s", owner);
  snprintf(r->name, sizeof r->name, "%s", name);
  snprintf(r->key, sizeof r->key, "%s", key);
  r->offset = offset;
  r->byte_size = byte_size;
  r->dev = (uint64_t)st.st_dev;
  r->ino = (uint64_t)st.st_ino;
  r->fd = fd;
  atomic_init(&r->used_ns, now_ns());
  r->data = (unsigned char *)map + (offset - from);
  return r;
}

int cgs_regions_register(cgs_regions *rs, const char *owner, const char *name,
                         const char *key, uint64_t offset, uint64_t byte_size,
                         grpc_status_code *code, char *msg, size_t msglen) {
  owner = owner ? owner : "";
  *code = GRPC_STATUS_INVALID_ARGUMENT;
  if (!cg_text_plain_name(name, CGS_REGION_NAME_MAX - 1)) {
    snprintf(msg, msglen,
             "name: must be 1 to %d of A-Z a-z 0-9 . _ - (not only dots)",
             CGS_REGION_NAME_MAX - 1);
    return -1;
  }
  if (key[0] != '/' || !cg_text_plain_name(key + 1, CGS_REGION_KEY_MAX - 2)) {
    snprintf(msg, msglen,
             "key: must be /NAME, NAME 1 to %d of A-Z a-z 0-9 . _ - (no "
             "path, not only dots)",
             CGS_REGION_KEY_MAX - 2);
    return -1;
  }
  /* Without it a caller could have the server open, read and write any
   * object in /dev/shm its user can reach, other programs' included. */
  if (strncmp(key + 1, rs->prefix, strlen(rs->prefix)) != 0) {
    *code = GRPC_STATUS_PERMISSION_DENIED;
    snprintf(msg, msglen,
             "key: '%s' does not start with '/%s': this server opens only "
             "objects named so (--shm-prefix)",
             key, rs->prefix);
    return -1;
  }
  if (byte_size == 0) {
    snprintf(msg, msglen, "byte_size: must be > 0");
    return -1;
  }
  if (byte_size > rs->max_bytes) {
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, msglen,
             "byte_size: %" PRIu64 " bytes exceed --max-region-bytes %" PRIu64,
             byte_size, rs->max_bytes);
    return -1;
  }
  if (offset > (uint64_t)INT64_MAX - byte_size) {
    snprintf(msg, msglen, "offset: %" PRIu64 " + byte_size overflows", offset);
    return -1;
  }
  pthread_mutex_lock(&rs->mu);
  int rc = -1;
  int i = find(rs, owner, name);
  if (i >= 0) {
    cgs_region *r = rs->tab[i];
    grpc_status_code unused;
    char why[8];
    if (!strcmp(r->key, key) && r->offset == offset &&
        r->byte_size == byte_size) {
      /* The same registration again: a retry is OK, and a region broken
       * or truncated since is mapped afresh (calls using the old mapping
       * keep it). */
      rc = 0;
      atomic_store(&r->used_ns, now_ns());
      if (still_whole(r, "name", &unused, why, sizeof why) != 0) {
        cgs_region *fresh =
            map_region(owner, name, key, offset, byte_size, code, msg, msglen);
        if (fresh) {
          rs->tab[i] = fresh;
          cgs_region_release(r);
        } else {
          rc = -1;
        }
      }
    } else {
      *code = GRPC_STATUS_ALREADY_EXISTS;
      snprintf(msg, msglen,
               "name: region '%s' is registered with %s [%" PRIu64 ", +%" PRIu64
               "); unregister it first",
               name, r->key, r->offset, r->byte_size);
    }
  } else if (rs->n >= rs->max) {
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, msglen,
             "name: %u regions are registered (--max-regions); unregister one "
             "first",
             rs->n);
  } else {
    cgs_region *r =
        map_region(owner, name, key, offset, byte_size, code, msg, msglen);
    if (r) {
      rs->tab[rs->n++] = r;
      rc = 0;
    }
  }
  pthread_mutex_unlock(&rs->mu);
  return rc;
}

int cgs_regions_unregister(cgs_regions *rs, const char *owner, const char *name,
                           grpc_status_code *code, char *msg, size_t msglen) {
  owner = owner ? owner : "";
  pthread_mutex_lock(&rs->mu);
  int i = find(rs, owner, name);
  cgs_region *r = NULL;
  if (i >= 0) {
    r = rs->tab[i];
    memmove(&rs->tab[i], &rs->tab[i + 1],
            (rs->n - (unsigned)i - 1) * sizeof(cgs_region *));
    rs->n--;
  }
  pthread_mutex_unlock(&rs->mu);
  if (!r) {
    *code = GRPC_STATUS_NOT_FOUND;
    snprintf(msg, msglen, "name: no region '%s' is registered", name);
    return -1;
  }
  cgs_region_release(r);
  return 0;
}

/* Fills o with what the log and ListRegions tell of r. */
static void describe(const cgs_region *r, uint64_t now, cgs_region_info *o) {
  snprintf(o->owner, sizeof o->owner, "%s", r->owner);
  snprintf(o->name, sizeof o->name, "%s", r->name);
  snprintf(o->key, sizeof o->key, "%s", r->key);
  o->offset = r->offset;
  o->byte_size = r->byte_size;
  o->calls = atomic_load(&r->refs) - 1;
  uint64_t used = atomic_load(&r->used_ns);
  o->idle_ms = now > used ? (now - used) / 1000000u : 0;
}

size_t cgs_regions_list(cgs_regions *rs, const char *owner,
                        cgs_region_info *out, size_t max) {
  owner = owner ? owner : "";
  size_t k = 0;
  uint64_t now = now_ns();
  pthread_mutex_lock(&rs->mu);
  for (unsigned i = 0; i < rs->n && k < max; i++) {
    const cgs_region *r = rs->tab[i];
    if (strcmp(r->owner, owner) != 0)
      continue;
    describe(r, now, &out[k++]);
  }
  pthread_mutex_unlock(&rs->mu);
  return k;
}

size_t cgs_regions_expire(cgs_regions *rs, uint64_t idle_ms,
                          cgs_region_info *out, size_t max) {
  cgs_region *gone[64];
  size_t k = 0, room = max < 64 ? max : 64;
  uint64_t now = now_ns();
  pthread_mutex_lock(&rs->mu);
  for (unsigned i = 0; i < rs->n && k < room;) {
    cgs_region *r = rs->tab[i];
    uint64_t used = atomic_load(&r->used_ns);
    /* Only the table's reference: no call holds it, and none can take
     * one while rs->mu is held. */
    if (atomic_load(&r->refs) == 1 && used <= now &&
        (now - used) / 1000000u >= idle_ms) {
      describe(r, now, &out[k]);
      gone[k++] = r;
      memmove(&rs->tab[i], &rs->tab[i + 1],
              (rs->n - i - 1) * sizeof(cgs_region *));
      rs->n--;
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&rs->mu);
  for (size_t j = 0; j < k; j++)
    cgs_region_release(gone[j]);
  return k;
}

size_t cgs_regions_count(cgs_regions *rs) {
  pthread_mutex_lock(&rs->mu);
  size_t n = rs->n;
  pthread_mutex_unlock(&rs->mu);
  return n;
}

int cgs_region_check(const cgs_region *r, grpc_status_code *code, char *msg,
                     size_t msglen) {
  if (!atomic_load(&slots[r->slot].broken))
    return 0;
  *code = GRPC_STATUS_FAILED_PRECONDITION;
  snprintf(msg, msglen,
           "region '%s': its object %s was truncated while the server used "
           "it; what was read or written there is lost (unregister it and "
           "register it again)",
           r->name, r->key);
  return -1;
}

/* 0 while r's object still covers the registered range; under rs->mu. */
static int still_whole(const cgs_region *r, const char *field,
                       grpc_status_code *code, char *msg, size_t msglen) {
  if (cgs_region_check(r, code, msg, msglen) != 0)
    return -1;
  struct stat st;
  if (fstat(r->fd, &st) == 0 &&
      (uint64_t)st.st_size >= r->offset + r->byte_size)
    return 0;
  *code = GRPC_STATUS_FAILED_PRECONDITION;
  snprintf(msg, msglen,
           "%s.name: region '%s' was truncated: its object %s has %lld bytes, "
           "the registration needs %" PRIu64
           " (unregister it and register it again)",
           field, r->name, r->key, (long long)st.st_size,
           r->offset + r->byte_size);
  return -1;
}

int cgs_region_acquire(cgs_regions *rs, const char *owner, const char *field,
                       const char *name, uint64_t offset, uint64_t len,
                       size_t align, cgs_region **out, unsigned char **ptr,
                       grpc_status_code *code, char *msg, size_t msglen) {
  owner = owner ? owner : "";
  *out = NULL;
  pthread_mutex_lock(&rs->mu);
  int rc = -1;
  int i = find(rs, owner, name);
  cgs_region *r = i >= 0 ? rs->tab[i] : NULL;
  if (!r) {
    *code = GRPC_STATUS_NOT_FOUND;
    snprintf(msg, msglen,
             "%s.name: no region '%s' is registered (RegisterRegion it "
             "first; a restarted server has none)",
             field, name);
  } else if (offset > r->byte_size || len > r->byte_size - offset) {
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen,
             "%s: %" PRIu64 " bytes at offset %" PRIu64
             " do not fit region '%s' of %" PRIu64 " bytes",
             field, len, offset, name, r->byte_size);
  } else if (align > 1 && (uintptr_t)(r->data + offset) % align) {
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen,
             "%s.offset: %" PRIu64
             " is not aligned to the %zu-byte elements (offset in the object "
             "%" PRIu64 ")",
             field, offset, align, r->offset + offset);
  } else if (still_whole(r, field, code, msg, msglen) == 0) {
    atomic_fetch_add(&r->refs, 1);
    atomic_store(&r->used_ns, now_ns());
    *out = r;
    *ptr = r->data + offset;
    rc = 0;
  }
  pthread_mutex_unlock(&rs->mu);
  return rc;
}

uint64_t cgs_region_offset(const cgs_region *r, const unsigned char *p) {
  return (uint64_t)(p - r->data);
}

int cgs_region_overlap(const cgs_region *a, const unsigned char *pa,
                       uint64_t alen, const cgs_region *b,
                       const unsigned char *pb, uint64_t blen) {
  /* Offsets in the object; each range lies within its region, so the
   * sums stay far below 2^64. */
  uint64_t x = a->offset + cgs_region_offset(a, pa);
  uint64_t y = b->offset + cgs_region_offset(b, pb);
  return a->dev == b->dev && a->ino == b->ino && x < y + blen && y < x + alen;
}

const char *cgs_region_name(const cgs_region *r) {
  return r->name;
}
