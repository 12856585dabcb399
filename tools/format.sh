#!/bin/bash
# Checks formatting without changing anything: clang-format (.clang-format,
# PEP 7) over the C and CUDA sources, ruff's linter and formatter
# (pyproject.toml, [tool.ruff]) over the Python. Exit status 1 when any
# file would change or a lint rule fails; each tool lists its files.
# usage: bash tools/format.sh [--fix]   (--fix rewrites the files instead)
# needs: pip install ruff clang-format (a clang-format new enough for the
# `Language: C` section of .clang-format; the PyPI wheel is)
set -uo pipefail
cd "$(dirname "$0")/.."
fix=0
[ "${1:-}" = --fix ] && fix=1
rc=0
c_sources=$(git ls-files 'csrc/*.c' 'csrc/**/*.c')
headers=$(git ls-files 'csrc/*.h' 'csrc/**/*.h' 'include/*.h' 'include/**/*.h')
cuda_sources=$(git ls-files 'csrc/*.cu' 'csrc/**/*.cu' 'csrc/*.cuh' \
    'csrc/**/*.cuh')
python_dirs="gemsops tests benchmark tools examples setup.py"
if [ "$fix" = 1 ]; then
    clang-format -i $c_sources $cuda_sources
    # clang-format takes .h for C++: format them as the C they are
    for h in $headers; do
        clang-format --assume-filename="${h%.h}.c" < "$h" > "$h.fmt" \
            && mv "$h.fmt" "$h"
    done
    ruff check --fix $python_dirs
    ruff format $python_dirs
    exit $?
fi
clang-format --dry-run -Werror $c_sources $cuda_sources || rc=1
for h in $headers; do
    clang-format --dry-run -Werror --assume-filename="${h%.h}.c" < "$h" \
        2>&1 | sed "s|^<stdin>|$h|"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
done
ruff check $python_dirs || rc=1
ruff format --check $python_dirs || rc=1
exit $rc
