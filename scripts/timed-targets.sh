#!/usr/bin/env bash
# Runs `make <target>` for each target given, in order, stops at the first that fails, and prints
# how long each took: the table of where `make test` (and CI) spends its time (docs/molecule.md).
set -u
status=0
table=()
for target in "$@"; do
  start=$(date +%s)
  make --no-print-directory "$target" || status=$?
  table+=("$(printf '%-20s %6d s' "$target" $(( $(date +%s) - start )))")
  [ "$status" -eq 0 ] || { table+=("(stopped: make $target failed with status $status)"); break; }
done
echo "== time per target"
printf '  %s\n' "${table[@]}"
exit "$status"
