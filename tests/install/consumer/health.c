/* health.c - a program built against an installed libcgclient (by
 * tests/install/install_e2e.sh, through pkg-config and find_package).
 * Usage: health HOST:PORT. Prints the server's health; exits 0 only when
 * it is SERVING. Uses a core function too (cg_strerror), so that both
 * installed libraries must link. */
#include <stdio.h>

#include <cgc/client.h>

int main(int argc, char **argv) {
  char err[256];
  cgc_channel *ch = NULL;
  cgc_health_status hs = CGC_HEALTH_UNKNOWN;
  cgc_status st;
  if (argc != 2) {
    fprintf(stderr, "usage: %s HOST:PORT\n", argv[0]);
    return 2;
  }
  int rc = cgc_channel_new(&ch, argv[1], NULL, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "cgc_channel_new: %s (%s)\n", err, cg_strerror(rc));
    return 1;
  }
  rc = cgc_health(ch, "", 10000, &hs, &st);
  if (rc != 0)
    fprintf(stderr, "cgc_health: %s: %s %s\n", cgc_strerror(rc),
            cgc_status_code_name(st.code), st.message);
  else
    printf("%s\n", cgc_health_status_name(hs));
  cgc_channel_free(ch);
  return rc == 0 && hs == CGC_HEALTH_SERVING ? 0 : 1;
}
