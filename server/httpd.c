/* httpd.c - owns the HTTP endpoint's socket and its libmicrohttpd daemon.
 *
 * The socket is bound here rather than by libmicrohttpd, so that a bad or
 * busy address is refused with the system's reason at start-up. */
#include "cgs_httpd.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "cg/error.h"

/* A scraper needs one connection; these leave room for several and for a
 * person with curl, while a flood of idle connections is cut off. */
#define MAX_CONNECTIONS 32
#define MAX_CONNECTIONS_PER_ADDRESS 8
#define CONNECTION_TIMEOUT_S 10

struct cgs_httpd {
  cgs_httpd_config cfg;
  struct MHD_Daemon *daemon;
  int port;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status,
                             const char *text, size_t len,
                             enum MHD_ResponseMemoryMode mode,
                             const char *content_type, const char *allow) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, (void *)text, mode);
  if (!r) {
    if (mode == MHD_RESPMEM_MUST_FREE)
      free((void *)text);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  if (allow)
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn,
                              const char *url, const char *method,
                              const char *version, const char *upload_data,
                              size_t *upload_data_size, void **req_cls) {
  cgs_httpd *h = cls;
  (void)version;
  (void)upload_data;
  (void)upload_data_size;
  (void)req_cls;
  static const char plain[] = "text/plain; charset=utf-8";
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    static const char msg[] = "only GET and HEAD\n";
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, msg, sizeof msg - 1,
                 MHD_RESPMEM_PERSISTENT, plain, "GET, HEAD");
  }
  if (strcmp(url, h->cfg.path) != 0) {
    static const char msg[] = "not found\n";
    return reply(conn, MHD_HTTP_NOT_FOUND, msg, sizeof msg - 1,
                 MHD_RESPMEM_PERSISTENT, plain, NULL);
  }
  size_t len = 0;
  char *text = h->cfg.render(h->cfg.data, &len);
  if (!text) {
    static const char msg[] = "out of memory\n";
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, msg, sizeof msg - 1,
                 MHD_RESPMEM_PERSISTENT, plain, NULL);
  }
  return reply(conn, MHD_HTTP_OK, text, len, MHD_RESPMEM_MUST_FREE,
               h->cfg.content_type, NULL);
}

/* Binds and listens on "HOST:PORT" or "[V6ADDR]:PORT"; returns the socket
 * or -1 with err filled. */
static int bind_address(const char *listen_on, int *port, char *err,
                        size_t errlen) {
  char host[256];
  const char *colon = strrchr(listen_on, ':');
  size_t hlen = colon ? (size_t)(colon - listen_on) : 0;
  if (!colon || hlen == 0 || hlen >= sizeof host || !colon[1]) {
    snprintf(err, errlen, "--metrics-listen '%s': expected HOST:PORT",
             listen_on);
    return -1;
  }
  memcpy(host, listen_on, hlen);
  host[hlen] = '\0';
  if (host[0] == '[' && hlen > 2 && host[hlen - 1] == ']') {
    memmove(host, host + 1, hlen - 2);
    host[hlen - 2] = '\0';
  }
  char *end;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (errno || *end || p < 0 || p > 65535) {
    snprintf(err, errlen, "--metrics-listen '%s': the port must be 0..65535",
             listen_on);
    return -1;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                  *ai = NULL;
  int gai = getaddrinfo(host, colon + 1, &hints, &ai);
  if (gai != 0) {
    snprintf(err, errlen, "--metrics-listen '%s': %s", listen_on,
             gai_strerror(gai));
    return -1;
  }
  int fd =
      socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  int one = 1;
  if (fd < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    snprintf(err, errlen, "--metrics-listen '%s': %s", listen_on,
             strerror(errno));
    if (fd >= 0)
      close(fd);
    freeaddrinfo(ai);
    return -1;
  }
  freeaddrinfo(ai);
  union {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr_storage any;
  } bound;
  memset(&bound, 0, sizeof bound);
  socklen_t blen = sizeof bound;
  if (getsockname(fd, &bound.sa, &blen) != 0) {
    snprintf(err, errlen, "--metrics-listen '%s': getsockname: %s", listen_on,
             strerror(errno));
    close(fd);
    return -1;
  }
  *port = ntohs(bound.sa.sa_family == AF_INET6 ? bound.in6.sin6_port
                                               : bound.in4.sin_port);
  return fd;
}

int cgs_httpd_start(cgs_httpd **out, const cgs_httpd_config *cfg, char *err,
                    size_t errlen) {
  *out = NULL;
  cgs_httpd *h = calloc(1, sizeof *h);
  if (!h)
    return cg_errorf(err, errlen, CG_ENOMEM, "metrics: out of memory");
  h->cfg = *cfg;
  int fd = bind_address(cfg->listen, &h->port, err, errlen);
  if (fd < 0) {
    free(h);
    return CG_EINVAL;
  }
  /* The daemon's thread inherits this mask: signals belong to the loop. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  h->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, answer, h,
      MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)MAX_CONNECTIONS_PER_ADDRESS, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)CONNECTION_TIMEOUT_S, MHD_OPTION_END);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!h->daemon) {
    close(fd);
    free(h);
    return cg_errorf(err, errlen, CG_EINTERNAL,
                     "--metrics-listen '%s': libmicrohttpd would not start",
                     cfg->listen);
  }
  *out = h;
  return 0;
}

int cgs_httpd_port(const cgs_httpd *h) {
  return h->port;
}

void cgs_httpd_stop(cgs_httpd *h) {
  if (!h)
    return;
  /* MHD_stop_daemon closes the listen socket it was given. */
  MHD_stop_daemon(h->daemon);
  free(h);
}
