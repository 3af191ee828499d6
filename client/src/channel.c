/* channel.c - cgc_channel: options, target rewriting (HOST:PORT lists to
 * gRPC ipv4:/ipv6: address lists), the round_robin service config, and the
 * channel's life, with its replicas' channels (cgc_options.replicas; what
 * a call does over them is split.c's). Deadlines and retries are
 * retry.c's. */
#include <arpa/inet.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>

#include "cgw_tls.h"
#include "internal.h"

#define CGC__MIB ((size_t)1 << 20)

/* Balancing is gRPC's own: every resolved address becomes a subchannel and
 * calls rotate over the READY ones. */
static const char cgc__service_config[] =
    "{\"loadBalancingConfig\":[{\"round_robin\":{}}]}";

void cgc_options_init(cgc_options *o) {
  memset(o, 0, sizeof *o);
  o->deadline_ms = 60000;
  o->max_message_bytes = 16 * (int64_t)CGC__MIB;
  o->upload_chunk_bytes = CGC__MIB;
  o->download_chunk_bytes = 0;
  o->max_output_bytes = (uint64_t)4 << 30;
  o->retries = 5;
  o->backoff_initial_ms = 50;
  o->backoff_max_ms = 2000;
  o->backoff_multiplier = 2.0;
  o->hedge_budget = 0.05;
  /* Unparsable: NAN, which cgc_channel_new refuses, naming the variable. */
  const char *rate = getenv("CONVGRAD_VERIFY_RATE");
  if (rate && *rate) {
    char *end;
    o->verify_rate = strtod(rate, &end);
    if (*end)
      o->verify_rate = NAN;
  }
}

static int cgc__given(const char *s) {
  return s && *s;
}

/* 1 when o asks for TLS. */
static int cgc__tls(const cgc_options *o) {
  return cgc__given(o->tls_ca_file) || cgc__given(o->tls_cert_file) ||
         cgc__given(o->tls_key_file);
}

static int cgc__check_options(const cgc_options *o, char *err, size_t errlen) {
  if (o->deadline_ms <= 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "deadline_ms: must be > 0, got %lld",
                     (long long)o->deadline_ms);
  /* gRPC takes an int for the message caps. */
  if (o->max_message_bytes < 1024 || o->max_message_bytes > 0x7fffffff)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "max_message_bytes: must be in [1024, 2^31-1], got %lld",
                     (long long)o->max_message_bytes);
  /* An upload chunk plus its framing must fit one message. */
  if (o->upload_chunk_bytes > (size_t)o->max_message_bytes - 256)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "upload_chunk_bytes: %zu does not fit max_message_bytes "
                     "%lld",
                     o->upload_chunk_bytes, (long long)o->max_message_bytes);
  /* The server refuses smaller ones (one message per few bytes). */
  if (o->download_chunk_bytes != 0 && o->download_chunk_bytes < 1024)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "download_chunk_bytes: must be 0 (the server's default) "
                     "or at least 1024, got %u",
                     o->download_chunk_bytes);
  if (o->retries < 0 || o->backoff_initial_ms < 0 || o->backoff_max_ms < 0 ||
      o->backoff_multiplier < 1.0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "retries/backoff: counts and times must be >= 0 and the "
                     "multiplier >= 1");
  if (o->replicas < 0 || o->replicas > CGC__REPLICAS_MAX ||
      o->split_parts < 0 || o->split_parts > CGC__PARTS_MAX ||
      !(o->hedge_budget >= 0 && o->hedge_budget <= 1))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "replicas/split_parts/hedge_budget: must be in [0, %d], "
                     "[0, %d] and [0, 1]",
                     CGC__REPLICAS_MAX, CGC__PARTS_MAX);
  if (!(o->verify_rate >= 0 && o->verify_rate <= 1))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "verify_rate: must be in [0, 1], got %g (the default "
                     "comes from CONVGRAD_VERIFY_RATE)",
                     o->verify_rate);
  for (const char *p = o->token; p && *p; p++)
    if (*p <= ' ' || *p > '~')
      return cg_errorf(err, errlen, CG_EINVAL,
                       "token: printable ASCII without spaces only");
  if (cgc__given(o->tls_server_name) && !cgc__tls(o))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "tls_server_name: needs TLS (tls_ca_file, or "
                     "tls_cert_file and tls_key_file)");
  return 0;
}

