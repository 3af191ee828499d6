/* region.c - cgc_region: shared-memory objects the client creates, maps
 * and registers on a channel (RegisterRegion / UnregisterRegion), and the
 * lookup compute.c uses to send tensors in them by reference. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cg/text.h"
#include "convgrad/v1/convgrad.pb-c.h"
#include "internal.h"

#define CGC__KEY_MAX 202 /* "/NAME": '/', 200, NUL */

struct cgc_region {
  char key[CGC__KEY_MAX];
  void *base;       /* the mapping */
  size_t size;      /* its bytes */
  int fd;           /* the object, open while mapped */
  int unlinked;     /* its name was removed (cgc_region_unlink) */
  cgc_channel *ch;  /* registered on; NULL when not */
  cgc_region *next; /* in ch's list, under ch->regions_mu */
};

/* What the server accepts: "/NAME". */
static int cgc__plain_key(const char *key) {
  return key[0] == '/' && cg_text_plain_name(key + 1, 200);
}

/* The group $CONVGRAD_SHM_GROUP names (a name or a number) in *gid, or
 * -1 when it is unset or empty. */
static int cgc__shm_group(gid_t *gid, char *err, size_t errlen) {
  const char *name = getenv("CONVGRAD_SHM_GROUP");
  *gid = (gid_t)-1;
  if (!name || !*name)
    return 0;
  char buf[4096], *end;
  struct group g, *found = NULL;
  if (getgrnam_r(name, &g, buf, sizeof buf, &found) == 0 && found) {
    *gid = found->gr_gid;
    return 0;
  }
  errno = 0;
  unsigned long n = strtoul(name, &end, 10);
  if (*name >= '0' && *name <= '9' && !*end && errno == 0 &&
      n < (unsigned long)(gid_t)-1) {
    *gid = (gid_t)n;
    return 0;
  }
  return cg_errorf(err, errlen, CG_EINVAL,
                   "CONVGRAD_SHM_GROUP: no group '%s' (a group name or number)",
                   name);
}

/* Gives the object to gid, read-write for the group: a server running as a
 * user of its own (the Debian package's convgrad) opens it through a group
 * it shares with the caller. */
static int cgc__share_with_group(const cgc_region *r, gid_t gid, char *err,
                                 size_t errlen) {
  if (fchown(r->fd, (uid_t)-1, gid) != 0 || fchmod(r->fd, 0660) != 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "CONVGRAD_SHM_GROUP: cannot give %s to group %ld: %s "
                     "(the caller must be a member)",
                     r->key, (long)gid, strerror(errno));
  return 0;
}

/* The inode of this process's pid namespace, or 0 when /proc cannot say:
 * a pid in a fresh name means something only inside its namespace, and
 * containers that share /dev/shm need not share one. */
static unsigned long cgc__pid_namespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long)st.st_ino : 0;
}

/* Whether name (a /dev/shm entry) is a fresh name made by a process of
 * namespace ns under prefix, with that process's pid in *pid. */
static int cgc__fresh_name_of(const char *name, const char *prefix,
                              unsigned long ns, long *pid) {
  size_t n = strlen(prefix);
  if (strncmp(name, prefix, n) != 0)
    return 0;
  const char *p = name + n;
  char *end;
  unsigned long fields[4];
  for (int i = 0; i < 4; i++) {
    int base = i < 3 ? 10 : 16; /* pid, namespace, counter, random */
    if (!strchr("0123456789abcdef", *p) || !*p || (base == 10 && *p >= 'a'))
      return 0; /* strtoul would take a sign or spaces */
    errno = 0;
    fields[i] = strtoul(p, &end, base);
    if (errno || *end != (base == 10 ? '-' : '\0'))
      return 0;
    p = end + 1;
  }
  *pid = (long)fields[0];
  return fields[1] == ns && *pid > 0 && fields[0] <= (unsigned long)INT32_MAX;
}

