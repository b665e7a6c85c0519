#!/usr/bin/env bash
# Build the sparkd Debian package (`make deb`): one command, for the architecture it runs on.
#
#   packaging/build-deb.sh [--out DIR] [--wheel FILE]
#
# 1. A wheel and an sdist of this tree (`python -m build`, the wheel built from the sdist, so the sdist is
#    proven complete), unless --wheel gives one; and a wheel of the vLLM stand-in (standin/, the sparkd-standin
#    distribution), which `sparkd run --rehearse` runs in place of vLLM.
# 2. A private virtualenv at /opt/sparkd/venv, made with the system's python3 (SPARKD_DEB_PYTHON) and filled
#    from those wheels (sparkd and the stand-in) and their dependencies at the versions pinned in
#    packaging/constraints.txt (the ones the tests ran with; any other version, or an unpinned package, fails
#    the build); the system Python's site-packages are never touched. It is built in a staging tree and
#    relocated: shebangs and pyvenv.cfg point at /opt/sparkd/venv.
# 3. A hand-made package tree: /usr/bin/sparkd and /usr/bin/sparkctl (symlinks into the venv), the unit
#    /lib/systemd/system/sparkd.service, /etc/sparkd/sparkd.toml (a conffile), docs (README, LICENSE,
#    migration guide, config reference, runbook) and examples, the Prometheus rules and scrape example and
#    the Grafana dashboard under /usr/share/sparkd/, bash and zsh completion for both commands, man pages,
#    and DEBIAN/{control,conffiles,md5sums,postinst,prerm,postrm} from packaging/debian/.
# 4. dpkg-deb --build, then lintian if it is installed (errors fail the build).
#
# Build on the distribution you install on (the package depends on that python3.X): DGX Spark is arm64.
# Needs dpkg-deb, python3 with the venv module, and the repo's .venv with pip >= 22.3 and `build`
# (`make deb` sees to the latter).
#
# Environment:
#   SPARKD_DEB_PYTHON     interpreter the package's venv runs on (default /usr/bin/python3)
#   SPARKD_BUILD_PYTHON   interpreter that runs `build` and pip (default <repo>/.venv/bin/python)
#   SPARKD_DEB_MAINTAINER the Maintainer field (default "sparkd developers <sparkd@example.org>")
#   SPARKD_DEB_LINTIAN    0: do not run lintian even if installed
#   SOURCE_DATE_EPOCH     timestamp for the changelog (default: the last commit's time)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/dist"
WHEEL=""
PREFIX=/opt/sparkd
TARGET_PY="${SPARKD_DEB_PYTHON:-/usr/bin/python3}"
BUILD_PY="${SPARKD_BUILD_PYTHON:-$REPO/.venv/bin/python}"
MAINTAINER="${SPARKD_DEB_MAINTAINER:-sparkd developers <sparkd@example.org>}"

log() { echo "build-deb: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --wheel) WHEEL="$(realpath "$2")"; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

command -v dpkg-deb >/dev/null || die "dpkg-deb is missing (Debian/Ubuntu's dpkg package)"
[[ -x "$TARGET_PY" ]] || die "no python at $TARGET_PY (set SPARKD_DEB_PYTHON)"
[[ -x "$BUILD_PY" ]] || die "no build python at $BUILD_PY (run \`make setup\`, or set SPARKD_BUILD_PYTHON)"
ARCH="$(dpkg --print-architecture)"
mkdir -p "$OUT"
OUT="$(realpath "$OUT")"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sparkd-deb.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/root"
VENV="$ROOT$PREFIX/venv"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)}"

# ---- 1. the wheel
if [[ -z "$WHEEL" ]]; then
    "$BUILD_PY" -c 'import build' 2>/dev/null || die "the build python lacks \`build\` (pip install build; \`make deb\` does)"
    log "building the sdist and the wheel (python -m build)"
    if ! "$BUILD_PY" -m build --outdir "$WORK/dist" "$REPO" >"$WORK/build.log" 2>&1; then
        tail -n 40 "$WORK/build.log" >&2
        die "python -m build failed"
    fi
    WHEEL="$(ls "$WORK"/dist/sparkd-*.whl)"
fi
[[ -f "$WHEEL" ]] || die "no wheel at $WHEEL"
# The wheel must carry the launch profiles (sparkd/config/profiles/*.toml): without them every config with
# `profile = ...` fails on an installed sparkd.
"$BUILD_PY" - "$WHEEL" <<'PY' || die "the wheel is incomplete (see above)"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
profiles = [n for n in names if n.startswith("sparkd/config/profiles/") and n.endswith(".toml")]
if not profiles:
    sys.exit(f"{sys.argv[1]} has no sparkd/config/profiles/*.toml: add them to the package data in pyproject.toml "
             '([tool.setuptools.package-data] sparkd = ["config/profiles/*.toml"])')
