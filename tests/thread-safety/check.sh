#!/usr/bin/env bash
# Clang's thread-safety analysis over every C++ file of the project (the CI stage "thread-safety
# analysis"): a field GUARDED_BY a mutex touched without it, a REQUIRES function called without
# its mutex, a lock released twice, is a compile error here. The project builds with GCC; this
# configures a clang tree only for its compile_commands.json and runs each command with
# -fsyntax-only (no code generated, so it costs a fraction of a build). Its tree is configured
# without the test drivers' precompiled header (tests/support/test_pch.h): it builds nothing, so
# there would be no .pch for a command to load.
# First it checks that the analysis is on at all: violation.cc, which breaks each rule once, must
# be refused. Prints "thread-safety: FILE: ok|FAIL" per file; exits non-zero on any failure.
# A translation unit that a clang tree given with --compiled-in has compiled already, with the
# analysis on (-Wthread-safety, which the project's CMakeLists.txt adds for clang) and -Werror, and
# whose object is newer than its source and every header its depfile names, is not checked again:
# that compile was the check (the CI passes its clang ASan+UBSan tree). Its line says where.
# Usage: tests/thread-safety/check.sh [--compiled-in CLANG_TREE]... [BUILD_DIR]
#        (default BUILD_DIR: build-tsa under the repository)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
compiled_in=()
while [ $# -gt 0 ]; do
  case $1 in
    --compiled-in) compiled_in+=("$(cd "$2" && pwd)") || exit 2; shift 2 ;;
    *) break ;;
  esac
done
build=${1:-$root/build-tsa}
jobs=${JOBS:-$(nproc)}
flags="-fsyntax-only -Wthread-safety -Werror=thread-safety"

mkdir -p "$build"
if ! CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON \
  >"$build/configure.log" 2>&1; then
  cat "$build/configure.log"
  echo "thread-safety: configure: FAIL"
  exit 1
fi

# The analysis must refuse the known violations (else a broken flag would pass everything).
out=$(clang++ -std=c++20 -I"$root" $flags -c "$root/tests/thread-safety/violation.cc" 2>&1)
missing=0
rules=("requires holding mutex 'mu_' exclusively" "reading variable 'count_' requires"
  "releasing mutex 'mu_' that was not held" "cannot call function 'Excluded' while mutex 'mu_' is held")
for rule in "${rules[@]}"; do
  grep -qF "$rule" <<<"$out" || { echo "thread-safety: violation.cc not refused for: $rule"; missing=1; }
done
if [ "$missing" -ne 0 ]; then
  echo "$out"
  echo "thread-safety: the analysis refuses violation.cc: FAIL"
  exit 1
fi
echo "thread-safety: the analysis refuses violation.cc: ok"

# One line per translation unit: "directory<TAB>file<TAB>command"; one "ok" line per unit a
# --compiled-in tree has checked already; and per such tree, its command for violation.cc.
export tsa_trees=$build/tsa-trees.txt
: >"$tsa_trees"
python3 - "$build/compile_commands.json" "$root" "${compiled_in[@]}" >"$build/tsa-commands.txt" \
  2>"$build/tsa-compiled.txt" <<'PY'
import json, os, re, shlex, sys
root = sys.argv[2]

def up_to_date(obj, cwd):  # the object is newer than every file its depfile names
    try:
        t = os.stat(obj).st_mtime
        deps = open(obj + ".d").read()
    except OSError:
        return False
    # Make's syntax: whitespace separates the names, a backslash escapes the next character (a
    # space in a path: "/work/ci\ clone/..."), and $$ is $. Split on whitespace alone, a path
    # with a space was two names that do not exist, so no object counted as up to date.
    body = re.sub(r"\\\n", " ", deps).split(":", 1)[-1]
    names = [re.sub(r"\\(.)", r"\1", n).replace("$$", "$")
             for n in re.findall(r"(?:\\.|[^\s\\])+", body)]
    try:
        return all(os.stat(os.path.join(cwd, n)).st_mtime <= t for n in names)
    except OSError:
        return False

done = {}
for tree in sys.argv[3:]:
    for e in json.load(open(os.path.join(tree, "compile_commands.json"))):
        args = shlex.split(e["command"])
        if "clang" not in os.path.basename(args[0]) or "-Wthread-safety" not in args \
                or "-Werror" not in args or "-o" not in args[:-1]:
            continue
        obj = os.path.join(e["directory"], args[args.index("-o") + 1])
        if up_to_date(obj, e["directory"]):
            if tree not in done.values():  # the tree's own flags must refuse violation.cc too
                v = args[:]
                v[v.index("-o") + 1] = "/dev/null"
                v[-1] = os.path.join(root, "tests/thread-safety/violation.cc")
                with open(os.environ["tsa_trees"], "a") as t:
                    print(tree, e["directory"], shlex.join(v), sep="\t", file=t)
            done.setdefault(e["file"], tree)
            # A unity file (RDMALOCK_UNITY_LIBS) compiled the sources it includes, whose paths
            # CMake writes absolute, one #include a line; its depfile names them too.
            if re.search(r"/Unity/unity_[^/]*\.cxx$", e["file"]):
                with open(e["file"]) as u:
                    for inc in re.findall(r'^#include "([^"]+)"$', u.read(), re.M):
                        done.setdefault(inc, tree)
for e in json.load(open(sys.argv[1])):
    f = e["file"]
    if not f.startswith(root + "/") or not f.endswith(".cc"):
        continue
    if f in done:
        print(f"thread-safety: {f[len(root) + 1:]}: ok (compiled with the analysis in {done[f]})",
              file=sys.stderr)
        continue
    args = shlex.split(e["command"])
    out, skip = [], False
    for a in args:  # drop the object output; -fsyntax-only writes none
        if skip: skip = False; continue
        if a == "-o": skip = True; continue
        out.append(a)
    print(e["directory"], f, shlex.join(out), sep="\t")
PY
lister=$?
# A helper that failed (no compile_commands.json, a tree it cannot read) listed nothing, or not
# everything, and its traceback would read as checked units below.
if [ "$lister" -ne 0 ]; then
  cat "$build/tsa-compiled.txt"
  echo "thread-safety: listing the translation units failed (exit $lister): FAIL"
  exit 1
fi
n=$(wc -l <"$build/tsa-commands.txt")
skipped=$(wc -l <"$build/tsa-compiled.txt")
[ $((n + skipped)) -gt 0 ] || { echo "thread-safety: no translation units found: FAIL"; exit 1; }
# --compiled-in promises that the trees' analysis is reused (run-all builds the ASan tree just
# before): none reused means their depfiles could not be read, and every file would be analysed
# again at several times the cost. From a clone at a path with a space none was, from stop 49 on
# (the depfiles escape the space, and the lister split the path there), and the stage took 92 to
# 136 s where it takes about 15.
if [ "${#compiled_in[@]}" -gt 0 ] && [ "$skipped" -eq 0 ]; then
  echo "thread-safety: no file counted as analysed in ${compiled_in[*]} (stale trees, or depfiles" \
    "the lister cannot read): FAIL"
  exit 1
fi
while IFS=$'\t' read -r tree dir cmd; do
  out=$(cd "$dir" && eval "$cmd" 2>&1)
  for rule in "${rules[@]}"; do
    grep -qF "$rule" <<<"$out" || {
      echo "$out"
      echo "thread-safety: $tree's own flags refuse violation.cc ($rule): FAIL"
      exit 1
    }
  done
  echo "thread-safety: $tree's own flags refuse violation.cc: ok"
done <"$tsa_trees"
cat "$build/tsa-compiled.txt"

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
