/* bench_faults.c - how many injected faults reach the caller as a wrong
 * result (issue 37's first target). Starts a CG_FAULT_INJECT build of the
 * server with CONVGRAD_FAULT_INJECT=1 (every computed output gets one bit
 * flipped among its top 16 before its check), --check-rate 1 and no
 * quarantine, sends N random small problems (ts_random_problem: the four
 * ops, f32/bf16/f16, ranks 1-3, both data layouts, every weights format,
 * groups, strides, pads, dilations) and compares every answer with the
 * plain reference within the tests' tolerance (ts_problem_check). Prints
 * the wrong OK answers among the injected faults, by op, dtype and rank,
 * and how the others were answered.
 *
 *   cg_bench_faults [N]   (default 10000)
 *
 * Exits 1 when the server is not a CG_FAULT_INJECT build (nothing is
 * injected) or a call fails otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts.h"

typedef struct tally {
  int calls, wrong, lost;
} tally;

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 10000;
  ts_server s;
  grpc_channel *ch;
  const char *args[] = {"--check-rate", "1", "--check-quarantine", "0", NULL};
  setenv("CONVGRAD_FAULT_INJECT", "1", 1);
  setenv("CONVGRAD_FAULT_SEED", "1", 1);
  if (ts_fixture_start(&s, &ch, args) != 0) {
    fprintf(stderr, "cannot start the server\n");
    return 1;
  }
  tally by_op[5] = {{0}}, by_dt[4] = {{0}}, by_rank[4] = {{0}}, all = {0};
  uint64_t rng = 20261127;
  int rc = 0;
  double t0 = ts_now_ms();
  for (int i = 0; i < n && rc == 0; i++) {
    ts_problem tp;
    if (ts_random_problem(&tp, &rng) != 0 || ts_problem_reference(&tp) != 0) {
      rc = 1;
      break;
    }
    const void *data[2] = {tp.in[0], tp.in[1]};
    size_t len[2] = {tp.g.in_bytes[0], tp.g.in_bytes[1]};
    ts_result r;
    int wrong = 0, lost = 0;
    if (ts_compute(ch, &tp.header, data, len, NULL, &r) != 0) {
      rc = 1;
    } else if (r.code == GRPC_STATUS_OK) {
      wrong = r.nbytes != tp.g.out_bytes || ts_problem_check(&tp, r.data) != 0;
    } else if (r.code == GRPC_STATUS_DATA_LOSS) {
      lost = 1;
    } else {
      fprintf(stderr, "call %d: status %d: %s\n", i, (int)r.code, r.msg);
      rc = 1;
    }
    tally *t[4] = {&by_op[tp.g.op], &by_dt[tp.g.dtype], &by_rank[tp.g.nsp],
                   &all};
    for (int k = 0; k < 4; k++) {
      t[k]->calls++;
      t[k]->wrong += wrong;
      t[k]->lost += lost;
    }
    ts_result_free(&r);
    ts_problem_free(&tp);
  }
  double secs = (ts_now_ms() - t0) / 1e3;
  Convgrad__V1__ServerInfo *info = ts_server_info(ch);
  if (!info || !info->result_checks) {
    fprintf(stderr, "no GetServerInfo result_checks\n");
    rc = 1;
  } else {
    const Convgrad__V1__ResultChecks *c = info->result_checks;
    printf("%d calls in %.1f s, one fault injected in each output: checks "
           "%llu, failed %llu, recomputed %llu, DATA_LOSS %llu\n",
           all.calls, secs, (unsigned long long)c->checked,
           (unsigned long long)c->failed, (unsigned long long)c->recomputed,
           (unsigned long long)c->data_loss);
    if (c->failed == 0) {
      fprintf(stderr, "nothing failed a check: not a CG_FAULT_INJECT "
                      "server?\n");
      rc = 1;
    }
  }
  if (info)
    convgrad__v1__server_info__free_unpacked(info, NULL);
  printf("wrong results answered OK: %d of %d injected (%.3f%%); "
         "DATA_LOSS %d; the rest right\n",
         all.wrong, all.calls, 100.0 * all.wrong / (all.calls ? all.calls : 1),
         all.lost);
  for (int op = 1; op <= 4; op++)
    printf("  %-30s %5d calls, %3d wrong, %3d DATA_LOSS\n",
           cg_op_name((cg_op)op), by_op[op].calls, by_op[op].wrong,
           by_op[op].lost);
  for (int dt = 1; dt <= 3; dt++)
    printf("  %-30s %5d calls, %3d wrong, %3d DATA_LOSS\n",
           cg_dtype_name((cg_dtype)dt), by_dt[dt].calls, by_dt[dt].wrong,
           by_dt[dt].lost);
  for (int k = 1; k <= 3; k++)
    printf("  rank %d %-23s %5d calls, %3d wrong, %3d DATA_LOSS\n", k, "",
           by_rank[k].calls, by_rank[k].wrong, by_rank[k].lost);
  if (ts_fixture_stop(&s, ch) != 0)
    rc = 1;
  return rc;
}
