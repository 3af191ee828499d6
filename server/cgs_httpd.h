/* cgs_httpd.h - a small read-only HTTP endpoint (libmicrohttpd) serving
 * one document at one path, rendered afresh for every GET: the server's
 * /metrics.
 *
 * It runs on libmicrohttpd's own thread, never on the loop or a worker, so
 * a slow or hostile scraper cannot stall gRPC calls; connections are
 * capped (in all and per address) and time out. Anything but GET or HEAD
 * is answered 405, any other path 404. */
#ifndef CGS_HTTPD_H
#define CGS_HTTPD_H

#include <stddef.h>

typedef struct cgs_httpd cgs_httpd;

/* Renders the document on the endpoint's thread: returns text from
 * malloc (the endpoint frees it) with *len set, or NULL when out of
 * memory (answered 500). Must be thread-safe. */
typedef char *(*cgs_httpd_render_cb)(void *data, size_t *len);

typedef struct cgs_httpd_config {
  const char *listen;       /* HOST:PORT ([V6ADDR]:PORT); port 0 = any free */
  const char *path;         /* "/metrics" */
  const char *content_type; /* of the document */
  cgs_httpd_render_cb render;
  void *data; /* for render */
} cgs_httpd_config;

/* Binds cfg->listen and starts serving. The strings must outlive the
 * endpoint. Returns 0, or CG_EINVAL (a malformed or unusable address,
 * named in err), CG_ENOMEM or CG_EINTERNAL; nothing runs on failure.
 * *out is owned by the caller and released with cgs_httpd_stop(). */
int cgs_httpd_start(cgs_httpd **out, const cgs_httpd_config *cfg, char *err,
                    size_t errlen);
/* The bound port. */
int cgs_httpd_port(const cgs_httpd *h);
/* Stops serving, waits for the endpoint's thread (render is not called
 * after this returns) and frees h. NULL is fine. */
void cgs_httpd_stop(cgs_httpd *h);

#endif
