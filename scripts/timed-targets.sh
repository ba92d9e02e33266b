#!/usr/bin/env bash
# Runs `make <target>` for each target given, in order, stops at the first that fails, and prints
# how long each took: the table of where `make test` (and CI) spends its time (docs/molecule.md).
# Then, for a command that failed under scripts/elapsed.py (the molecule scenarios), the few lines
# saying why: last, since CI shows only the tail of its log.
set -u
export PD_FAILURE_DIR="${PD_FAILURE_DIR:-$PWD/artifacts/failures}"
rm -rf "$PD_FAILURE_DIR"
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
if [ -d "$PD_FAILURE_DIR" ]; then
  echo "== why it failed (the full lines are above)"
  cat "$PD_FAILURE_DIR"/*.txt
fi
exit "$status"
