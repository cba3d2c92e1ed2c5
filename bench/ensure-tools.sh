#!/usr/bin/env bash
# Install the benchmark's load generators if they are missing and we can (root + apt-get):
#   h2load (nghttp2-client), wrk (wrk), node and npm (nodejs, npm: the transport tests'
#   @grpc/grpc-js client, tests/clients).
# Never fails: a tool that cannot be installed is reported, and `python -m bench` then
# reports the workloads that need it as "not measured".
set -u

export DEBIAN_FRONTEND=noninteractive

LOG="${TMPDIR:-/tmp}/bench-ensure-tools-apt.log"

note() { printf 'ensure-tools: %s\n' "$*"; }

can_install() {
    if [ "$(id -u)" -ne 0 ]; then
        note "not root: cannot install $1 (install package $2 yourself)"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        note "no apt-get: cannot install $1 (install package $2 yourself)"
        return 1
    fi
    return 0
}

apt_install() {
    apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=60 "$1" </dev/null >"$LOG" 2>&1
}

ensure() {
    local tool=$1 package=$2
    if command -v "$tool" >/dev/null 2>&1; then
        note "$tool present ($(command -v "$tool"))"
        return 0
    fi
    can_install "$tool" "$package" || return 0
    note "$tool missing: apt-get install $package"
    if apt_install "$package"; then
        note "installed $package"
        return 0
    fi
    note "install failed; running apt-get update -q and retrying"
    if apt-get update -q </dev/null >>"$LOG" 2>&1 && apt_install "$package"; then
        note "installed $package"
        return 0
    fi
    note "could not install $package (log: $LOG); benchmarks needing $tool will be reported as not measured"
    return 0
}

ensure h2load nghttp2-client
ensure wrk wrk
ensure node nodejs
ensure npm npm
exit 0