/* Length of the gRPC URI scheme target starts with, 0 for none. */
static size_t cgc__scheme_len(const char *t) {
  static const char *const schemes[] = {
      "dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:"};
  for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
    if (strncmp(t, schemes[i], strlen(schemes[i])) == 0)
      return strlen(schemes[i]);
  return 0;
}

#define CGC__HOST_MAX 256

/* Splits one "HOST:PORT" or "[V6]:PORT" (len bytes at item) into host
 * and a port in 1..65535, checking only the syntax: nothing is resolved. */
static int cgc__split_item(const char *item, size_t len,
                           char host[CGC__HOST_MAX], long *port, char *err,
                           size_t errlen) {
  char buf[300];
  if (len == 0 || len >= sizeof buf)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "target: empty or overlong HOST:PORT entry");
  memcpy(buf, item, len);
  buf[len] = '\0';
  const char *hs = buf, *colon;
  size_t hl;
  if (buf[0] == '[') {
    const char *rb = strchr(buf, ']');
    if (!rb || rb[1] != ':')
      return cg_errorf(err, errlen, CG_EINVAL,
                       "target: '%s': expected [IPV6]:PORT", buf);
    hs = buf + 1;
    hl = (size_t)(rb - hs);
    colon = rb + 1;
  } else {
    colon = strrchr(buf, ':');
    if (!colon || strchr(buf, ':') != colon)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "target: '%s': expected HOST:PORT (IPv6 as [ADDR]:PORT)",
                       buf);
    hl = (size_t)(colon - buf);
  }
  if (hl == 0 || hl >= CGC__HOST_MAX || strlen(colon + 1) == 0 ||
      strspn(colon + 1, "0123456789") != strlen(colon + 1))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "target: '%s': expected HOST:PORT with a numeric port",
                     buf);
  memcpy(host, hs, hl);
  host[hl] = '\0';
  /* strtol saturates, and gRPC would wrap a port above 65535 modulo 65536:
   * both are refused here. */
  *port = strtol(colon + 1, NULL, 10);
  if (*port < 1 || *port > 65535)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "target: '%s': port must be in 1..65535", buf);
  return 0;
}

/* Resolves one "HOST:PORT" or "[V6]:PORT": v4 / v6 receive "a.b.c.d:p" /
 * "[v6]:p" for the first address of each family ("" if none). */
static int cgc__resolve_item(const char *item, size_t len, char *v4, char *v6,
                             size_t outsz, char *err, size_t errlen) {
  char host[CGC__HOST_MAX], port[8];
  long p = 0;
  v4[0] = v6[0] = '\0';
  int rc = cgc__split_item(item, len, host, &p, err, errlen);
  if (rc)
    return rc;
  snprintf(port, sizeof port, "%ld", p);

  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int gai = getaddrinfo(host, port, &hints, &res);
  if (gai != 0)
    return cg_errorf(err, errlen, CG_EINVAL, "target: cannot resolve '%s': %s",
                     host, gai_strerror(gai));
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    char addr[INET6_ADDRSTRLEN];
    if (ai->ai_family == AF_INET && !v4[0] &&
        inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, addr,
                  sizeof addr))
      snprintf(v4, outsz, "%s:%ld", addr, p);
    else if (ai->ai_family == AF_INET6 && !v6[0] &&
             inet_ntop(AF_INET6,
                       &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, addr,
                       sizeof addr))
      snprintf(v6, outsz, "[%s]:%ld", addr, p);
  }
  freeaddrinfo(res);
  if (!v4[0] && !v6[0])
    return cg_errorf(err, errlen, CG_EINVAL,
                     "target: '%s' has no IPv4 or IPv6 address", host);
  return 0;
}

