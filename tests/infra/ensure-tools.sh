#!/usr/bin/env bash
# Debian tools the tests use for real: promtool (Prometheus' own format and rules checker).
# Idempotent; installs only what is missing, without letting package scripts start services.
set -euo pipefail
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
[[ ${#missing[@]} -eq 0 ]] && exit 0
[[ "$(id -u)" == 0 ]] || { echo "ensure-tools: need root to install ${missing[*]}" >&2; exit 1; }
echo "ensure-tools: installing ${missing[*]}" >&2
added_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && added_policy=1
fi
trap '[[ $added_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
command -v promtool >/dev/null
