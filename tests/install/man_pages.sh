#!/bin/sh
# Usage: man_pages.sh MAN_DIR CLI
# The man pages the build generated with help2man (MAN_DIR: convgrad.1.gz,
# convgrad-server.8.gz) format without a groff or man warning, and
# convgrad(1) has a section for every command `CLI --help` lists.
set -eu
dir=$1 cli=$2
fail() {
  echo "man_pages: $*" >&2
  exit 1
}
for page in convgrad.1.gz convgrad-server.8.gz; do
  [ -s "$dir/$page" ] || fail "$dir/$page is missing"
  warnings=$(MANWIDTH=80 man --warnings -E UTF-8 -l "$dir/$page" 2>&1 >/dev/null)
  [ -z "$warnings" ] || fail "$page: $warnings"
  lines=$(MANWIDTH=80 man -E UTF-8 -l "$dir/$page" 2>/dev/null | wc -l)
  [ "$lines" -gt 50 ] || fail "$page formats to $lines lines only"
  echo "$page: $lines lines, no warnings"
done
commands=$("$cli" --help | sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z]*\) .*/\1/p')
[ -n "$commands" ] || fail "no commands in '$cli --help'"
text=$(MANWIDTH=200 man -E UTF-8 -l "$dir/convgrad.1.gz" 2>/dev/null)
for c in $commands; do
  echo "$text" | grep -q "^   convgrad $c\$" || fail "convgrad(1) has no section for '$c'"
  echo "$text" | grep -q "Usage: convgrad $c" || fail "convgrad(1) lacks '$c --help'"
done
echo "convgrad(1) describes:" $commands
