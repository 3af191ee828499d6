/* cli.h - what the convgrad subcommands share: the common flags (target,
 * deadline, retries, chunk size), connecting, and turning a failure into
 * one line on stderr plus an exit code. */
#ifndef CGC_CLI_H
#define CGC_CLI_H

#include <getopt.h>
#include <stdint.h>

#include "cgc/client.h"
#include "spec.h"

#define CGC_DEFAULT_TARGET "127.0.0.1:50051"

typedef struct cgc_cli {
  const char *target;
  cgc_options opts;
} cgc_cli;

/* Long options every subcommand accepts; values start at 1000. */
enum {
  CGC_OPT_TARGET = 1000,
  CGC_OPT_DEADLINE,
  CGC_OPT_RETRIES,
  CGC_OPT_CHUNK,
  CGC_OPT_LOCAL_BASE = 1100 /* subcommand-specific options from here */
};
#define CGC_COMMON_LONGOPTS                                                    \
  {"target", required_argument, NULL, CGC_OPT_TARGET},                         \
      {"deadline", required_argument, NULL, CGC_OPT_DEADLINE},                 \
      {"retries", required_argument, NULL, CGC_OPT_RETRIES},                   \
      {"chunk-bytes", required_argument, NULL, CGC_OPT_CHUNK}, {               \
    "help", no_argument, NULL, 'h'                                             \
  }
#define CGC_COMMON_HELP                                                        \
  "Common options:\n"                                                          \
  "  --target T       server: HOST:PORT, HOST:PORT,HOST:PORT (round_robin),\n" \
  "                   dns:///NAME:PORT or ipv4:A:P,B:P. Default "              \
  "$CONVGRAD_TARGET\n"                                                         \
  "                   or " CGC_DEFAULT_TARGET ".\n"                            \
  "  --deadline MS    deadline of each call, retries included\n"               \
  "  --retries N      retries after UNAVAILABLE (default 5)\n"                 \
  "  --chunk-bytes N  upload chunk size, 1024..4190208 (default 1048576)\n"    \
  "  -h, --help       this help\n"

/* Defaults from the environment. */
void cgc_cli_init(cgc_cli *cli);
/* The option loop of every subcommand: calls getopt_long and handles the
 * common flags, --help (prints help, the common flags and the exit codes),
 * missing values, unknown options and stray arguments. Returns the next
 * subcommand-specific option (>= CGC_OPT_LOCAL_BASE, value in optarg), -1
 * when all are read, or CGC_CLI_DONE when the caller must return *code. */
#define CGC_CLI_DONE (-2)
int cgc_cli_next(cgc_cli *cli, const char *cmd, const char *help, int argc,
                 char **argv, const struct option *longopts, int *code);
/* Connects; on failure prints the reason and returns an exit code. */
int cgc_cli_connect(cgc_cli *cli, cgc_channel **ch);
/* Prints one line for a failed call (what: "run", "health") and returns
 * the exit code for it. */
int cgc_cli_fail(const cgc_cli *cli, const char *what, int rc,
                 const cgc_status *st);
/* Prints "convgrad CMD: bad MESSAGE" and returns CGC_EXIT_USAGE. */
int cgc_cli_usage(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Integer flag value in [lo, hi]; 0 or -1. */
int cgc_cli_int(const char *arg, int64_t lo, int64_t hi, int64_t *out);

int cgc_cmd_health(int argc, char **argv);
int cgc_cmd_info(int argc, char **argv);
int cgc_cmd_run(int argc, char **argv);
int cgc_cmd_smoke(int argc, char **argv);
int cgc_cmd_bench(int argc, char **argv);

#endif