/* Removes the objects of fresh names under prefix whose process is gone:
 * one killed by SIGKILL, or by a signal its runtime does not turn into an
 * exit, never runs cgc_region_free, and /dev/shm is memory that nothing
 * else returns until reboot. Only this user's objects, made in this pid
 * namespace by a process that no longer exists in it: another process's
 * live region is never touched (a pid reused since keeps its dead
 * predecessor's objects, to the next sweep after it ends). */
static void cgc__sweep_dead(const char *prefix, unsigned long ns) {
  DIR *dir = opendir("/dev/shm");
  if (!dir)
    return;
  struct dirent *e;
  char key[CGC__KEY_MAX];
  long pid;
  struct stat st;
  while ((e = readdir(dir)) != NULL) {
    if (!cgc__fresh_name_of(e->d_name, prefix, ns, &pid) ||
        pid == (long)getpid() ||
        fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || st.st_uid != geteuid())
      continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
      continue;
    if (snprintf(key, sizeof key, "/%s", e->d_name) < (int)sizeof key)
      shm_unlink(key);
  }
  closedir(dir);
}

int cgc_region_create(cgc_region **out, const char *key, size_t bytes,
                      char *err, size_t errlen) {
  static unsigned long counter;
  static int swept;
  *out = NULL;
  if (bytes == 0)
    return cg_errorf(err, errlen, CG_EINVAL, "bytes: must be > 0");
  if (bytes > (size_t)INT64_MAX)
    return cg_errorf(err, errlen, CG_ERANGE, "bytes: %zu is too large", bytes);
  gid_t group;
  int rc = cgc__shm_group(&group, err, errlen);
  if (rc)
    return rc;
  cgc_region *r = calloc(1, sizeof *r);
  if (!r)
    return cg_errorf(err, errlen, CG_ENOMEM, "out of memory");
  if (key) {
    if (strlen(key) >= sizeof r->key || !cgc__plain_key(key)) {
      free(r);
      return cg_errorf(err, errlen, CG_EINVAL,
                       "key: must be /NAME, NAME 1 to 200 of A-Z a-z 0-9 . _ "
                       "- (not only dots), got '%s'",
                       key);
    }
    snprintf(r->key, sizeof r->key, "%s", key);
  } else {
    /* The server's --shm-prefix reads the same variable, so a sidecar and
     * its server given one environment agree. */
    const char *prefix = getenv("CONVGRAD_SHM_PREFIX");
    if (!prefix)
      prefix = "convgrad-";
    if (*prefix && !cg_text_plain_name(prefix, 64)) {
      free(r);
      return cg_errorf(err, errlen, CG_EINVAL,
                       "CONVGRAD_SHM_PREFIX: must be 1 to 64 of A-Z a-z 0-9 . "
                       "_ - (not only dots), got '%s'",
                       prefix);
    }
    unsigned long ns = cgc__pid_namespace();
    const char *sweep = getenv("CONVGRAD_SHM_SWEEP");
    if (ns && !(sweep && strcmp(sweep, "0") == 0) &&
        !__atomic_exchange_n(&swept, 1, __ATOMIC_ACQ_REL))
      cgc__sweep_dead(prefix, ns);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(r->key, sizeof r->key, "/%s%ld-%lu-%lu-%08lx", prefix,
             (long)getpid(), ns,
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED),
             (unsigned long)(ts.tv_nsec ^ (ts.tv_sec << 8)) & 0xfffffffful);
  }
  r->fd = shm_open(r->key, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (r->fd < 0) {
    int e = errno;
    cg_errorf(err, errlen, e == EEXIST ? CG_EINVAL : CG_EINTERNAL,
              "shm_open %s: %s", r->key, strerror(e));
    free(r);
    return e == EEXIST ? CG_EINVAL : CG_EINTERNAL;
  }
  if (group != (gid_t)-1 &&
      (rc = cgc__share_with_group(r, group, err, errlen)) != 0) {
    shm_unlink(r->key);
    close(r->fd);
    free(r);
    return rc;
  }
  /* The pages are reserved now: on a /dev/shm too small for the object
   * (a container's default is 64 MiB) the creation fails here, instead of
   * a later write into the mapping killing the process with SIGBUS. A file
   * system without fallocate keeps the object sparse. */
  int reserve = 0;
  if (ftruncate(r->fd, (off_t)bytes) != 0)
    reserve = errno;
  else if ((reserve = posix_fallocate(r->fd, 0, (off_t)bytes)) == EOPNOTSUPP ||
           reserve == EINVAL)
    reserve = 0;
  if (reserve != 0 || (r->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                      MAP_SHARED, r->fd, 0)) == MAP_FAILED) {
    if (reserve)
      errno = reserve;
    cg_errorf(err, errlen, CG_ENOMEM, "%s: cannot make %zu bytes: %s", r->key,
              bytes, strerror(errno));
    shm_unlink(r->key);
    close(r->fd);
    free(r);
    return CG_ENOMEM;
  }
  r->size = bytes;
  *out = r;
  return 0;
}

