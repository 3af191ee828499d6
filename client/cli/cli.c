/* cli.c - the options, connecting and failure lines every convgrad
 * subcommand shares (cli.h). */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* getopt values of the common flags; a subcommand's own option i is
 * CGC__OPT_LOCAL + i. */
enum {
  CGC__OPT_TARGET = 1000,
  CGC__OPT_DEADLINE,
  CGC__OPT_RETRIES,
  CGC__OPT_CHUNK,
  CGC__OPT_TLS_CA,
  CGC__OPT_TLS_CERT,
  CGC__OPT_TLS_KEY,
  CGC__OPT_TLS_NAME,
  CGC__OPT_TOKEN,
  CGC__OPT_REPLICAS,
  CGC__OPT_SPLIT_PARTS,
  CGC__OPT_VERIFY_RATE,
  CGC__OPT_LOCAL = 1100
};

static const struct option cgc__common_opts[] = {
    {"target", required_argument, NULL, CGC__OPT_TARGET},
    {"deadline", required_argument, NULL, CGC__OPT_DEADLINE},
    {"retries", required_argument, NULL, CGC__OPT_RETRIES},
    {"chunk-bytes", required_argument, NULL, CGC__OPT_CHUNK},
    {"tls-ca", required_argument, NULL, CGC__OPT_TLS_CA},
    {"tls-cert", required_argument, NULL, CGC__OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, CGC__OPT_TLS_KEY},
    {"tls-server-name", required_argument, NULL, CGC__OPT_TLS_NAME},
    {"token", required_argument, NULL, CGC__OPT_TOKEN},
    {"replicas", required_argument, NULL, CGC__OPT_REPLICAS},
    {"split-parts", required_argument, NULL, CGC__OPT_SPLIT_PARTS},
    {"verify-rate", required_argument, NULL, CGC__OPT_VERIFY_RATE},
    {"help", no_argument, NULL, 'h'}};
#define CGC__NCOMMON (sizeof cgc__common_opts / sizeof cgc__common_opts[0])

static const char cgc__common_help[] =
    "Common options:\n"
    "  --target T       server: HOST:PORT, HOST:PORT,HOST:PORT (round_robin),\n"
    "                   dns:///NAME:PORT or ipv4:A:P,B:P. Default "
    "$CONVGRAD_TARGET\n"
    "                   or " CGC_DEFAULT_TARGET ".\n"
    "  --deadline MS    deadline of each call, retries included\n"
    "  --retries N      retries after UNAVAILABLE (default 5)\n"
    "  --chunk-bytes N  upload chunk size, 1024..4190208 (default 1048576)\n"
    "  --tls-ca FILE    use TLS; the server's certificate must chain to these\n"
    "                   PEM roots\n"
    "  --tls-cert FILE, --tls-key FILE\n"
    "                   this client's PEM certificate and key, for a server\n"
    "                   that requires one (mutual TLS)\n"
    "  --tls-server-name NAME\n"
    "                   the name the server's certificate must carry, when\n"
    "                   the target's host is an address or another name\n"
    "  --token TOKEN    bearer token for a server with --auth-tokens\n"
    "                   (default $CONVGRAD_TOKEN; prefer the variable: a\n"
    "                   flag shows in the process list)\n"
    "  --replicas N     split a large call along the minibatch over N\n"
    "                   replicas (the N addresses of --target, or N\n"
    "                   connections to one); 0 (default): each call whole\n"
    "                   on one replica (round_robin)\n"
    "  --split-parts N  parts of a split call (default: as many as the\n"
    "                   replicas' measured speeds and link say)\n"
    "  --verify-rate R  check this fraction (0..1) of the calls' results\n"
    "                   here, by the adjoint identity, and the first call\n"
    "                   of each shape; a result that fails is asked for\n"
    "                   again (default $CONVGRAD_VERIFY_RATE, else 0)\n"
    "  -h, --help       this help\n";

void cgc_cli_init(cgc_cli *cli, const char *cmd, const char *help,
                  int64_t deadline_ms) {
  const char *env = getenv("CONVGRAD_TARGET");
  cli->cmd = cmd;
  cli->help = help;
  cli->target = env && *env ? env : CGC_DEFAULT_TARGET;
  cgc_options_init(&cli->opts);
  if (deadline_ms)
    cli->opts.deadline_ms = deadline_ms;
}

/* Integer in [lo, hi]; 0 or -1. */
/* arg, an integer in lo..hi, into *out: returns 0, 1 for an integer above
 * hi (strtoll saturates: any longer number too), else -1. */
static int cgc__cli_int(const char *arg, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  if (!*arg)
    return -1;
  long long v = strtoll(arg, &end, 10);
  if (*end || v < lo)
    return -1;
  if (v > hi)
    return 1;
  *out = v;
  return 0;
}

