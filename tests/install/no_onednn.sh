#!/bin/sh
# Usage: no_onednn.sh FILE...
# Fails if the loader would map oneDNN or an OpenMP runtime into a process
# using FILE: libcgclient and the CLI must stay loadable beside torch's
# own OpenMP.
status=0
for f in "$@"; do
  deps=$(ldd "$f") || { echo "ldd $f failed" >&2; exit 1; }
  # An empty or truncated answer would pass the check below vacuously.
  echo "$deps" | grep -q 'libc\.so' || {
    echo "$f: ldd does not list libc:" >&2
    echo "$deps" >&2
    exit 1
  }
  bad=$(echo "$deps" | grep -E 'libdnnl|libgomp|libiomp|libomp')
  if [ -n "$bad" ]; then
    echo "$f loads:" >&2
    echo "$bad" >&2
    status=1
  else
    echo "$f: no oneDNN, no OpenMP"
  fi
done
exit $status