void *cgc_region_data(const cgc_region *r) {
  return r->base;
}

size_t cgc_region_size(const cgc_region *r) {
  return r->size;
}

const char *cgc_region_key(const cgc_region *r) {
  return r->key;
}

int cgc_region_view(cgc_region *r, size_t offset, cg_dtype dtype, int rank,
                    const int64_t *dims, cgc_layout layout, cgc_tensor_view *v,
                    cgc_status *st) {
  size_t es = cg_dtype_size(dtype), n = es;
  memset(v, 0, sizeof *v);
  if (!es || rank < 1 || rank > CG_MAX_RANK) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "view: bad dtype (%d) or rank (%d)", (int)dtype, rank);
    return CG_EINVAL;
  }
  for (int i = 0; i < rank; i++)
    if (dims[i] < 0 || __builtin_mul_overflow(n, (size_t)dims[i], &n)) {
      cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                      "view: dims[%d] negative or overflowing", i);
      return CG_ERANGE;
    }
  if (offset % es || offset > r->size || n > r->size - offset) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "view: %zu bytes at offset %zu do not fit %s (%zu bytes, "
                    "offsets multiples of %zu)",
                    n, offset, r->key, r->size, es);
    return CG_ERANGE;
  }
  v->dtype = dtype;
  v->rank = rank;
  memcpy(v->dims, dims, (size_t)rank * sizeof *dims);
  v->layout = layout;
  v->data = (const char *)r->base + offset;
  v->nbytes = n;
  return 0;
}

#define CGC__REGION_REQ_MAX 512

/* Packs req into buf (CGC__REGION_REQ_MAX bytes): its length, or 0 after
 * filling st. */
static size_t cgc__region_pack(const ProtobufCMessage *req, uint8_t *buf,
                               cgc_status *st) {
  if (protobuf_c_message_get_packed_size(req) > CGC__REGION_REQ_MAX) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "request too large");
    return 0;
  }
  return protobuf_c_message_pack(req, buf);
}

/* One unary region call of method with request req (packed here). */
static int cgc__region_rpc(cgc_channel *ch, const char *method,
                           const ProtobufCMessage *req, cgc_status *st) {
  uint8_t buf[CGC__REGION_REQ_MAX];
  size_t len = cgc__region_pack(req, buf, st);
  if (!len)
    return CG_EINVAL;
  void *resp = NULL;
  size_t resplen = 0;
  cgc__try t = {cgc__deadline(ch, 0), 0, -1};
  int rc = cgc__unary(ch, method, buf, len, &t, &resp, &resplen, st);
  free(resp); /* the responses carry nothing */
  return rc;
}

static const char cgc__register_method[] =
    "/convgrad.v1.ConvGrad/RegisterRegion";

/* Fills req, a RegisterRegionRequest for r (pointing into it). */
static void cgc__register_request(Convgrad__V1__RegisterRegionRequest *req,
                                  const cgc_region *r) {
  Convgrad__V1__RegisterRegionRequest init =
      CONVGRAD__V1__REGISTER_REGION_REQUEST__INIT;
  *req = init;
  req->name = (char *)cgc__region_name(r);
  req->key = (char *)r->key;
  req->offset = 0;
  req->byte_size = r->size;
}

