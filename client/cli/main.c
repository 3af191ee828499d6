/* main.c - the convgrad CLI entry point: subcommand dispatch, the common
 * flags, and the two small subcommands (health, info). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "cli.h"

void cgc_cli_init(cgc_cli *cli) {
  const char *env = getenv("CONVGRAD_TARGET");
  cli->target = env && *env ? env : CGC_DEFAULT_TARGET;
  cgc_options_init(&cli->opts);
}

int cgc_cli_int(const char *arg, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  if (!arg || !*arg)
    return -1;
  long long v = strtoll(arg, &end, 10);
  if (*end || v < lo || v > hi)
    return -1;
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

/* 1 handled, 0 not a common option, -1 bad value. */
static int cgc__cli_common(cgc_cli *cli, int c, const char *arg) {
  int64_t v;
  switch (c) {
  case CGC_OPT_TARGET:
    cli->target = arg;
    return 1;
  case CGC_OPT_DEADLINE:
    if (cgc_cli_int(arg, 1, 86400000, &v))
      return -1;
    cli->opts.deadline_ms = v;
    return 1;
  case CGC_OPT_RETRIES:
    if (cgc_cli_int(arg, 0, 1000, &v))
      return -1;
    cli->opts.retries = (int)v;
    return 1;
  case CGC_OPT_CHUNK:
    /* Chunk plus framing must fit the server's 4 MiB receive cap. */
    if (cgc_cli_int(arg, 1024, (4 << 20) - 4096, &v))
      return -1;
    cli->opts.upload_chunk_bytes = (size_t)v;
    if (cli->opts.max_message_bytes < v + 4096)
      cli->opts.max_message_bytes = v + 4096;
    return 1;
  default:
    return 0;
  }
}

