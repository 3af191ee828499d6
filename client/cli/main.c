/* main.c - the convgrad CLI entry point: subcommand dispatch and the
 * small subcommands (health, info, version). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <cJSON.h>
#include <grpc/grpc.h>

#include "cli.h"

static const char cgc__health_help[] =
    "Usage: convgrad health [--service NAME] [options]\n"
    "Asks grpc.health.v1.Health/Check and prints the serving status.\n"
    "Exits 0 only when the server reports SERVING (for container\n"
    "healthchecks).\n"
    "  --service NAME   service to ask about (default \"\": the whole "
    "server)\n";

int cgc_cmd_health(int argc, char **argv) {
  cgc_cli cli;
  const char *service = "";
  const cgc_cli_opt opts[] = {{"service", CGC_CLI_STR, &service},
                              {NULL, 0, NULL}};
  cgc_channel *ch;
  int code;
  cgc_cli_init(&cli, "health", cgc__health_help, 3000);
  if (cgc_cli_start(&cli, opts, argc, argv, &ch, &code))
    return code;
  cgc_health_status hs;
  cgc_status st;
  int rc = cgc_health(ch, service, 0, &hs, &st);
  if (rc) {
    code = cgc_cli_fail(&cli, rc, &st);
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
  printf("threads     %s\n",
         *in->threads_policy ? in->threads_policy : "(not reported)");
  printf("shm         %s", *in->shm ? in->shm : "(not reported)");
  if (*in->shm && strcmp(in->shm, "off") != 0)
    printf(", %u regions of at most %llu bytes", in->max_regions,
           (unsigned long long)in->max_region_bytes);
  printf("\n");
  printf("io cpus    ");
  for (size_t i = 0; i < in->n_io_cpus; i++)
    printf("%s%d", i ? "," : " ", in->io_cpus[i]);
  printf("%s\n", in->n_io_cpus ? "" : " any");
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
    printf(") ->");
    for (size_t j = 0; j < o->n_outputs; j++)
      printf("%s %s", j ? "," : "", o->outputs[j]);
    printf("%s\n", o->n_outputs ? "" : o->output);
    if (o->n_names > 1) {
      printf("              aliases:");
      for (size_t j = 1; j < o->n_names; j++)
        printf(" %s", o->names[j]);
      printf("\n");
    }
  }
  printf("limits      request %llu bytes, tensor %llu elements, in-flight "
         "%llu bytes, queue %u, chunk %u bytes, idle timeout %llu ms, "
         "stream window %llu bytes, request flops %llu\n",
         (unsigned long long)in->max_request_bytes,
         (unsigned long long)in->max_tensor_elements,
         (unsigned long long)in->max_inflight_bytes, in->queue_depth,
         in->default_chunk_bytes, (unsigned long long)in->idle_timeout_ms,
         (unsigned long long)in->stream_window_bytes,
         (unsigned long long)in->max_request_flops);
  if (in->max_stride)
    printf("attributes  stride %llu, dilation %llu, pad %llu, "
           "output_padding %llu, effective extent %llu, padded extent %llu\n",
           (unsigned long long)in->max_stride,
           (unsigned long long)in->max_dilation,
           (unsigned long long)in->max_pad,
           (unsigned long long)in->max_output_padding,
           (unsigned long long)in->max_effective_extent,
           (unsigned long long)in->max_padded_extent);
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
  cJSON_AddStringToObject(root, "threads_policy", in->threads_policy);
  cJSON_AddStringToObject(root, "shm", in->shm);
  cpus = cJSON_AddArrayToObject(root, "cpus");
  for (size_t i = 0; cpus && i < in->n_cpus; i++)
    cJSON_AddItemToArray(cpus, cJSON_CreateNumber(in->cpus[i]));
  cpus = cJSON_AddArrayToObject(root, "io_cpus");
  for (size_t i = 0; cpus && i < in->n_io_cpus; i++)
    cJSON_AddItemToArray(cpus, cJSON_CreateNumber(in->io_cpus[i]));
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
    cJSON_AddItemToObject(
        j, "outputs", cJSON_CreateStringArray(o->outputs, (int)o->n_outputs));
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
    cJSON_AddNumberToObject(lim, "idle_timeout_ms",
                            (double)in->idle_timeout_ms);
    cJSON_AddNumberToObject(lim, "stream_window_bytes",
                            (double)in->stream_window_bytes);
    cJSON_AddNumberToObject(lim, "max_request_flops",
                            (double)in->max_request_flops);
    cJSON_AddNumberToObject(lim, "max_regions", in->max_regions);
    cJSON_AddNumberToObject(lim, "max_region_bytes",
                            (double)in->max_region_bytes);
    cJSON_AddNumberToObject(lim, "max_stride", (double)in->max_stride);
    cJSON_AddNumberToObject(lim, "max_dilation", (double)in->max_dilation);
    cJSON_AddNumberToObject(lim, "max_pad", (double)in->max_pad);
    cJSON_AddNumberToObject(lim, "max_output_padding",
                            (double)in->max_output_padding);
    cJSON_AddNumberToObject(lim, "max_effective_extent",
                            (double)in->max_effective_extent);
    cJSON_AddNumberToObject(lim, "max_padded_extent",
                            (double)in->max_padded_extent);
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
  cgc_cli cli;
  int code, json = 0;
  const cgc_cli_opt opts[] = {{"json", CGC_CLI_FLAG, &json}, {NULL, 0, NULL}};
  cgc_channel *ch;
  cgc_cli_init(&cli, "info", cgc__info_help, 10000);
  if (cgc_cli_start(&cli, opts, argc, argv, &ch, &code))
    return code;
  cgc_server_info *in = NULL;
  cgc_status st;
  int rc = cgc_server_info_get(ch, 0, &in, &st);
  if (rc) {
    code = cgc_cli_fail(&cli, rc, &st);
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

static const char cgc__version_help[] =
    "Usage: convgrad version [options]   (or convgrad --version [options])\n"
    "Prints the versions of this CLI, of the libcgclient it loaded and of\n"
    "gRPC, then those of the server at the target (GetServerInfo): its\n"
    "version, oneDNN version and the ISA oneDNN dispatches to there. The\n"
    "CLI itself runs no oneDNN. Exits 0 once the local versions are\n"
    "printed, whether the server answered or not (its line says why not).\n"
    "The deadline defaults to 2000 ms, retries to 0.\n";

int cgc_cmd_version(int argc, char **argv) {
  cgc_cli cli;
  int code;
  const cgc_cli_opt opts[] = {{NULL, 0, NULL}};
  cgc_cli_init(&cli, "version", cgc__version_help, 2000);
  cli.opts.retries = 0; /* a missing server must not stall the answer */
  if (cgc_cli_parse(&cli, opts, argc, argv, &code))
    return code;
  printf("convgrad %s\nlibcgclient %s, gRPC core %s\n", CGC_CLI_VERSION,
         cgc_version(), grpc_version_string());
  fflush(stdout);
  cgc_channel *ch;
  if ((code = cgc_cli_connect(&cli, &ch)) != 0)
    return code;
  cgc_server_info *in = NULL;
  cgc_status st;
  if (cgc_server_info_get(ch, 0, &in, &st) == 0)
    printf("server %s: convgrad-server %s, oneDNN %s, ISA %s\n", cli.target,
           in->version, in->onednn_version, in->cpu_isa);
  else
    printf("server %s: no answer (%s: %s)\n", cli.target,
           cgc_status_code_name(st.code), st.message);
  cgc_server_info_free(in);
  cgc_channel_free(ch);
  return CGC_EXIT_OK;
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
    "  version  versions of the CLI, libcgclient, gRPC and the server's\n"
    "           (oneDNN, ISA); also --version\n"
    "\n"
    "`convgrad COMMAND --help` describes each. The server address comes\n"
    "from --target or $CONVGRAD_TARGET (default " CGC_DEFAULT_TARGET ").\n";

int main(int argc, char **argv) {
  /* Every subcommand prints its own one-line usage errors. */
  opterr = 0;
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {{"health", cgc_cmd_health}, {"info", cgc_cmd_info},
              {"run", cgc_cmd_run},       {"smoke", cgc_cmd_smoke},
              {"bench", cgc_cmd_bench},   {"version", cgc_cmd_version}};
  if (argc < 2) {
    fprintf(stderr, "convgrad: missing command (see convgrad --help)\n");
    return CGC_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
      !strcmp(argv[1], "help")) {
    printf("%s\n%s", cgc__main_help, CGC_EXIT_CODES_HELP);
    return 0;
  }
  if (!strcmp(argv[1], "--version"))
    return cgc_cmd_version(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name))
      return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "convgrad: unknown command '%s' (see convgrad --help)\n",
          argv[1]);
  return CGC_EXIT_USAGE;
}
