/* cgs_listen.h - the addresses the server listens on: --listen as a comma
 * list of HOST:PORT and unix:PATH entries, bound on a grpc_server, the
 * unix socket files' mode and their removal.
 *
 * A unix socket lets a trainer on the same host reach the server without
 * TCP; the file gets --socket-mode, a stale socket left by a crashed
 * server is replaced at start (any other kind of file at the path is
 * refused) and the server removes its own sockets at exit. */
#ifndef CGS_LISTEN_H
#define CGS_LISTEN_H

#include <stddef.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#define CGS_LISTEN_MAX 4

typedef struct cgs_listener {
  char target[256]; /* as grpc takes it: HOST:PORT or unix:PATH */
  const char *path; /* into target: the socket file; NULL for TCP */
  int port;         /* the bound TCP port; 0 for a unix socket */
  int bound;        /* 1 once bound (its socket file is ours to remove) */
} cgs_listener;

typedef struct cgs_listeners {
  cgs_listener l[CGS_LISTEN_MAX];
  int n;
} cgs_listeners;

/* Parses --listen into *out. Every entry is HOST:PORT (port 0..65535, 0
 * picks a free one) or unix:PATH with an absolute PATH that fits a
 * socket address. Returns 0 or -1 with err naming the entry. */
int cgs_listen_parse(const char *text, cgs_listeners *out, char *err,
                     size_t errlen);
/* Binds every entry on g, TCP ones with tcp_creds and unix ones with
 * unix_creds: a unix PATH holding a stale socket is unlinked first, then
 * the new socket is given mode. Returns 0 or -1 with err; entries bound
 * before the failure stay bound (see cgs_listen_remove). */
int cgs_listen_bind(cgs_listeners *ls, grpc_server *g,
                    grpc_server_credentials *tcp_creds,
                    grpc_server_credentials *unix_creds, unsigned mode,
                    char *err, size_t errlen);
/* The first TCP entry's bound port, or 0 when there is none. */
int cgs_listen_tcp_port(const cgs_listeners *ls);
/* Removes the socket files of the unix entries this process bound. */
void cgs_listen_remove(cgs_listeners *ls);

#endif
