#!/usr/bin/env bash
# Installs the Debian packages cgspn needs, only those whose files are missing: a package counts
# as present when what cgspn uses from it is there (a header the compiler finds, a command on
# PATH, the dataset's files), however it got there, so a machine without apt but with the files
# (the GPU machine) needs nothing installed. Used by `make deps`, `make test`, `make demo` and
# `make fmnist-shards`; safe to run again.
#   tools/install_deps.sh [--check] [GROUP...]   groups: build test mpi data (default: all)
#     build  what ./cgspn compiles against    test  CMocka for the test suite
#     mpi    mpicc and mpirun (mpirun -np N)  data  the Fashion-MNIST IDX files
#   --check  installs nothing: prints the missing packages of the groups on one line (nothing
#            when none), exit 0 either way (tools/probe.sh uses it)
# The Makefile probes again after an install (tools/probe.sh --signature changes with it).
set -euo pipefail
cd "$(dirname "$0")/.."
cc=${CC:-gcc}
fmnist=${FMNIST_SRC:-/usr/share/datasets/fashion-mnist}

has_header() {   # the compiler finds <$1> (after the headers in $2, space-separated)
    local pre="" h
    for h in ${2:-}; do pre+="#include <$h>"$'\n'; done
    printf '%s#include <%s>\n' "$pre" "$1" | "$cc" ${3:-} -E -x c - >/dev/null 2>&1
}
has_cmocka() {
    local flags=""
    [ -n "${CMOCKA_ROOT:-}" ] && flags="-I$CMOCKA_ROOT/usr/include"
    has_header cmocka.h "stdarg.h stddef.h stdint.h setjmp.h" "$flags"
}
# mpi.h through mpicc: openmpi-bin alone brings an mpicc whose header is missing.
has_mpi_header() {
    command -v mpicc >/dev/null && printf '#include <mpi.h>\n' | mpicc -E -x c - >/dev/null 2>&1
}
has_fmnist() { [ -e "$fmnist/train-images-idx3-ubyte.gz" ] || [ -e "$fmnist/train-images-idx3-ubyte" ]; }

# package | group | the check that shows its files are there
present() {
    case $1 in
        libzstd-dev)           has_header zstd.h ;;
        libpng-dev)            has_header png.h ;;
        libturbojpeg0-dev)     has_header turbojpeg.h ;;
        libjpeg-dev)           has_header jpeglib.h stdio.h ;;
        pkg-config)            command -v pkg-config >/dev/null ;;
        libcmocka-dev)         has_cmocka ;;
        libopenmpi-dev)        has_mpi_header ;;
        openmpi-bin)           command -v mpirun >/dev/null ;;
        dataset-fashion-mnist) has_fmnist ;;
        *) echo "install_deps: unknown package $1" >&2; return 1 ;;
    esac
}
group_packages() {
    case $1 in
        build) echo libzstd-dev libpng-dev libturbojpeg0-dev libjpeg-dev pkg-config ;;
        test)  echo libcmocka-dev ;;
        mpi)   echo libopenmpi-dev openmpi-bin ;;
        data)  echo dataset-fashion-mnist ;;
        *) echo "install_deps: unknown group '$1' (build, test, mpi, data)" >&2; exit 2 ;;
    esac
}

check_only=0
if [ "${1:-}" = --check ]; then check_only=1; shift; fi
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(build test mpi data)
missing=()
for g in "${groups[@]}"; do
    for p in $(group_packages "$g"); do present "$p" || missing+=("$p"); done
done
if [ $check_only = 1 ]; then
    echo "${missing[*]}"
    exit 0
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
    echo "cgspn: missing ${missing[*]} and this machine has no apt-get: install them (or their" \
         "files) another way; for the dataset, FMNIST_SRC=DIR names a folder with its IDX files" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "cgspn: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
echo "cgspn: installing missing packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for p in "${missing[@]}"; do
    present "$p" || { echo "cgspn: apt-get installed $p but its files are still not found" >&2; exit 1; }
done
echo "cgspn: installed ${missing[*]}"
