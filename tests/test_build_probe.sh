#!/usr/bin/env bash
# The build probe (tools/probe.sh, cached in build/config.mk) follows what is installed: a copy
# of the Makefile and tools/ first probes with MPI hidden from PATH, then with it visible, as
# after `make test` installs OpenMPI; the second probe must find MPI without deleting anything
# by hand. Also: plain `make` builds ./cgspn, and tools/install_deps.sh judges packages by
# their files (a dataset folder given by FMNIST_SRC counts; MPI's header through mpicc, which
# openmpi-bin brings without it); tools/fetch_cutlass.sh takes a named copy and refuses a bad one.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/tests/expect.sh"   # expect NAME COND; fail
mpicc_path=$(command -v mpicc) || {
    echo "test_build_probe: no mpicc on PATH (make deps installs OpenMPI): cannot run"
    [ "${CI:-}" = true ] && exit 1 || exit 0
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/repo" "$tmp/bin"
cp "$root/Makefile" "$tmp/repo/" && cp -r "$root/tools" "$tmp/repo/"
# PATH without MPI (and without nvcc, to keep the probe short): every command of mpicc's folder
# but the MPI ones, and the rest of PATH without that folder.
mpidir=$(dirname "$mpicc_path")
for f in "$mpidir"/*; do
    case $(basename "$f") in mpi*|orte*|ompi*|opal*|oshrun|shmem*) ;; *) ln -s "$f" "$tmp/bin/";; esac
done
rest=$(tr ':' '\n' <<<"$PATH" | grep -v -x -e "$mpidir" -e "$(readlink -f "$mpidir")" -e '/bin' \
       -e '/usr/bin' | grep -v cuda | paste -sd:)
no_mpi_path="$tmp/bin:$rest"
with_mpi_path="$tmp/bin:$mpidir:$rest"
cd "$tmp/repo"

PATH=$no_mpi_path make -s build/config.mk >/dev/null 2>&1
expect "first probe, MPI hidden: no HAVE_MPI" "! grep -q '^HAVE_MPI := 1' build/config.mk"
PATH=$with_mpi_path make -s build/config.mk >/dev/null 2>&1
expect "MPI installed since: the next make probes again and finds it" \
       "grep -q '^HAVE_MPI := 1' build/config.mk"
sig=$(grep '^PROBE_SIGNATURE' build/config.mk)
PATH=$with_mpi_path make -s build/config.mk >/dev/null 2>&1
expect "nothing changed: the cached findings stay" "[ \"\$(grep '^PROBE_SIGNATURE' build/config.mk)\" = \"\$sig\" ]"
goal=$(PATH=$with_mpi_path make -pq 2>/dev/null | sed -n 's/^\.DEFAULT_GOAL := //p')
all_deps=$(PATH=$with_mpi_path make -pq 2>/dev/null | sed -n 's/^all: *//p')
expect "plain make builds ./cgspn (default goal all: cgspn)" "[ \"\$goal\" = all ] && [ \"\$all_deps\" = cgspn ]"

mkdir -p "$tmp/fmnist"
out=$(FMNIST_SRC="$tmp/fmnist" bash tools/install_deps.sh --check data)
expect "install_deps --check: a dataset folder without the files is missing" \
       "[ \"\$out\" = dataset-fashion-mnist ]"
touch "$tmp/fmnist/train-images-idx3-ubyte.gz"
out=$(FMNIST_SRC="$tmp/fmnist" bash tools/install_deps.sh --check data)
expect "install_deps --check: the files there count as installed" "[ -z \"\$out\" ]"
out=$(PATH=$no_mpi_path bash tools/install_deps.sh --check mpi)
expect "install_deps --check: MPI hidden is missing" "[ \"\$out\" = 'libopenmpi-dev openmpi-bin' ]"
# openmpi-bin without libopenmpi-dev: mpicc and mpirun on PATH, no mpi.h behind mpicc.
mkdir -p "$tmp/bin_only"
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v gcc)" > "$tmp/bin_only/mpicc"
chmod +x "$tmp/bin_only/mpicc"
ln -s "$mpidir/mpirun" "$tmp/bin_only/mpirun"
out=$(PATH="$tmp/bin_only:$no_mpi_path" bash tools/install_deps.sh --check mpi)
expect "install_deps --check: mpicc without mpi.h is libopenmpi-dev missing" \
       "[ \"\$out\" = libopenmpi-dev ]"
PATH="$tmp/bin_only:$no_mpi_path" make -s build/config.mk >/dev/null 2>&1
expect "the probe finds no MPI behind an mpicc without mpi.h" "! grep -q '^HAVE_MPI := 1' build/config.mk"

# CUTLASS (tools/fetch_cutlass.sh, no network needed here): a named copy is used as it is, a
# copy without the headers is refused by name, and a wheel whose sha256 differs leaves nothing.
mkdir -p "$tmp/cutlass/include/cutlass" "$tmp/cutlass/tools/util/include/cutlass/util"
touch "$tmp/cutlass/include/cutlass/cutlass.h" "$tmp/cutlass/tools/util/include/cutlass/util/packed_stride.hpp"
out=$(CUTLASS_ROOT="$tmp/cutlass" bash tools/fetch_cutlass.sh 2>&1)
expect "fetch_cutlass: CUTLASS_ROOT with the headers is the root" "[ \"\$out\" = \"$tmp/cutlass\" ]"
out=$(CUTLASS_ROOT="$tmp/fmnist" bash tools/fetch_cutlass.sh 2>&1); rc=$?
expect "fetch_cutlass: CUTLASS_ROOT without them fails, naming it" "[ $rc = 1 ] && grep -q CUTLASS_ROOT <<<\"\$out\""
printf 'not a wheel' > "$tmp/fake.whl"
mkdir -p "$tmp/fetch" && cp -r tools "$tmp/fetch/"   # a tree that has fetched nothing yet
out=$(cd "$tmp/fetch" && CUTLASS_WHEEL="$tmp/fake.whl" bash tools/fetch_cutlass.sh 2>&1); rc=$?
expect "fetch_cutlass: a wheel with another sha256 fails and unpacks nothing" \
       "[ $rc = 1 ] && grep -q 'sha256 mismatch' <<<\"\$out\" && ! ls -d $tmp/fetch/build/deps/cutlass-* >/dev/null 2>&1"
exit $fail