int cgc_cli_usage(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "convgrad %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see convgrad %s --help)\n", cmd);
  return CGC_EXIT_USAGE;
}

int cgc_cli_number(const char *cmd, const char *arg, cgc_cli_num *n) {
  if (!arg)
    return 0;
  int bad = cgc__cli_int(arg, n->lo, n->hi, &n->v);
  if (!bad)
    return 0;
  return cgc_cli_usage(cmd, "%s", bad > 0 && n->over ? n->over : n->bad);
}

int cgc_cli_name(const char *cmd, cgc_cli_kind kind, const char *arg,
                 void *out) {
  /* Each kind's parser and what the message says it accepts. */
  int bad;
  const char *what;
  if (!arg)
    return 0;
  switch (kind) {
  case CGC_CLI_OP:
    bad = cg_op_parse(arg, out);
    what = "unknown op";
    break;
  case CGC_CLI_DTYPE:
    bad = cg_dtype_parse(arg, out);
    what = "--dtype must be f32, bf16 or f16, got";
    break;
  case CGC_CLI_DATA_FORMAT:
    bad = cg_data_format_parse(arg, out);
    what = "--data-format must be NCX or NXC, got";
    break;
  default: /* CGC_CLI_WEIGHTS_FORMAT */
    bad = cg_weights_format_parse(arg, out);
    what = "--weights-format must be OIX, XIO, IOX or XOI, got";
  }
  return bad ? cgc_cli_usage(cmd, "%s '%s'", what, arg) : 0;
}

/* A common flag (getopt value c) into cli; 0, or -1 for a bad value. */
static int cgc__cli_common(cgc_cli *cli, int c, const char *arg) {
  int64_t v;
  switch (c) {
  case CGC__OPT_TARGET:
    cli->target = arg;
    return 0;
  case CGC__OPT_DEADLINE:
    if (cgc__cli_int(arg, 1, 86400000, &v))
      return -1;
    cli->opts.deadline_ms = v;
    return 0;
  case CGC__OPT_RETRIES:
    if (cgc__cli_int(arg, 0, 1000, &v))
      return -1;
    cli->opts.retries = (int)v;
    return 0;
  case CGC__OPT_TLS_CA:
    cli->opts.tls_ca_file = arg;
    return 0;
  case CGC__OPT_TLS_CERT:
    cli->opts.tls_cert_file = arg;
    return 0;
  case CGC__OPT_TLS_KEY:
    cli->opts.tls_key_file = arg;
    return 0;
  case CGC__OPT_TLS_NAME:
    cli->opts.tls_server_name = arg;
    return 0;
  case CGC__OPT_TOKEN:
    cli->opts.token = arg;
    return 0;
  case CGC__OPT_VERIFY_RATE: {
    char *end;
    double r = strtod(arg, &end);
    if (!*arg || *end || !(r >= 0 && r <= 1))
      return -1;
    cli->opts.verify_rate = r;
    return 0;
  }
  case CGC__OPT_REPLICAS:
  case CGC__OPT_SPLIT_PARTS:
    if (cgc__cli_int(arg, 0, c == CGC__OPT_REPLICAS ? 64 : 256, &v))
      return -1;
    *(c == CGC__OPT_REPLICAS ? &cli->opts.replicas : &cli->opts.split_parts) =
        (int)v;
    return 0;
  default: /* CGC__OPT_CHUNK */
    /* Chunk plus framing must fit the server's 4 MiB receive cap. */
    if (cgc__cli_int(arg, 1024, (4 << 20) - 4096, &v))
      return -1;
    cli->opts.upload_chunk_bytes = (size_t)v;
    if (cli->opts.max_message_bytes < v + 4096)
      cli->opts.max_message_bytes = v + 4096;
    return 0;
  }
}

/* Stores a subcommand's own option; 0 or a usage exit code. */
static int cgc__cli_local(const char *cmd, const cgc_cli_opt *o,
                          const char *arg) {
  switch (o->kind) {
  case CGC_CLI_FLAG:
    *(int *)o->out = 1;
    return 0;
  case CGC_CLI_STR:
    *(const char **)o->out = arg;
    return 0;
  case CGC_CLI_STRS: {
    cgc_cli_strs *l = o->out;
    if (l->n >= CGC_CLI_MAX_STRS)
      return cgc_cli_usage(cmd, "at most %d --%s flags", CGC_CLI_MAX_STRS,
                           o->name);
    l->v[l->n++] = arg;
    return 0;
  }
  case CGC_CLI_NUM:
    return cgc_cli_number(cmd, arg, o->out);
  default:
    return cgc_cli_name(cmd, o->kind, arg, o->out);
  }
}

