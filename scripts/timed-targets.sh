#!/usr/bin/env bash
# Runs `make <target>` for each argument, in order, stops at the first that fails, and prints how
# long each took: the table of where `make test` (and CI) spends its time (docs/molecule.md).
# An argument `a+b+c` runs those targets at the same time (each line prefixed with its target, the
# full log kept under artifacts/ci-logs/) and waits for all of them: CI's two cores are not both
# busy while the rehearsal tests wait on programs, so the molecule scenarios run beside pytest.
set -u
status=0
table=()
logs=artifacts/ci-logs

run_together() {
  local group=$1 target pids=() names=() rc
  mkdir -p "$logs"
  IFS=+ read -r -a names <<<"$group"
  for target in "${names[@]}"; do
    # sed -u: lines reach CI's log as they are written, each with its target's name.
    ( began=$(date +%s)
      make --no-print-directory "$target" 2>&1 | tee "$logs/$target.log" | sed -u "s/^/[$target] /"
      rc=${PIPESTATUS[0]}
      echo $(( $(date +%s) - began )) >"$logs/$target.seconds"
      exit "$rc" ) &
    pids+=($!)
  done
  for i in "${!names[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    table+=("$(printf '%-20s %6d s (in %s)' "${names[$i]}" "$(cat "$logs/${names[$i]}.seconds")" "$group")")
    if [ "$rc" -ne 0 ]; then
      table+=("(make ${names[$i]} failed with status $rc; its log: $logs/${names[$i]}.log)")
      status=$rc
    fi
  done
}

for target in "$@"; do
  start=$(date +%s)
  if [[ $target == *+* ]]; then
    run_together "$target"
    table+=("$(printf '%-20s %6d s' "($target)" $(( $(date +%s) - start )))")
  else
    make --no-print-directory "$target" || status=$?
    table+=("$(printf '%-20s %6d s' "$target" $(( $(date +%s) - start )))")
  fi
  [ "$status" -eq 0 ] || { table+=("(stopped: make $target failed with status $status)"); break; }
done
echo "== time per target"
printf '  %s\n' "${table[@]}"
exit "$status"