/* Checks the "A:P,B:P" list of an ipv4: (family AF_INET) or ipv6: target
 * as gRPC's sockaddr resolver will read it, later and silently. */
static int cgc__check_addr_list(const char *list, int family, char *err,
                                size_t errlen) {
  for (const char *p = list;; p++) {
    char host[CGC__HOST_MAX];
    unsigned char addr[sizeof(struct in6_addr)];
    long port;
    size_t len = strcspn(p, ",");
    int rc = cgc__split_item(p, len, host, &port, err, errlen);
    if (rc)
      return rc;
    /* A zone (%25eth0, URI-escaped) may follow an IPv6 address. */
    if (family == AF_INET6)
      host[strcspn(host, "%")] = '\0';
    if (inet_pton(family, host, addr) != 1)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "target: '%s' is not an %s address", host,
                       family == AF_INET ? "IPv4" : "IPv6");
    p += len;
    if (!*p)
      return 0;
  }
}

/* Checks a "SCHEME:..." target without resolving it. What names the
 * server(s) follows an optional "//AUTHORITY" and one '/', which gRPC
 * strips (dns:///NAME:PORT, dns://8.8.8.8/NAME:PORT, ipv4:///A:P). */
static int cgc__check_scheme_target(const char *target, size_t scheme_len,
                                    char *err, size_t errlen) {
  const char *name = target + scheme_len;
  size_t authority = 0;
  if (name[0] == '/' && name[1] == '/') {
    authority = strcspn(name + 2, "/");
    name += 2 + authority;
  }
  if (*name == '/')
    name++;
  int family = !strncmp(target, "ipv4:", 5)   ? AF_INET
               : !strncmp(target, "ipv6:", 5) ? AF_INET6
                                              : AF_UNSPEC;
  /* gRPC's address lists take no authority. */
  if (!*name || (family != AF_UNSPEC && authority))
    return cg_errorf(err, errlen, CG_EINVAL,
                     "target: '%s': no server named after '%.*s'", target,
                     (int)scheme_len, target);
  return family == AF_UNSPEC ? 0
                             : cgc__check_addr_list(name, family, err, errlen);
}

/* "h1:p1,h2:p2" -> "ipv4:a1:p1,a2:p2", or ipv6: when some host has no
 * IPv4 address (gRPC's address-list schemes take one family). Other
 * targets are checked without resolving (gRPC would accept a malformed
 * one and fail every call) and copied as they are. *out is malloc'ed. */
static int cgc__rewrite_target(const char *target, char **out, char *err,
                               size_t errlen) {
  if (!target || !*target)
    return cg_errorf(err, errlen, CG_EINVAL, "target: empty");
  size_t scheme_len = cgc__scheme_len(target);
  if (scheme_len || !strchr(target, ',')) {
    char host[CGC__HOST_MAX];
    long port;
    int rc =
        scheme_len
            ? cgc__check_scheme_target(target, scheme_len, err, errlen)
            : cgc__split_item(target, strlen(target), host, &port, err, errlen);
    if (rc)
      return rc;
    *out = strdup(target);
    return *out ? 0 : CG_ENOMEM;
  }
  size_t cap = strlen(target) * 4 + 64;
  char *l4 = calloc(1, cap), *l6 = calloc(1, cap);
  int all4 = 1, all6 = 1, rc = 0;
  if (!l4 || !l6) {
    rc = CG_ENOMEM;
    goto fail;
  }
  memcpy(l4, "ipv4:", 6);
  memcpy(l6, "ipv6:", 6);
  for (const char *p = target; *p;) {
    char v4[INET6_ADDRSTRLEN + 16], v6[INET6_ADDRSTRLEN + 16];
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    rc = cgc__resolve_item(p, len, v4, v6, sizeof v4, err, errlen);
    if (rc)
      goto fail;
    all4 &= v4[0] != '\0';
    all6 &= v6[0] != '\0';
    if (all4)
      snprintf(l4 + strlen(l4), cap - strlen(l4), "%s%s",
               p == target ? "" : ",", v4);
    if (all6)
      snprintf(l6 + strlen(l6), cap - strlen(l6), "%s%s",
               p == target ? "" : ",", v6);
    p += len;
    if (*p == ',')
      p++;
  }
  if (!all4 && !all6) {
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "target: the address list mixes IPv4-only and IPv6-only "
                   "hosts (use dns:/// or one family)");
    goto fail;
  }
  *out = all4 ? l4 : l6;
  free(all4 ? l6 : l4);
  return 0;
