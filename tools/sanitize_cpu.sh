#!/bin/bash
# The CPU tests (and a fuzz batch, once tests/fuzz exists) against a copy of
# gemsops._C built with GCC's AddressSanitizer and UBSan.
#
# usage: bash tools/sanitize_cpu.sh          (from anywhere; CI runs it last)
#   SANITIZE     sanitizers (default address,undefined,float-cast-overflow)
#   FUZZ_SEED    fuzz seed (default 20240611: fixed, so a failure reproduces)
#   FUZZ_CASES   fuzz cases (default 300)
#   PYTEST_ARGS  extra pytest arguments, e.g. "-x -k layer_norm"
#   KEEP=1       keep the sanitized copy (its path is printed)
#
# The sanitized module is built in a temporary copy of the sources, never in
# this tree: a module linked against libasan cannot even be imported
# without the preloaded runtime, so leaving one in place would break every
# later `import gemsops`. Tests run from the copy; the script checks that the
# copy's module is the one imported (an editable install points elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
SANITIZE=${SANITIZE:-address,undefined,float-cast-overflow}
FUZZ_SEED=${FUZZ_SEED:-20240611}
FUZZ_CASES=${FUZZ_CASES:-300}

work=$(mktemp -d /tmp/gemsops-san.XXXXXX)
if [ "${KEEP:-0}" = 1 ]; then
    echo "sanitize_cpu: sanitized copy kept in $work"
else
    trap 'rm -rf "$work"' EXIT
fi
# the working tree as it is (uncommitted files included; benchmark for
# the tests that import its models), without built modules or caches
tar -cf - --exclude='*.so' --exclude=__pycache__ --exclude=.pytest_cache \
    --exclude=benchmark/results \
    setup.py pyproject.toml LICENSE README.md csrc include gemsops tests \
    benchmark |
    tar -C "$work" -xf -

t0=$(date +%s)
(cd "$work" && GEMSOPS_CUDA=0 GEMSOPS_SANITIZE="$SANITIZE" \
    "$PY" setup.py build_ext --inplace -q > build.log 2>&1) || {
    tail -40 "$work/build.log"; echo "sanitize_cpu: build failed" >&2; exit 1; }
echo "sanitize_cpu: built with -fsanitize=$SANITIZE in $(( $(date +%s) - t0 )) s"

# Python and torch are not instrumented, so the ASan runtime is not loaded
# first on its own; it must be, to intercept malloc before anything
# allocates. libubsan needs no preload: it comes in as the module's
# DT_NEEDED and works from there.
# libstdc++ is preloaded right after it: ASan looks up the real __cxa_throw
# once, when it starts, and Python does not link libstdc++; without it the
# first C++ exception torch throws (any TORCH_CHECK) aborts inside ASan's
# interceptor.
preload=
case ",$SANITIZE," in
    *,address,*)
        preload="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so.6)" ;;
esac
for lib in $preload; do
    if [ ! -e "$lib" ]; then
        echo "sanitize_cpu: gcc has no $lib" >&2
        exit 1
    fi
done

# detect_leaks=0: CPython never frees its interned objects, arenas and
# type caches at exit, and torch keeps global allocators and registries
# alive; LeakSanitizer reports thousands of such "leaks" per run, none ours.
# allocator_may_return_null=1: a test or fuzz case asking torch for an
# impossible tensor must get MemoryError as it would without ASan, not an
# ASan abort for an oversized malloc.
# abort_on_error=1: die by SIGABRT so that no atexit handler or pytest
# plugin can swallow the failure.
asan=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1
# a CUDA build of torch maps the driver's memory at fixed addresses inside
# ASan's shadow gap (torch.cuda.is_available() in conftest is enough), which
# ASan protects by default; the CPU wheel CI installs needs nothing
if LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0 "$PY" -c \
        'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' \
        2>/dev/null; then
    asan=$asan:protect_shadow_gap=0
fi
# log_path: the fuzzer's workers' stderr may not reach us, so ASan's
# reports go to files (one per process, .<pid> appended), printed below;
# any report fails the run, whatever the exit status said. GCC 12's
# libubsan, loaded beside libasan, ignores log_path and always writes to
# stderr: pytest runs with --capture=sys below so that fd 2 is not
# swallowed by a process that dies. abort_on_error for UBSan too: exit 134
# and Python's faulthandler naming the test, as for ASan.
logs=$work/sanitizer-logs
mkdir -p "$logs"
asan=$asan:log_path=$logs/asan
ubsan=print_stacktrace=1:halt_on_error=1:abort_on_error=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}$asan
export UBSAN_OPTIONS=${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}$ubsan
echo "sanitize_cpu: ASAN_OPTIONS=$ASAN_OPTIONS"
echo "sanitize_cpu: UBSAN_OPTIONS=$UBSAN_OPTIONS"

run() { (cd "$work" && LD_PRELOAD=$preload "$@"); }

# an editable install or a stray PYTHONPATH must not hand the tests the
# uninstrumented module: it would pass without checking anything
run "$PY" -c '
import os, sys, gemsops._C as c
here = os.path.realpath(os.getcwd())
if not os.path.realpath(c.__file__).startswith(here + os.sep):
    sys.exit(f"sanitize_cpu: imported {c.__file__}, not the sanitized copy")
'

status=0
t0=$(date +%s)
set +e
# shellcheck disable=SC2086
run "$PY" -m pytest tests -q -p no:cacheprovider -m "not cuda" --capture=sys \
    ${PYTEST_ARGS:-}
rc=$?
set -e
echo "sanitize_cpu: pytest exit $rc in $(( $(date +%s) - t0 )) s"
if [ "$rc" -eq 5 ]; then
    echo "sanitize_cpu: pytest collected no tests: that is a failure" >&2
fi
if [ "$rc" -ne 0 ]; then status=1; fi

if [ -d tests/fuzz ]; then
    t0=$(date +%s)
    set +e
    run "$PY" -m tests.fuzz --seed "$FUZZ_SEED" --cases "$FUZZ_CASES" \
        --device cpu --workers 2
    rc=$?
    set -e
    echo "sanitize_cpu: fuzz (seed $FUZZ_SEED, $FUZZ_CASES cases) exit $rc" \
         "in $(( $(date +%s) - t0 )) s"
    if [ "$rc" -ne 0 ]; then status=1; fi
else
    echo "sanitize_cpu: no tests/fuzz yet: fuzz batch skipped"
fi

reports=$(find "$logs" -type f -size +0 | sort)
if [ -n "$reports" ]; then
    status=1
    for f in $reports; do
        echo "=== sanitizer report ${f#"$work"/} ==="
        cat "$f"
    done
fi
if [ "$status" -ne 0 ]; then
    echo "sanitize_cpu: FAILED (sanitizer reports: $(echo "$reports" |
        grep -c .); exit 134 is a sanitizer's abort)" >&2
fi
exit "$status"
