#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine, for sparkd's integration tests.
#
# Idempotent: if `docker info` works, exit 0 at once. Otherwise install Debian's docker.io when dockerd or
# the docker CLI is missing, start dockerd in the background (detached, logged, pidfile) and wait for it.
# Never starts a second dockerd: if one is already running (ours or not) we only wait for its socket.
#
# Environment:
#   SPARKD_DOCKERD_STATE_DIR  where the log, pidfile and chosen flags go (default /tmp/sparkd-test-dockerd)
#   SPARKD_DOCKERD_FLAGS      exact extra dockerd flags to use (disables the automatic fallbacks)
#   SPARKD_DOCKERD_TIMEOUT    seconds to wait for the socket per attempt (default 60)
#
# Stop the dockerd this script started (and nothing else) with:
#   kill "$(cat /tmp/sparkd-test-dockerd/dockerd.pid)"
set -euo pipefail

STATE_DIR="${SPARKD_DOCKERD_STATE_DIR:-/tmp/sparkd-test-dockerd}"
LOG="$STATE_DIR/dockerd.log"
PIDFILE="$STATE_DIR/dockerd.pid"
FLAGSFILE="$STATE_DIR/dockerd.flags"
TIMEOUT="${SPARKD_DOCKERD_TIMEOUT:-60}"

log() { echo "ensure-docker: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

docker_ok() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

if docker_ok; then
    log "docker engine already answers ($(docker info --format '{{.ServerVersion}} {{.Driver}}' 2>/dev/null))"
    exit 0
fi

mkdir -p "$STATE_DIR"

# Serialise concurrent callers (parallel CI steps, pytest workers): one installs/starts, the others wait.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$STATE_DIR/lock"
    flock -w 600 9 || die "timed out waiting for the lock $STATE_DIR/lock"
    if docker_ok; then
        log "docker engine came up while waiting for the lock"
        exit 0
    fi
fi

if [[ "$(id -u)" != 0 ]]; then
    die "no Docker engine answers and starting one needs root (run this script as root, or start dockerd)"
fi

find_dockerd() {
    command -v dockerd 2>/dev/null && return 0
    local p
    for p in /usr/sbin/dockerd /usr/bin/dockerd /usr/local/sbin/dockerd /usr/local/bin/dockerd; do
        [[ -x "$p" ]] && { echo "$p"; return 0; }
    done
    return 1
}

if ! find_dockerd >/dev/null || ! command -v docker >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "dockerd/docker missing and apt-get is not available to install docker.io"
    log "dockerd or the docker CLI is missing: installing Debian's docker.io"
    # Keep the package's init script from starting its own dockerd: we start exactly one, below.
    policy_created=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy_created=1
    fi
    set +e
    apt_out="$( { apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io; } 2>&1)"
    apt_rc=$?
    set -e
    [[ -n "$policy_created" ]] && rm -f /usr/sbin/policy-rc.d
    if [[ $apt_rc != 0 ]]; then
        printf '%s\n' "$apt_out" | tail -n 30 >&2
        die "apt-get install docker.io failed (exit $apt_rc)"
    fi
    hash -r
    find_dockerd >/dev/null || die "docker.io installed but dockerd is still not found"
    command -v docker >/dev/null 2>&1 || die "docker.io installed but the docker CLI is still not found"
    log "installed docker.io ($(docker --version 2>/dev/null))"
fi
DOCKERD="$(find_dockerd)"

# Is any dockerd already running? (ours from an earlier run, or someone else's): then only wait for it.
running_dockerd() {
    local pid
    if [[ -s "$PIDFILE" ]]; then
        pid="$(cat "$PIDFILE")"
        if alive "$pid" && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == dockerd ]]; then
            echo "$pid"
            return 0
        fi
    fi
    local comm
    for comm in /proc/[0-9]*/comm; do
        pid="${comm#/proc/}"
        pid="${pid%/comm}"
        if [[ "$(cat "$comm" 2>/dev/null)" == dockerd ]] && alive "$pid"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

# Alive and not a zombie (a dockerd we started that died stays a zombie child of this shell).
alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat%% *}" != Z ]]
}