fail:
  free(l4);
  free(l6);
  return rc;
}

/* Plaintext, or TLS from the files o names (read and checked here). */
static int cgc__credentials(const cgc_options *o,
                            grpc_channel_credentials **out, char *err,
                            size_t errlen) {
  if (!cgc__tls(o)) {
    *out = grpc_insecure_credentials_create();
    return *out
               ? 0
               : cg_errorf(err, errlen, CG_ENOMEM, "cannot create credentials");
  }
  static const char *const names[3] = {"tls_ca_file", "tls_cert_file",
                                       "tls_key_file"};
  cgw_tls_files files = {o->tls_ca_file, o->tls_cert_file, o->tls_key_file};
  cgw_tls_pem pem;
  int rc = cgw_tls_load(&files, names, &pem, err, errlen);
  if (rc)
    return rc;
  grpc_ssl_pem_key_cert_pair pair = {pem.key, pem.cert};
  /* grpc keeps copies of the PEM strings. */
  *out =
      grpc_ssl_credentials_create(pem.ca, pem.cert ? &pair : NULL, NULL, NULL);
  cgw_tls_free(&pem);
  return *out ? 0
              : cg_errorf(err, errlen, CG_EINVAL,
                          "TLS: grpc would not create credentials");
}

/* The addresses of an "ipv4:a,b" / "ipv6:a,b" target, one target each,
 * into out (n of them); any other target counts once, as itself. */
static int cgc__addresses(const char *target, char ***out, int *n) {
  const char *scheme = NULL;
  if (!strncmp(target, "ipv4:", 5))
    scheme = "ipv4:";
  else if (!strncmp(target, "ipv6:", 5))
    scheme = "ipv6:";
  const char *list = scheme ? target + 5 : target;
  int count = 1;
  for (const char *p = list; scheme && *p; p++)
    count += *p == ',';
  char **v = calloc((size_t)count, sizeof *v);
  if (!v)
    return CG_ENOMEM;
  for (int i = 0; i < count; i++) {
    size_t len = scheme ? strcspn(list, ",") : strlen(list);
    size_t cap = len + 8;
    if (!(v[i] = malloc(cap))) {
      while (i-- > 0)
        free(v[i]);
      free(v);
      return CG_ENOMEM;
    }
    snprintf(v[i], cap, "%s%.*s", scheme ? scheme : "", (int)len, list);
    list += len + (list[len] == ',');
  }
  *out = v;
  *n = count;
  return 0;
}

/* Frees ch's replicas and the split's state (cgc_channel_free, or a
 * cgc__replicas_new that failed half way). */
static void cgc__replicas_free(cgc_channel *ch) {
  if (!ch->opts.replicas)
    return;
  cgc__split_close(ch);
  for (int i = 0; i < ch->nreplicas; i++)
    cgc_channel_free(ch->replicas[i].ch);
  free(ch->replicas);
  free(ch->stats);
  ch->replicas = NULL;
  ch->stats = NULL;
  ch->nreplicas = 0;
  pthread_mutex_destroy(&ch->split_mu);
}

/* Creates ch's replicas, a channel each, from its (rewritten) target,
 * and the split's state (split.c uses both); a no-op without
 * cgc_options.replicas. Returns 0 or a CG_E* code with err. */
