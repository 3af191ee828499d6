/* listen.c - owns the server's listen addresses: parsing --listen,
 * binding each entry, the unix socket files' mode and removal (see
 * cgs_listen.h). */
#include "cgs_listen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define UNIX_PREFIX "unix:"

/* HOST:PORT, with HOST a name, an IPv4 address or [IPv6]. */
static int tcp_entry_ok(const char *e) {
  const char *colon = strrchr(e, ':');
  if (!colon || colon == e || !colon[1] || strlen(colon + 1) > 5)
    return 0;
  for (const char *p = colon + 1; *p; p++)
    if (*p < '0' || *p > '9')
      return 0;
  return strtol(colon + 1, NULL, 10) <= 65535;
}

static int parse_entry(const char *e, size_t len, cgs_listener *l, char *err,
                       size_t errlen) {
  size_t pre = strlen(UNIX_PREFIX);
  memset(l, 0, sizeof *l);
  if (len == 0 || len >= sizeof l->target) {
    snprintf(err, errlen, "--listen: entry '%.*s' is %s", (int)len, e,
             len ? "too long" : "empty");
    return -1;
  }
  memcpy(l->target, e, len);
  if (strncmp(l->target, UNIX_PREFIX, pre) != 0) {
    if (!tcp_entry_ok(l->target)) {
      snprintf(err, errlen,
               "--listen: '%s' is neither HOST:PORT (port 0..65535) nor "
               "unix:/PATH",
               l->target);
      return -1;
    }
    return 0;
  }
  l->path = l->target + pre;
  struct sockaddr_un sa;
  if (l->path[0] != '/' || strlen(l->path) >= sizeof sa.sun_path) {
    snprintf(err, errlen,
             "--listen: '%s': a unix socket needs an absolute path of at "
             "most %zu bytes",
             l->target, sizeof sa.sun_path - 1);
    return -1;
  }
  return 0;
}

int cgs_listen_parse(const char *text, cgs_listeners *out, char *err,
                     size_t errlen) {
  memset(out, 0, sizeof *out);
  const char *p = text;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (out->n == CGS_LISTEN_MAX) {
      snprintf(err, errlen, "--listen: at most %d addresses", CGS_LISTEN_MAX);
      return -1;
    }
    if (parse_entry(p, len, &out->l[out->n], err, errlen) != 0)
      return -1;
    for (int i = 0; i < out->n; i++)
      if (strcmp(out->l[i].target, out->l[out->n].target) == 0) {
        snprintf(err, errlen, "--listen: '%s' is given twice",
                 out->l[i].target);
        return -1;
      }
    out->n++;
    if (!comma)
      return 0;
    p = comma + 1;
  }
}

/* 1 when a process accepts connections on the socket at path. */
static int socket_live(const char *path) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  int live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return live;
}

/* Clears the way for a socket at path: nothing there, or a socket that a
 * previous server left behind (bind would fail on it). A socket someone
 * still listens on, or any other kind of file, stays. */
static int clear_stale(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT)
      return 0;
    snprintf(err, errlen, "--listen: cannot inspect %s: %s", path,
             strerror(errno));
    return -1;
  }
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen,
             "--listen: unix:%s exists and is not a socket; not replacing it",
             path);
    return -1;
  }
  if (socket_live(path)) {
    snprintf(err, errlen, "--listen: unix:%s is in use by a running process",
             path);
    return -1;
  }
  if (unlink(path) != 0) {
    snprintf(err, errlen, "--listen: cannot remove the stale socket %s: %s",
             path, strerror(errno));
    return -1;
  }
  return 0;
}

int cgs_listen_bind(cgs_listeners *ls, grpc_server *g,
                    grpc_server_credentials *tcp_creds,
                    grpc_server_credentials *unix_creds, unsigned mode,
                    char *err, size_t errlen) {
  for (int i = 0; i < ls->n; i++) {
    cgs_listener *l = &ls->l[i];
    if (l->path && clear_stale(l->path, err, errlen) != 0)
      return -1;
    int port = grpc_server_add_http2_port(g, l->target,
                                          l->path ? unix_creds : tcp_creds);
    if (port <= 0) {
      snprintf(err, errlen, "--listen: cannot bind '%s' (%s)", l->target,
               l->path ? "is its directory writable?" : "in use?");
      return -1;
    }
    l->bound = 1;
    if (!l->path) {
      l->port = port;
      continue;
    }
    /* The socket exists once bound; its mode says who may connect. */
    if (chmod(l->path, mode) != 0) {
      snprintf(err, errlen, "--socket-mode: cannot set %o on %s: %s", mode,
               l->path, strerror(errno));
      return -1;
    }
  }
  return 0;
}

int cgs_listen_tcp_port(const cgs_listeners *ls) {
  for (int i = 0; i < ls->n; i++)
    if (!ls->l[i].path)
      return ls->l[i].port;
  return 0;
}

void cgs_listen_remove(cgs_listeners *ls) {
  for (int i = 0; i < ls->n; i++)
    if (ls->l[i].path && ls->l[i].bound) {
      unlink(ls->l[i].path);
      ls->l[i].bound = 0;
    }
}