PY
if [[ "$WHEEL" == "$WORK"/dist/* ]]; then
    cp "$WORK"/dist/* "$OUT"/  # the wheel and the sdist are artefacts too
fi
log "building the stand-in's wheel (standin/, for sparkd run --rehearse)"
if ! "$BUILD_PY" -m build --wheel --outdir "$WORK/standin-dist" "$REPO/standin" >"$WORK/build-standin.log" 2>&1; then
    tail -n 40 "$WORK/build-standin.log" >&2
    die "python -m build standin/ failed"
fi
STANDIN_WHEEL="$(ls "$WORK"/standin-dist/sparkd_standin-*.whl)"
PEP440="$(basename "$WHEEL" | cut -d- -f2)"
# PEP 440 pre-releases sort before the release in Debian only with a tilde: 1.0rc1 -> 1.0~rc1.
VERSION="$(sed -E 's/\.?(a|b|rc|dev)([0-9]*)/~\1\2/' <<<"$PEP440")"
log "sparkd $PEP440 -> package version $VERSION for $ARCH"

# ---- 2. the private virtualenv
PYBIN="$(readlink -f "$TARGET_PY")"
PYVER="$("$PYBIN" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
log "virtualenv $PREFIX/venv on $PYBIN (python $PYVER)"
"$PYBIN" -m venv --without-pip "$VENV" || die "$PYBIN -m venv failed (install python3-venv)"
CONSTRAINTS="$REPO/packaging/constraints.txt"
"$BUILD_PY" -m pip --python "$VENV/bin/python" install -qq --disable-pip-version-check --no-compile \
    --no-warn-script-location --prefer-binary -c "$CONSTRAINTS" "$WHEEL" "$STANDIN_WHEEL" \
    || die "pip install into the package's venv failed"
"$VENV/bin/python" "$REPO/packaging/venv_check.py" "$CONSTRAINTS" \
    || die "the package's venv differs from $CONSTRAINTS (see above): pin what it installs"
# Relocate: the staging path becomes /opt/sparkd in every text file (shebangs, activate scripts, pyvenv.cfg).
grep -rlIF "$ROOT" "$ROOT$PREFIX" | while IFS= read -r f; do sed -i "s|$ROOT||g" "$f"; done
rm -f "$VENV"/lib/python*/site-packages/sparkd{,_standin}-*.dist-info/direct_url.json  # names the build's temp wheels
find "$VENV" -depth -type d -name __pycache__ -exec rm -rf {} +
# A service needs no activate scripts and no C headers.
rm -f "$VENV"/bin/activate* "$VENV"/bin/Activate.ps1
rm -rf "$VENV/include"
# Strip the bundled extension modules like dh_strip does (debug symbols are not needed on a node).
if command -v strip >/dev/null; then
    find "$VENV" -type f -name '*.so*' -exec strip --remove-section=.comment --remove-section=.note \
        --strip-unneeded {} +
else
    log "strip (binutils) not found: extension modules stay unstripped (lintian: unstripped-binary-or-object)"
fi
if leftover="$(grep -rlIF "$WORK" "$ROOT")"; then
    die "build paths left in the package: $leftover"
fi
"$VENV/bin/python" -c 'import sys; sys.exit(0)' || die "the relocated venv's python does not start"

# The oldest glibc the installed wheels allow (manylinux_X_Y tags; manylinux2014 = 2.17, ...).
GLIBC="$("$PYBIN" - "$VENV" <<'PY'
import glob, re, sys
legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
need = (2, 17)
for wheel in glob.glob(f"{sys.argv[1]}/lib/python*/site-packages/*.dist-info/WHEEL"):
    mins = []
    for line in open(wheel, encoding="utf-8"):
        if line.startswith("Tag:"):
            plat = line.split("-")[-1].strip()
            m = re.match(r"manylinux_(\d+)_(\d+)_", plat)
            if m:
                mins.append((int(m.group(1)), int(m.group(2))))
            elif plat.split("_")[0] in legacy:
                mins.append(legacy[plat.split("_")[0]])
    if mins:
        need = max(need, min(mins))
print("%d.%d" % need)
PY
)"

# ---- 3. the package tree
install -D -m 0644 "$REPO/systemd/sparkd.service" "$ROOT/lib/systemd/system/sparkd.service"
install -D -m 0640 "$REPO/config/sparkd.toml" "$ROOT/etc/sparkd/sparkd.toml"
mkdir -p "$ROOT/usr/bin"
ln -s "$PREFIX/venv/bin/sparkd" "$ROOT/usr/bin/sparkd"
ln -s "$PREFIX/venv/bin/sparkctl" "$ROOT/usr/bin/sparkctl"

DOC="$ROOT/usr/share/doc/sparkd"
install -D -m 0644 "$REPO/packaging/debian/copyright" "$DOC/copyright"
install -m 0644 "$REPO/README.md" "$DOC/README.md"
install -m 0644 "$REPO/LICENSE" "$DOC/LICENSE"
for doc in migration config runbook; do
    install -m 0644 "$REPO/docs/$doc.md" "$DOC/$doc.md"
done
# Monitoring: the alert rules (with their promtool tests), a scrape example and the Grafana dashboard.
SHARE="$ROOT/usr/share/sparkd"
install -D -m 0644 -t "$SHARE/prometheus" "$REPO"/packaging/prometheus/*.yml
install -D -m 0644 -t "$SHARE/grafana" "$REPO/packaging/grafana/sparkd-dashboard.json"
install -d "$DOC/examples"
for example in "$REPO"/config/examples/*.toml "$REPO"/docs/examples/*.toml; do
    [[ -f "$example" ]] && install -m 0644 "$example" "$DOC/examples/"
done
CHANGED="$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
printf 'sparkd (%s) unstable; urgency=medium\n\n  * Built from the sparkd source tree (%s).\n\n -- %s  %s\n' \
    "$VERSION" "$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)" "$MAINTAINER" "$CHANGED" \
    | gzip -9n >"$DOC/changelog.gz"

# Manual pages generated from the click commands (sparkd/cli/manpages.py): sparkd(8), sparkctl(8) and one page per
# subcommand, each with its EXIT STATUS. The relocated scripts point at /opt/sparkd, which does not exist here:
# run the module with the venv's python.
install -d "$ROOT/usr/share/man/man8"
"$VENV/bin/python" -m sparkd.cli.manpages "$ROOT/usr/share/man/man8" \
    --date "$(date -u -d "@$SOURCE_DATE_EPOCH" +%F)" --version "$PEP440" || die "the manual pages failed to build"

# Shell completion, click's own scripts (they call the command back for the candidates).
completion() {  # name shell destination
    "$VENV/bin/python" -c 'import os, sys, importlib; m = importlib.import_module("sparkd.cli." + sys.argv[1])
os.environ["_" + sys.argv[1].upper() + "_COMPLETE"] = sys.argv[2] + "_source"
m.main(prog_name=sys.argv[1], args=[])' "$1" "$2" >"$3" || die "$1: no $2 completion"
    [[ -s "$3" ]] || die "$1: empty $2 completion"
}
install -d "$ROOT/usr/share/bash-completion/completions" "$ROOT/usr/share/zsh/vendor-completions"
for name in sparkd sparkctl; do
    completion "$name" bash "$ROOT/usr/share/bash-completion/completions/$name"
    completion "$name" zsh "$ROOT/usr/share/zsh/vendor-completions/_$name"
done

# Lintian overrides: deliberate choices, each with its reason.
install -D -m 0644 "$REPO/packaging/debian/lintian-overrides" "$ROOT/usr/share/lintian/overrides/sparkd"

# Modes: directories 0755, files 0644, the venv's programs 0755.
find "$ROOT" -type d -exec chmod 0755 {} +
find "$ROOT" -type f -exec chmod 0644 {} +
find "$VENV/bin" -type f -exec chmod 0755 {} +
# The config may hold [launch] api_key: root's, not every local user's (security review §4).
chmod 0640 "$ROOT/etc/sparkd/sparkd.toml"

install -d "$ROOT/DEBIAN"
for script in postinst prerm postrm; do
    sed "s|@PREFIX@|$PREFIX|g" "$REPO/packaging/debian/$script" >"$ROOT/DEBIAN/$script"
    chmod 0755 "$ROOT/DEBIAN/$script"
done
install -m 0644 "$REPO/packaging/debian/conffiles" "$ROOT/DEBIAN/conffiles"
(cd "$ROOT" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
    xargs -0 md5sum) >"$ROOT/DEBIAN/md5sums"
chmod 0644 "$ROOT/DEBIAN/md5sums"
SIZE="$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)"
PYPKG="python$PYVER"
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@MAINTAINER@|$MAINTAINER|" \
    -e "s|@INSTALLED_SIZE@|$SIZE|" -e "s|@PYTHON_PACKAGE@|$PYPKG|" -e "s|@GLIBC@|$GLIBC|" \
    "$REPO/packaging/debian/control.in" >"$ROOT/DEBIAN/control"

# ---- 4. build and check
DEB="$OUT/sparkd_${VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
log "built $DEB ($(du -h "$DEB" | cut -f1); depends: $PYPKG, libc6 >= $GLIBC)"
if [[ "${SPARKD_DEB_LINTIAN:-1}" != 0 ]] && command -v lintian >/dev/null; then
    log "lintian $(basename "$DEB")"
    lintian --fail-on error "$DEB" >&2 || die "lintian reports errors"
fi
echo "$DEB"