int cgc_cli_parse(cgc_cli *cli, const cgc_cli_opt *opts, int argc, char **argv,
                  int *code) {
  size_t n = 0;
  while (opts[n].name)
    n++;
  struct option longopts[CGC__NCOMMON + n + 1];
  memcpy(longopts, cgc__common_opts, sizeof cgc__common_opts);
  for (size_t i = 0; i <= n; i++)
    longopts[CGC__NCOMMON + i] = (struct option){
        opts[i].name,
        opts[i].kind == CGC_CLI_FLAG ? no_argument : required_argument, NULL,
        CGC__OPT_LOCAL + (int)i};
  int c, idx = 0;
  /* Every stop but --help is a usage error. */
  *code = CGC_EXIT_USAGE;
  while ((c = getopt_long(argc, argv, ":h", longopts, &idx)) != -1) {
    if (c >= CGC__OPT_LOCAL) {
      if (cgc__cli_local(cli->cmd, &opts[c - CGC__OPT_LOCAL], optarg))
        return 1;
    } else if (c == 'h') {
      printf("%s\n%s%s", cli->help, cgc__common_help, CGC_EXIT_CODES_HELP);
      *code = CGC_EXIT_OK;
      return 1;
    } else if (c == ':') {
      cgc_cli_usage(cli->cmd, "%s needs a value", argv[optind - 1]);
      return 1;
    } else if (c == '?') {
      cgc_cli_usage(cli->cmd, "unknown option '%s'", argv[optind - 1]);
      return 1;
    } else if (cgc__cli_common(cli, c, optarg)) {
      cgc_cli_usage(cli->cmd, "bad value '%s' for --%s", optarg,
                    longopts[idx].name);
      return 1;
    }
  }
  if (optind < argc) {
    cgc_cli_usage(cli->cmd, "unexpected argument '%s'", argv[optind]);
    return 1;
  }
  *code = 0;
  return 0;
}

int cgc_cli_start(cgc_cli *cli, const cgc_cli_opt *opts, int argc, char **argv,
                  cgc_channel **ch, int *code) {
  return cgc_cli_parse(cli, opts, argc, argv, code) ||
         (*code = cgc_cli_connect(cli, ch)) != 0;
}

int cgc_cli_connect(cgc_cli *cli, cgc_channel **ch) {
  char err[256] = "";
  int rc = cgc_channel_new(ch, cli->target, &cli->opts, err, sizeof err);
  if (rc) {
    fprintf(stderr, "convgrad: %s\n", err[0] ? err : cgc_strerror(rc));
    return rc == CG_EINVAL ? CGC_EXIT_USAGE : CGC_EXIT_INTERNAL;
  }
  return 0;
}

void cgc_cli_verify_report(const cgc_cli *cli, cgc_channel *ch, FILE *out) {
  cgc_verify_stats v;
  if (!(cli->opts.verify_rate > 0))
    return;
  cgc_verify_stats_get(ch, &v);
  fprintf(out,
          "client checks: %llu calls, %llu outputs checked, %llu failed, "
          "%llu recovered, %llu lost\n",
          (unsigned long long)v.calls, (unsigned long long)v.outputs,
          (unsigned long long)v.failed, (unsigned long long)v.recovered,
          (unsigned long long)v.lost);
}

int cgc_cli_fail(const cgc_cli *cli, int rc, const cgc_status *st) {
  int code = cgc_exit_for(rc, st);
  const char *msg = st->message[0] ? st->message : cgc_strerror(rc);
  if (rc == CGC_ERPC) {
    switch (st->code) {
    case GRPC_STATUS_UNAVAILABLE:
      fprintf(stderr, "convgrad %s: server %s is unavailable: %s\n", cli->cmd,
              cli->target, msg);
      break;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
      fprintf(stderr,
              "convgrad %s: no answer from %s within the deadline (%lld ms)\n",
              cli->cmd, cli->target, (long long)cli->opts.deadline_ms);
      break;
    case GRPC_STATUS_INVALID_ARGUMENT:
      fprintf(stderr, "convgrad %s: server rejected the request: %s\n",
              cli->cmd, msg);
      break;
    case GRPC_STATUS_DATA_LOSS: /* the server's check, or this client's */
      fprintf(stderr, "convgrad %s: DATA_LOSS: %s\n", cli->cmd, msg);
      break;
    default:
      fprintf(stderr, "convgrad %s: server error %s: %s\n", cli->cmd,
              cgc_status_code_name(st->code), msg);
    }
  } else if (rc == CGC_EPROTO) {
    fprintf(stderr, "convgrad %s: bad response from %s: %s\n", cli->cmd,
            cli->target, msg);
  } else {
    fprintf(stderr, "convgrad %s: %s\n", cli->cmd, msg);
  }
  return code;
}
