#!/usr/bin/env bash
# The container image's wheel: both of the Dockerfile's steps, so that the recipe is tested
# (tests/integration/test_image_build.py) rather than only run by `docker build`.
#
#   deploy/image-wheel.sh build OUT_DIR [PYTHON]      the compiled wheel (mypyc) into OUT_DIR
#   deploy/image-wheel.sh install WHEEL_DIR [PYTHON]  that wheel and its dependencies into
#                                                     PYTHON's environment (the image's, a venv's)
#
# PYTHON defaults to python3. `build` works in a venv of its own made from PYTHON: BUILD_VENV
# names it (created if missing, kept), else a temporary one is removed at exit. It builds from
# a copy of the sources, so a checkout keeps no build/ or egg-info and no in-place build of
# `make compile` reaches the wheel. Needs a C compiler. pip's cache is the caller's choice
# (the Dockerfile sets PIP_NO_CACHE_DIR).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# What setup.py builds the wheel from (tools/compile.py names the compiled modules, README.md is
# the project's readme): the Dockerfile copies the same into its build stage.
SOURCES=(pyproject.toml setup.py MANIFEST.in README.md tools ratelimit_sidecar)
PACKAGE=ratelimit_sidecar

die() {
    printf 'deploy/image-wheel.sh: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# mypyc type-checks what it compiles, so it needs every import and its stubs: pyproject's build
# requirements (pip runs without build isolation), the dependencies, and the dev extra's mypy
# (which ships mypyc) and types-* stubs; not its linters.
build_requirements() {
    "$1" - "$ROOT/pyproject.toml" <<'PY'
import sys
import tomllib

with open(sys.argv[1], "rb") as file:
    pyproject = tomllib.load(file)
dev = pyproject["project"]["optional-dependencies"]["dev"]
print(*pyproject["build-system"]["requires"], sep="\n")
print(*pyproject["project"]["dependencies"], sep="\n")
print(*(r for r in dev if r.startswith(("mypy", "types-"))), sep="\n")
PY
}

# A copy without what a checkout may hold besides the sources: extension modules of
# `make compile`, bytecode, an egg-info.
copy_sources() {
    tar -C "$ROOT" -c --exclude='*.so' --exclude=__pycache__ --exclude='*.egg-info' \
        "${SOURCES[@]}" | tar -C "$1" -x
}

# Every module tools/compile.py compiles must be an extension module in the wheel, beside the
# shared library that holds their code: a wheel of sources alone would run, slowly.
check_compiled() {
    local python=$1 src=$2 wheel=$3
    (cd "$src" && "$python" - "$wheel") <<'PY'
import sys
import zipfile

from tools.compile import GROUP, sources

names = zipfile.ZipFile(sys.argv[1]).namelist()
stems = {name.split(".")[0] for name in names if name.endswith(".so")}
wanted = {GROUP.replace(".", "/") + "__mypyc", *(s.removesuffix(".py") for s in sources())}
if missing := sorted(wanted - stems):
    sys.exit(f"{sys.argv[1]} lacks compiled modules: {', '.join(missing)}")
print(f"{sys.argv[1]}: {len(wanted) - 1} compiled modules and their shared library")
PY
}

build_wheel() {
    local out=$1 python=$2 scratch venv wheel
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    rm -f "$out/$PACKAGE"-*.whl  # a wheel left from an earlier run must not pass for this one
    scratch=$(mktemp -d)
    trap "rm -rf '$scratch'" EXIT  # expanded now: at exit, this function's locals are gone
    venv=${BUILD_VENV:-$scratch/venv}
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    build_requirements "$venv/bin/python" >"$scratch/requirements.txt"
    "$venv/bin/python" -m pip install --quiet -r "$scratch/requirements.txt"
    mkdir "$scratch/src"
    copy_sources "$scratch/src"
    (cd "$scratch/src" && RATELIMIT_SIDECAR_COMPILE=1 "$venv/bin/python" -m pip wheel \
        --no-deps --no-build-isolation -w "$out" .)
    wheel=$(wheel_in "$out")
    check_compiled "$venv/bin/python" "$scratch/src" "$wheel"
}

# The one wheel of the package in a directory; anything else is an error.
wheel_in() {
    local found=("$1/$PACKAGE"-*.whl)
    [ -f "${found[0]}" ] || die "no $PACKAGE wheel in $1"
    [ "${#found[@]}" -eq 1 ] || die "more than one $PACKAGE wheel in $1: ${found[*]}"
    printf '%s\n' "${found[0]}"
}

# Checked in isolated mode (-I: no current directory, no PYTHONPATH on sys.path), so that the
# installed package is what is imported, not a checkout the caller stands in.
install_wheel() {
    local wheel
    wheel=$(wheel_in "$1")
    "$2" -m pip install --quiet "$wheel"
    "$2" -I -c 'import sys, ratelimit_sidecar.core.limiter as m
sys.exit(None if m.__file__.endswith(".so") else f"{m.__file__}: not the compiled module")'
}

[ $# -ge 2 ] && [ $# -le 3 ] || usage
case $1 in
build) build_wheel "$2" "${3:-python3}" ;;
install) install_wheel "$2" "${3:-python3}" ;;
*) usage ;;
esac