static int cgc__replicas_new(cgc_channel *ch, char *err, size_t errlen) {
  int n = ch->opts.replicas, naddr = 0, rc = 0;
  char **addr = NULL;
  if (n == 0)
    return 0;
  pthread_mutex_init(&ch->split_mu, NULL);
  if ((rc = cgc__addresses(ch->target, &addr, &naddr)) != 0)
    return cg_errorf(err, errlen, rc, "out of memory");
  if (naddr > 1 && naddr != n) {
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "replicas: %d, but the target lists %d addresses", n, naddr);
    goto out;
  }
  ch->replicas = calloc((size_t)n, sizeof *ch->replicas);
  ch->stats = calloc(1, sizeof *ch->stats);
  if (!ch->replicas || !ch->stats) {
    rc = cg_errorf(err, errlen, CG_ENOMEM, "out of memory");
    goto out;
  }
  /* A replica's own failures are the split's to handle at once, on
   * another replica: one retry, for a connection that just dropped. */
  cgc_options o = ch->opts;
  o.replicas = 0;
  o.retries = o.retries < 1 ? o.retries : 1;
  for (int i = 0; i < n && !rc; i++) {
    rc = cgc__channel_new(&ch->replicas[i].ch, addr[naddr > 1 ? i : 0], &o, ch,
                          err, errlen);
    if (!rc)
      ch->nreplicas++;
  }
out:
  for (int i = 0; i < naddr; i++)
    free(addr[i]);
  free(addr);
  if (rc)
    cgc__replicas_free(ch);
  return rc;
}

int cgc_channel_new(cgc_channel **out, const char *target,
                    const cgc_options *opts, char *err, size_t errlen) {
  return cgc__channel_new(out, target, opts, NULL, err, errlen);
}