int cgc_cli_next(cgc_cli *cli, const char *cmd, const char *help, int argc,
                 char **argv, const struct option *longopts, int *code) {
  int c, r, idx = 0;
  do {
    c = getopt_long(argc, argv, ":h", longopts, &idx);
    r = cgc__cli_common(cli, c, optarg);
  } while (r > 0);
  /* Only CGC_CLI_DONE sets *code; every exit from here but --help is a
   * usage error. */
  if (r < 0) {
    *code = cgc_cli_usage(cmd, "bad value '%s' for --%s", optarg,
                          longopts[idx].name);
    return CGC_CLI_DONE;
  }
  if (c == 'h') {
    printf("%s\n%s%s", help, CGC_COMMON_HELP, CGC_EXIT_CODES_HELP);
    *code = CGC_EXIT_OK;
    return CGC_CLI_DONE;
  }
  if (c == ':') {
    *code = cgc_cli_usage(cmd, "%s needs a value", argv[optind - 1]);
    return CGC_CLI_DONE;
  }
  if (c == '?') {
    *code = cgc_cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
    return CGC_CLI_DONE;
  }
  if (c == -1 && optind < argc) {
    *code = cgc_cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    return CGC_CLI_DONE;
  }
  return c;
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

int cgc_cli_fail(const cgc_cli *cli, const char *what, int rc,
                 const cgc_status *st) {
  int code = cgc_exit_for(rc, st);
  const char *msg = st->message[0] ? st->message : cgc_strerror(rc);
  if (rc == CGC_ERPC) {
    switch (st->code) {
    case GRPC_STATUS_UNAVAILABLE:
      fprintf(stderr, "convgrad %s: server %s is unavailable: %s\n", what,
              cli->target, msg);
      break;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
      fprintf(stderr,
              "convgrad %s: no answer from %s within the deadline (%lld ms)\n",
              what, cli->target, (long long)cli->opts.deadline_ms);
      break;
    case GRPC_STATUS_INVALID_ARGUMENT:
      fprintf(stderr, "convgrad %s: server rejected the request: %s\n", what,
              msg);
      break;
    default:
      fprintf(stderr, "convgrad %s: server error %s: %s\n", what,
              cgc_status_code_name(st->code), msg);
    }
  } else if (rc == CGC_EPROTO) {
    fprintf(stderr, "convgrad %s: bad response from %s: %s\n", what,
            cli->target, msg);
  } else {
    fprintf(stderr, "convgrad %s: %s\n", what, msg);
  }
  return code;
}

/* ------------------------------------------------------------------ */

static const char cgc__health_help[] =
    "Usage: convgrad health [--service NAME] [options]\n"
    "Asks grpc.health.v1.Health/Check and prints the serving status.\n"
    "Exits 0 only when the server reports SERVING (for container\n"
    "healthchecks).\n"
    "  --service NAME   service to ask about (default \"\": the whole "
    "server)\n";

int cgc_cmd_health(int argc, char **argv) {
  static const struct option longopts[] = {
      CGC_COMMON_LONGOPTS,
      {"service", required_argument, NULL, CGC_OPT_LOCAL_BASE},
      {NULL, 0, NULL, 0}};
  cgc_cli cli;
  const char *service = "";
  int c, code;
  cgc_cli_init(&cli);
  cli.opts.deadline_ms = 3000;
  while ((c = cgc_cli_next(&cli, "health", cgc__health_help, argc, argv,
                           longopts, &code)) != -1) {
    if (c == CGC_CLI_DONE)
      return code;
    service = optarg; /* --service, the only local option */
  }
  cgc_channel *ch;
  if ((code = cgc_cli_connect(&cli, &ch)) != 0)
    return code;
  cgc_health_status hs;
  cgc_status st;
  int rc = cgc_health(ch, service, 0, &hs, &st);
  if (rc) {
    code = cgc_cli_fail(&cli, "health", rc, &st);
  } else {
    printf("%s\n", cgc_health_status_name(hs));
    code = hs == CGC_HEALTH_SERVING ? CGC_EXIT_OK : CGC_EXIT_FAIL;
  }
  cgc_channel_free(ch);
  return code;
}

/* ------------------------------------------------------------------ */

static const char cgc__info_help[] =
    "Usage: convgrad info [--json] [options]\n"
    "Prints what the server reports about itself (GetServerInfo): version,\n"
    "ops and their accepted names, dtypes (native or f32_convert), oneDNN\n"
    "version, CPU ISA, workers, cores and limits.\n"
    "  --json           print JSON instead of text\n";

static const char *cgc__wire_dtype_name(int dt) {
  static const char *const n[] = {"?", "f32", "bf16", "f16", "s32", "s64"};
  return dt >= 0 && dt <= 5 ? n[dt] : "?";
}

static void cgc__info_text(const cgc_cli *cli, const cgc_server_info *in) {
  printf("server      %s\n", cli->target);
  printf("version     %s\n", in->version);
  printf("onednn      %s\n", in->onednn_version);
  printf("cpu isa     %s\n", in->cpu_isa);
  printf("workers     %u x %u threads, cpus", in->workers,
         in->threads_per_worker);
  for (size_t i = 0; i < in->n_cpus; i++)
    printf("%s%d", i ? "," : " ", in->cpus[i]);
  printf("%s\n", in->n_cpus ? "" : " any");
  printf("dtypes     ");
  for (size_t i = 0; i < in->n_dtypes; i++)
    printf(" %s (%s)", cgc__wire_dtype_name(in->dtypes[i].dtype),
           in->dtypes[i].native ? "native" : "f32_convert");
  printf("\n");
  for (size_t i = 0; i < in->n_ops; i++) {
    const cgc_op_info *o = &in->ops[i];
    printf("op          %s(", o->n_names ? o->names[0] : "?");
    for (size_t j = 0; j < o->n_inputs; j++)
      printf("%s%s", j ? ", " : "", o->inputs[j]);
    printf(") -> %s\n", o->output);
    if (o->n_names > 1) {
      printf("              aliases:");
      for (size_t j = 1; j < o->n_names; j++)
        printf(" %s", o->names[j]);
      printf("\n");
    }
  }
  printf("limits      request %llu bytes, tensor %llu elements, in-flight "
         "%llu bytes, queue %u, chunk %u bytes\n",
         (unsigned long long)in->max_request_bytes,
         (unsigned long long)in->max_tensor_elements,
         (unsigned long long)in->max_inflight_bytes, in->queue_depth,
         in->default_chunk_bytes);
}

static int cgc__info_json(const cgc_server_info *in) {
  cJSON *root = cJSON_CreateObject(), *ops, *dts, *cpus, *lim;
  if (!root)
    return CGC_EXIT_INTERNAL;
  cJSON_AddStringToObject(root, "version", in->version);
  cJSON_AddStringToObject(root, "onednn_version", in->onednn_version);
  cJSON_AddStringToObject(root, "cpu_isa", in->cpu_isa);
  cJSON_AddNumberToObject(root, "workers", in->workers);
  cJSON_AddNumberToObject(root, "threads_per_worker", in->threads_per_worker);
  cpus = cJSON_AddArrayToObject(root, "cpus");
  for (size_t i = 0; cpus && i < in->n_cpus; i++)
    cJSON_AddItemToArray(cpus, cJSON_CreateNumber(in->cpus[i]));
  dts = cJSON_AddArrayToObject(root, "dtypes");
  for (size_t i = 0; dts && i < in->n_dtypes; i++) {
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "dtype",
                            cgc__wire_dtype_name(in->dtypes[i].dtype));
    cJSON_AddBoolToObject(d, "native", in->dtypes[i].native);
    cJSON_AddItemToArray(dts, d);
  }
  ops = cJSON_AddArrayToObject(root, "ops");
  for (size_t i = 0; ops && i < in->n_ops; i++) {
    const cgc_op_info *o = &in->ops[i];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "names",
                          cJSON_CreateStringArray(o->names, (int)o->n_names));
    cJSON_AddItemToObject(j, "inputs",
                          cJSON_CreateStringArray(o->inputs, (int)o->n_inputs));
    cJSON_AddStringToObject(j, "output", o->output);
    cJSON_AddItemToArray(ops, j);
  }
  lim = cJSON_AddObjectToObject(root, "limits");
  if (lim) {
    cJSON_AddNumberToObject(lim, "max_request_bytes",
                            (double)in->max_request_bytes);
    cJSON_AddNumberToObject(lim, "max_tensor_elements",
                            (double)in->max_tensor_elements);
    cJSON_AddNumberToObject(lim, "max_inflight_bytes",
                            (double)in->max_inflight_bytes);
    cJSON_AddNumberToObject(lim, "queue_depth", in->queue_depth);
    cJSON_AddNumberToObject(lim, "default_chunk_bytes",
                            in->default_chunk_bytes);
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text)
    return CGC_EXIT_INTERNAL;
  printf("%s\n", text);
  cJSON_free(text);
  return CGC_EXIT_OK;
}

