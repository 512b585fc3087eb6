#!/usr/bin/env bash
# `remora events` end to end: a launched program's fork, exec and exit, and a
# dlopen, are printed; the command exits with the program's status.
set -euo pipefail
remora=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# fork+exec+exit, followed into the child; exit status passed through.
set +e
timeout 60 "$remora" events --follow -- sh -c '/bin/true; exit 3' >"$out" 2>&1
rc=$?
set -e
cat "$out"
[ "$rc" -eq 3 ] || { echo "FAIL: exit status $rc, want 3"; exit 1; }
grep -q 'LAUNCHED' "$out" || { echo "FAIL: no LAUNCHED line"; exit 1; }
grep -Eq '\] V?FORK [0-9]+' "$out" || { echo "FAIL: no FORK line"; exit 1; }
grep -q '\] EXEC /' "$out" || { echo "FAIL: no EXEC line"; exit 1; }
grep -q '\] EXIT 3' "$out" || { echo "FAIL: no EXIT 3 line"; exit 1; }

# A dlopen made by the program itself.
if command -v python3 >/dev/null; then
  timeout 60 "$remora" events -- python3 -c 'import ctypes; ctypes.CDLL("libm.so.6")' >"$out" 2>&1
  cat "$out"
  grep -q 'DLOPEN .*libm' "$out" || grep -q 'DLOPEN' "$out" || { echo "FAIL: no DLOPEN line"; exit 1; }
fi

# Errors: no such process exits 2.
set +e
"$remora" events -p 999999999 >"$out" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "FAIL: events -p on a missing pid succeeded"; exit 1; }
echo "events: ok"