# Wait for `docker info` while the given dockerd lives. 0 = ready, 1 = it died, 2 = timed out.
wait_ready() {
    local pid="$1" deadline
    deadline=$((SECONDS + TIMEOUT))
    while ((SECONDS < deadline)); do
        docker_ok && return 0
        alive "$pid" || { docker_ok && return 0; return 1; }
        sleep 0.5
    done
    docker_ok && return 0
    return 2
}

if pid="$(running_dockerd)"; then
    log "dockerd already running (pid $pid); waiting up to ${TIMEOUT}s for its socket"
    if wait_ready "$pid"; then
        log "docker engine ready"
        exit 0
    fi
    die "a dockerd (pid $pid) is running but docker info fails; not starting a second one. Its log may be $LOG"
fi

start_dockerd() {
    local -a flags=("$@")
    {
        echo "===== $(date -u +%FT%TZ) starting: $DOCKERD ${flags[*]:-}"
    } >>"$LOG"
    # setsid: its own session, so the daemon survives the shell/CI step that started it. The subshell,
    # nohup and setsid all exec, so $! is dockerd's own PID. Close every inherited fd above 2 first: the
    # daemon must not hold our lock (fd 9) or a CI runner's pipes open forever.
    (
        for fd in /proc/self/fd/*; do
            fd="${fd##*/}"
            if ((fd > 2)); then eval "exec ${fd}>&-" 2>/dev/null || true; fi
        done
        exec nohup setsid "$DOCKERD" "${flags[@]}" </dev/null >>"$LOG" 2>&1
    ) &
    echo $! >"$PIDFILE"
    printf '%s\n' "${flags[*]:-}" >"$FLAGSFILE"
}

# Extra flags to try after a failure, chosen from what the log says went wrong.
fallback_flags() {
    local tail_text="$1" current="$2"
    local out="$current"
    if grep -qiE 'overlay|storage.driver|graphdriver|driver not supported|d_type' <<<"$tail_text" &&
        [[ "$current" != *--storage-driver* ]]; then
        out="$out --storage-driver=vfs"
    fi
    if grep -qiE 'iptables|ip6tables|nat chain|bridge|docker0|netlink|network controller' <<<"$tail_text" &&
        [[ "$current" != *--iptables* ]]; then
        out="$out --iptables=false --ip6tables=false --bridge=none"
    fi
    if [[ "$out" == "$current" ]]; then
        [[ "$current" != *--storage-driver* ]] && out="$out --storage-driver=vfs"
        [[ "$current" != *--iptables* ]] && out="$out --iptables=false --ip6tables=false --bridge=none"
    fi
    echo "$out" | sed 's/^ *//'
}

if [[ -n "${SPARKD_DOCKERD_FLAGS+x}" ]]; then
    attempts_max=1
    flags="$SPARKD_DOCKERD_FLAGS"
else
    attempts_max=3
    flags=""  # plain dockerd works on these machines (overlay2, iptables, docker0); fallbacks below
fi

attempt=1
while :; do
    log "starting dockerd${flags:+ with: $flags} (attempt $attempt/$attempts_max; log: $LOG)"
    log_offset=$(stat -c %s "$LOG" 2>/dev/null || echo 0)
    # shellcheck disable=SC2086  # flags is a list of words
    start_dockerd $flags
    pid="$(cat "$PIDFILE")"
    rc=0
    wait_ready "$pid" || rc=$?
    if [[ $rc == 0 ]]; then
        log "docker engine ready (dockerd pid $pid, $(docker info --format '{{.ServerVersion}} storage={{.Driver}} cgroup={{.CgroupDriver}}/v{{.CgroupVersion}}' 2>/dev/null))"
        exit 0
    fi
    # This attempt's log, minus containerd's chatty gRPC connectivity lines.
    attempt_log="$(tail -c +"$((log_offset + 1))" "$LOG" | grep -v 'module=grpc' | tail -n 40 || true)"
    if [[ $rc == 2 ]]; then
        printf '%s\n' "$attempt_log" >&2
        die "dockerd (pid $pid) still not answering after ${TIMEOUT}s; left running. Log: $LOG"
    fi
    log "dockerd exited during start-up; last log lines:"
    printf '%s\n' "$attempt_log" | tail -n 15 >&2
    rm -f "$PIDFILE"
    if ((attempt >= attempts_max)); then
        die "could not start dockerd after $attempt attempt(s). Full log: $LOG"
    fi
    flags="$(fallback_flags "$attempt_log" "$flags")"
    attempt=$((attempt + 1))
done