int cgc_cmd_info(int argc, char **argv) {
  static const struct option longopts[] = {
      CGC_COMMON_LONGOPTS,
      {"json", no_argument, NULL, CGC_OPT_LOCAL_BASE},
      {NULL, 0, NULL, 0}};
  cgc_cli cli;
  int c, code, json = 0;
  cgc_cli_init(&cli);
  cli.opts.deadline_ms = 10000;
  while ((c = cgc_cli_next(&cli, "info", cgc__info_help, argc, argv, longopts,
                           &code)) != -1) {
    if (c == CGC_CLI_DONE)
      return code;
    json = 1; /* --json, the only local option */
  }
  cgc_channel *ch;
  if ((code = cgc_cli_connect(&cli, &ch)) != 0)
    return code;
  cgc_server_info *in = NULL;
  cgc_status st;
  int rc = cgc_server_info_get(ch, 0, &in, &st);
  if (rc) {
    code = cgc_cli_fail(&cli, "info", rc, &st);
  } else if (json) {
    code = cgc__info_json(in);
  } else {
    cgc__info_text(&cli, in);
    code = CGC_EXIT_OK;
  }
  cgc_server_info_free(in);
  cgc_channel_free(ch);
  return code;
}

/* ------------------------------------------------------------------ */

static const char cgc__main_help[] =
    "Usage: convgrad COMMAND [options]\n"
    "Client of the convgrad convolution-gradient service.\n"
    "\n"
    "Commands:\n"
    "  health   exit 0 when the server is SERVING\n"
    "  info     what the server runs: ops, dtypes, oneDNN, workers, limits\n"
    "  run      one op, from flags or a oneDNN graph JSON op file; tensors\n"
    "           from .npy or random; --check against the local reference\n"
    "  smoke    every op in several attribute combinations, verified\n"
    "  bench    latency percentiles and throughput for a problem list\n"
    "\n"
    "`convgrad COMMAND --help` describes each. The server address comes\n"
    "from --target or $CONVGRAD_TARGET (default " CGC_DEFAULT_TARGET ").\n";

int main(int argc, char **argv) {
  /* Every subcommand prints its own one-line usage errors. */
  opterr = 0;
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {{"health", cgc_cmd_health},
              {"info", cgc_cmd_info},
              {"run", cgc_cmd_run},
              {"smoke", cgc_cmd_smoke},
              {"bench", cgc_cmd_bench}};
  if (argc < 2) {
    fprintf(stderr, "convgrad: missing command (see convgrad --help)\n");
    return CGC_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
      !strcmp(argv[1], "help")) {
    printf("%s\n%s", cgc__main_help, CGC_EXIT_CODES_HELP);
    return 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name))
      return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "convgrad: unknown command '%s' (see convgrad --help)\n",
          argv[1]);
  return CGC_EXIT_USAGE;
}