int cgc__region_register_start(cgc__unary_call *u, cgc_channel *ch,
                               const cgc_region *r, grpc_completion_queue *cq,
                               cgc__tag *tag, const cgc__try *t,
                               cgc_status *st) {
  Convgrad__V1__RegisterRegionRequest req;
  uint8_t buf[CGC__REGION_REQ_MAX];
  cgc__register_request(&req, r);
  size_t len = cgc__region_pack(&req.base, buf, st);
  return len ? cgc__unary_start(u, ch, cq, tag, cgc__register_method, buf, len,
                                t, st)
             : CG_EINVAL;
}

const char *cgc__region_name(const cgc_region *r) {
  return r->key + 1;
}

int cgc_region_register(cgc_channel *ch, cgc_region *r, cgc_status *st) {
  if (r->unlinked) {
    cgc__status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                    "region %s was unlinked: the server cannot open it",
                    r->key);
    return CG_EINVAL;
  }
  if (r->ch) {
    cgc__status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                    "region %s is registered already", r->key);
    return CG_EINVAL;
  }
  Convgrad__V1__RegisterRegionRequest req;
  cgc__register_request(&req, r);
  int rc = cgc__region_rpc(ch, cgc__register_method, &req.base, st);
  if (rc)
    return rc;
  pthread_mutex_lock(&ch->regions_mu);
  r->ch = ch;
  r->next = ch->regions;
  ch->regions = r;
  pthread_mutex_unlock(&ch->regions_mu);
  return 0;
}

/* Takes r out of its channel's list. */
static void cgc__region_detach(cgc_region *r) {
  cgc_channel *ch = r->ch;
  pthread_mutex_lock(&ch->regions_mu);
  for (cgc_region **p = &ch->regions; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      break;
    }
  pthread_mutex_unlock(&ch->regions_mu);
  r->ch = NULL;
  r->next = NULL;
}

int cgc_region_unregister(cgc_region *r, cgc_status *st) {
  if (!r->ch) {
    cgc__status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                    "region %s is not registered", r->key);
    return CG_EINVAL;
  }
  cgc_channel *ch = r->ch;
  cgc__region_detach(r);
  Convgrad__V1__UnregisterRegionRequest req =
      CONVGRAD__V1__UNREGISTER_REGION_REQUEST__INIT;
  req.name = (char *)cgc__region_name(r);
  return cgc__region_rpc(ch, "/convgrad.v1.ConvGrad/UnregisterRegion",
                         &req.base, st);
}

int cgc_region_unlink(cgc_region *r, cgc_status *st) {
  int rc = 0;
  if (r->ch)
    rc = cgc_region_unregister(r, st);
  if (!r->unlinked && shm_unlink(r->key) != 0 && errno != ENOENT && !rc) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "shm_unlink %s: %s", r->key,
                    strerror(errno));
    rc = CG_EINTERNAL;
  }
  r->unlinked = 1;
  return rc;
}

void cgc_region_free(cgc_region *r) {
  if (!r)
    return;
  cgc_region_unlink(r, NULL); /* best effort: the server may be gone */
  munmap(r->base, r->size);
  close(r->fd);
  free(r);
}

const cgc_region *cgc__region_find(cgc_channel *ch, const void *p, size_t n,
                                   uint64_t *offset) {
  const cgc_region *found = NULL;
  uintptr_t b = (uintptr_t)p;
  pthread_mutex_lock(&ch->regions_mu);
  for (const cgc_region *r = ch->regions; r && !found; r = r->next) {
    uintptr_t base = (uintptr_t)r->base;
    if (b >= base && b - base <= r->size && n <= r->size - (b - base)) {
      found = r;
      *offset = (uint64_t)(b - base);
    }
  }
  pthread_mutex_unlock(&ch->regions_mu);
  return found;
}

void cgc__regions_close(cgc_channel *ch) {
  while (ch->regions)
    cgc_region_unregister(ch->regions, NULL);
}
