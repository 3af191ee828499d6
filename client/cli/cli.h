/* cli.h - what the convgrad subcommands share: reading the options (the
 * common flags target, deadline, retries and chunk size, and each
 * subcommand's own from a table), connecting, and turning a failure into
 * one line on stderr plus an exit code. */
#ifndef CGC_CLI_H
#define CGC_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "cgc/client.h"
#include "shm.h"
#include "spec.h"

#define CGC_DEFAULT_TARGET "127.0.0.1:50051"

typedef struct cgc_cli {
  const char *cmd;  /* the subcommand, for messages */
  const char *help; /* its --help text before the common flags */
  const char *target;
  cgc_options opts;
} cgc_cli;

/* What a subcommand's own option takes and where its value goes. */
typedef enum cgc_cli_kind {
  CGC_CLI_FLAG,          /* no value: *(int *)out = 1 */
  CGC_CLI_STR,           /* *(const char **)out, the last one given */
  CGC_CLI_STRS,          /* repeatable: appended to *(cgc_cli_strs *)out */
  CGC_CLI_NUM,           /* *(cgc_cli_num *)out */
  CGC_CLI_OP,            /* *(cg_op *)out */
  CGC_CLI_DTYPE,         /* *(cg_dtype *)out */
  CGC_CLI_DATA_FORMAT,   /* *(cg_data_format *)out */
  CGC_CLI_WEIGHTS_FORMAT /* *(cg_weights_format *)out */
} cgc_cli_kind;

typedef struct cgc_cli_opt {
  const char *name; /* the long option without "--"; NULL ends a table */
  cgc_cli_kind kind;
  void *out;
} cgc_cli_opt;

/* An integer value with its bounds and the usage message for a value
 * outside them: over (may be NULL: bad) for an integer above hi. */
typedef struct cgc_cli_num {
  int64_t v, lo, hi;
  const char *bad;
  const char *over;
} cgc_cli_num;

#define CGC_CLI_MAX_STRS 64
typedef struct cgc_cli_strs {
  const char *v[CGC_CLI_MAX_STRS];
  int n;
} cgc_cli_strs;

/* Subcommand cmd with its help text; target and options from the
 * environment and defaults, deadline_ms the subcommand's default deadline
 * (0: the library's). */
void cgc_cli_init(cgc_cli *cli, const char *cmd, const char *help,
                  int64_t deadline_ms);
/* Reads every option: the common flags into cli, the subcommand's own
 * (opts) where each says, in command-line order. --help prints help, the
 * common flags and the exit codes. Returns 1 when the caller must return
 * *code (after --help, or a usage error already printed: bad value,
 * missing value, unknown option, stray argument), 0 to go on. */
int cgc_cli_parse(cgc_cli *cli, const cgc_cli_opt *opts, int argc, char **argv,
                  int *code);
/* cgc_cli_parse, then cgc_cli_connect, for subcommands that call the
 * server right away: 1 when the caller must return *code, 0 with *ch
 * open. */
int cgc_cli_start(cgc_cli *cli, const cgc_cli_opt *opts, int argc, char **argv,
                  cgc_channel **ch, int *code);
/* arg into n->v: 0, or prints "convgrad CMD: N->BAD" and returns
 * CGC_EXIT_USAGE. For values read once all flags are known; a NULL arg
 * (flag not given) leaves n->v as it is. */
int cgc_cli_number(const char *cmd, const char *arg, cgc_cli_num *n);
/* An op, dtype or layout name (kind CGC_CLI_OP .. CGC_CLI_WEIGHTS_FORMAT)
 * into out: 0, or prints what the flag accepts and returns
 * CGC_EXIT_USAGE. Like cgc_cli_number, a NULL arg leaves out alone. */
int cgc_cli_name(const char *cmd, cgc_cli_kind kind, const char *arg,
                 void *out);
/* Connects; on failure prints the reason and returns an exit code. */
int cgc_cli_connect(cgc_cli *cli, cgc_channel **ch);
/* Prints one line for a failed call and returns the exit code for it. */
int cgc_cli_fail(const cgc_cli *cli, int rc, const cgc_status *st);
/* With --verify-rate above 0, one line of ch's check counts on out. */
void cgc_cli_verify_report(const cgc_cli *cli, cgc_channel *ch, FILE *out);
/* Prints "convgrad CMD: MESSAGE (see convgrad CMD --help)" and returns
 * CGC_EXIT_USAGE. */
int cgc_cli_usage(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

int cgc_cmd_health(int argc, char **argv);
int cgc_cmd_info(int argc, char **argv);
int cgc_cmd_run(int argc, char **argv);
int cgc_cmd_smoke(int argc, char **argv);
int cgc_cmd_bench(int argc, char **argv);
int cgc_cmd_version(int argc, char **argv);

#endif