int cgc__channel_new(cgc_channel **out, const char *target,
                     const cgc_options *opts, cgc_channel *parent, char *err,
                     size_t errlen) {
  int rc = 0;
  cgc_channel *ch = NULL;
  grpc_channel_credentials *creds = NULL;
  *out = NULL;

  ch = calloc(1, sizeof *ch);
  if (!ch)
    return CG_ENOMEM;
  pthread_mutex_init(&ch->regions_mu, NULL);
  pthread_mutex_init(&ch->cqs_mu, NULL);
  cgc__engine_init(&ch->engine);
  if (opts)
    ch->opts = *opts;
  else
    cgc_options_init(&ch->opts);
  if (ch->opts.upload_chunk_bytes == 0)
    ch->opts.upload_chunk_bytes = CGC__MIB;
  if (!ch->opts.token)
    ch->opts.token = getenv("CONVGRAD_TOKEN");
  rc = cgc__check_options(&ch->opts, err, errlen);
  if (rc)
    goto fail_opts;
  rc = cgc__rewrite_target(target, &ch->target, err, errlen);
  if (rc)
    goto fail_opts;
  /* A replica's parent draws which calls are checked and counts them,
   * and sends an output that failed its check to another replica. */
  cgc__verifier_init(&ch->verify, &ch->opts);
  ch->vf = parent ? parent->vf : &ch->verify;
  ch->verify_retries = parent ? 0 : 1;
  pthread_mutex_init(&ch->stage_watch.mu, NULL);
  ch->sw = parent ? parent->sw : &ch->stage_watch;

  grpc_init();
  int reconnect_max =
      (int)(ch->opts.backoff_max_ms > 100
                ? (ch->opts.backoff_max_ms < 120000 ? ch->opts.backoff_max_ms
                                                    : 120000)
                : 100);
  grpc_arg args[] = {
      {GRPC_ARG_STRING,
       GRPC_ARG_SERVICE_CONFIG,
       {.string = (char *)cgc__service_config}},
      {GRPC_ARG_INTEGER,
       GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
       {.integer = (int)ch->opts.max_message_bytes}},
      {GRPC_ARG_INTEGER,
       GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
       {.integer = (int)ch->opts.max_message_bytes}},
      /* gRPC's own reconnect backoff starts at 1 s and grows to 120 s;
       * bounding it by our retry backoff lets a server that starts late be
       * reached by the retries of the call that is waiting for it.
       * GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at its default: it is the
       * time a connection attempt may take (20 s), and at 100 ms a server
       * that answered its handshake late (a loaded machine, a TLS peer
       * far away) was never reached ("tcp handshaker shutdown"). */
      {GRPC_ARG_INTEGER,
       GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
       {.integer = 100}},
      {GRPC_ARG_INTEGER,
       GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
       {.integer = reconnect_max}},
      /* A replica's connections are its own, not shared with the other
       * channels of this process to the same address: the parts of a
       * call pipelined over one target then travel on streams of
       * connections of their own. */
      {GRPC_ARG_INTEGER, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, {.integer = 1}},
      {GRPC_ARG_STRING,
       GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
       {.string = (char *)ch->opts.tls_server_name}},
  };
  /* The last two arguments only where they apply. */
  grpc_channel_args cargs = {sizeof args / sizeof args[0], args};
  if (!cgc__given(ch->opts.tls_server_name))
    cargs.num_args--;
  else if (!parent)
    args[cargs.num_args - 2] = args[cargs.num_args - 1];
  if (!parent)
    cargs.num_args--;
  rc = cgc__credentials(&ch->opts, &creds, err, errlen);
  if (rc)
    goto fail_grpc;
  if (cgc__given(ch->opts.token)) {
    size_t n = strlen(ch->opts.token) + 8;
    char *v = malloc(n);
    if (!v) {
      grpc_channel_credentials_release(creds);
      rc = cg_errorf(err, errlen, CG_ENOMEM, "out of memory");
      goto fail_grpc;
    }
    snprintf(v, n, "Bearer %s", ch->opts.token);
    ch->auth_md.key = grpc_slice_from_static_string("authorization");
    ch->auth_md.value = grpc_slice_from_copied_string(v);
    ch->auth_md_count = 1;
    free(v);
  }
  ch->chan = grpc_channel_create(ch->target, creds, &cargs);
  grpc_channel_credentials_release(creds);
  if (!ch->chan) {
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "target: cannot create channel to '%s'", ch->target);
    goto fail_grpc;
  }
  if ((rc = cgc__replicas_new(ch, err, errlen)) != 0) {
    grpc_channel_destroy(ch->chan);
    goto fail_grpc;
  }
  if (!parent)
    cgc__stage_watch_start(ch);
  *out = ch;
  return 0;

fail_grpc:
  if (ch->auth_md_count)
    grpc_slice_unref(ch->auth_md.value);
  grpc_shutdown();
  free(ch->target);
  cgc__verifier_destroy(&ch->verify);
  pthread_mutex_destroy(&ch->stage_watch.mu);
fail_opts:
  cgc__engine_close(&ch->engine);
  pthread_mutex_destroy(&ch->regions_mu);
  pthread_mutex_destroy(&ch->cqs_mu);
  free(ch);
  return rc;
}

void cgc_channel_free(cgc_channel *ch) {
  if (!ch)
    return;
  cgc__replicas_free(ch);
  cgc__engine_close(&ch->engine);
  cgc__regions_close(ch);
  cgc__cqs_close(ch);
  pthread_mutex_destroy(&ch->regions_mu);
  pthread_mutex_destroy(&ch->cqs_mu);
  grpc_channel_destroy(ch->chan);
  cgc__stage_watch_close(ch);
  if (ch->auth_md_count)
    grpc_slice_unref(ch->auth_md.value);
  free(ch->target);
  cgc__verifier_destroy(&ch->verify);
  pthread_mutex_destroy(&ch->stage_watch.mu);
  free(ch);
  grpc_shutdown();
}

const char *cgc_channel_target(const cgc_channel *ch) {
  return ch->target;
}
