#!/bin/sh
# The peers the benchmarks measure sparkd against: Debian's supervisor and earlyoom (installed only when missing).
# Services the packages would start on install are held back with a temporary policy-rc.d (invoke-rc.d and
# deb-systemd-invoke honour it), so nothing keeps running after `make bench`: the benchmarks start their own
# supervisord and earlyoom and end them by PID.
set -eu
need=""
command -v supervisord >/dev/null 2>&1 || need="$need supervisor"
command -v earlyoom >/dev/null 2>&1 || need="$need earlyoom"
[ -z "$need" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "bench: need root to install:$need (apt-get install -y$need)" >&2
    exit 2
fi
policy=/usr/sbin/policy-rc.d
ours=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    ours=1
fi
trap '[ -n "$ours" ] && rm -f "$policy"' EXIT
echo "bench: installing$need" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || true
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $need >/dev/null
