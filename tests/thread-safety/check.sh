#!/usr/bin/env bash
# Clang's thread-safety analysis over every C++ file of the project (the CI stage "thread-safety
# analysis"): a field GUARDED_BY a mutex touched without it, a REQUIRES function called without
# its mutex, a lock released twice, is a compile error here. The project builds with GCC; this
# configures a clang tree only for its compile_commands.json and runs each command with
# -fsyntax-only (no code generated, so it costs a fraction of a build).
# First it checks that the analysis is on at all: violation.cc, which breaks each rule once, must
# be refused. Prints "thread-safety: FILE: ok|FAIL" per file; exits non-zero on any failure.
# Usage: tests/thread-safety/check.sh [BUILD_DIR]   (default: build-tsa under the repository)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-tsa}
jobs=${JOBS:-$(nproc)}
flags="-fsyntax-only -Wthread-safety -Werror=thread-safety"

mkdir -p "$build"
if ! CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  -DCMAKE_BUILD_TYPE=Debug >"$build/configure.log" 2>&1; then
  cat "$build/configure.log"
  echo "thread-safety: configure: FAIL"
  exit 1
fi

# The analysis must refuse the known violations (else a broken flag would pass everything).
out=$(clang++ -std=c++20 -I"$root" $flags -c "$root/tests/thread-safety/violation.cc" 2>&1)
missing=0
for rule in "requires holding mutex 'mu_' exclusively" "reading variable 'count_' requires" \
  "releasing mutex 'mu_' that was not held" "cannot call function 'Excluded' while mutex 'mu_' is held"; do
  grep -qF "$rule" <<<"$out" || { echo "thread-safety: violation.cc not refused for: $rule"; missing=1; }
done
if [ "$missing" -ne 0 ]; then
  echo "$out"
  echo "thread-safety: the analysis refuses violation.cc: FAIL"
  exit 1
fi
echo "thread-safety: the analysis refuses violation.cc: ok"

# One line per translation unit: "directory<TAB>file<TAB>command".
python3 - "$build/compile_commands.json" "$root" >"$build/tsa-commands.txt" <<'PY'
import json, shlex, sys
root = sys.argv[2]
for e in json.load(open(sys.argv[1])):
    f = e["file"]
    if not f.startswith(root + "/") or not f.endswith(".cc"):
        continue
    args = shlex.split(e["command"])
    out, skip = [], False
    for a in args:  # drop the object output; -fsyntax-only writes none
        if skip: skip = False; continue
        if a == "-o": skip = True; continue
        out.append(a)
    print(e["directory"], f, shlex.join(out), sep="\t")
PY
n=$(wc -l <"$build/tsa-commands.txt")
[ "$n" -gt 0 ] || { echo "thread-safety: no translation units found: FAIL"; exit 1; }

export flags root
check_one() {
  local dir=$1 file=$2 cmd=$3 log
  log=$(cd "$dir" && eval "$cmd $flags" 2>&1)
  if [ $? -eq 0 ]; then
    echo "thread-safety: ${file#$root/}: ok"
  else
    printf '%s\n' "$log"
    echo "thread-safety: ${file#$root/}: FAIL"
  fi
}
export -f check_one
tr '\t' '\037' <"$build/tsa-commands.txt" |
  xargs -d '\n' -P "$jobs" -I{} bash -c 'IFS=$'"'"'\037'"'"' read -r d f c <<<"$1"; check_one "$d" "$f" "$c"' _ {} |
  tee "$build/tsa.log"
! grep -q ': FAIL$' "$build/tsa.log"
