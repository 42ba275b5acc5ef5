#!/usr/bin/env bash
# Detects optional toolchains by compiling and linking small probes (never by asking dpkg),
# and writes the result as make variables to $1 (build/config.mk).
#   tools/probe.sh OUT          probe and write OUT
#   tools/probe.sh --signature  one word that changes whenever what the probe would find can
#                               have changed (a tool or header installed or removed, the roots
#                               below); the Makefile probes again when it differs from OUT's
set -u
cd "$(dirname "$0")/.."
cc=${CC:-gcc}

signature() {
    { command -v nvcc mpicc mpirun pkg-config 2>/dev/null
      echo "missing: $(bash tools/install_deps.sh --check build test mpi)"
      echo "roots: ${CMOCKA_ROOT:-} ${CUDNN_ROOT:-} ${CUTLASS_ROOT:-} ${CUTLASS_WHEEL:-} cc: $cc"
      ls -d build/deps/cutlass-* 2>/dev/null; } | md5sum | cut -c1-32
}
if [ "${1:-}" = --signature ]; then
    signature
    exit 0
fi

out=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
echo "# written by tools/probe.sh; probed again when tools/probe.sh --signature changes"
echo "PROBE_SIGNATURE := $(signature)"
# What ./cgspn compiles against (tools/install_deps.sh's build group): the Makefile names what is
# missing in one line before compiling anything.
echo "MISSING_BUILD_PACKAGES := $(bash tools/install_deps.sh --check build)"
# nvcc that can compile and link a kernel
if command -v nvcc >/dev/null 2>&1; then
    cat > "$tmp/p.cu" <<'CU'
__global__ void k(float *x) { x[threadIdx.x] = 1.f; }
int main() { k<<<1, 1>>>(nullptr); return 0; }
CU
    if nvcc -o "$tmp/p" "$tmp/p.cu" >/dev/null 2>&1; then
        echo "HAVE_NVCC := 1"
        echo "NVCC := $(command -v nvcc)"
        cudahome=$(dirname "$(dirname "$(command -v nvcc)")")
        echo "CUDA_HOME := $cudahome"
        # compute capability of the GPU present (none on CI: fat binary instead)
        cat > "$tmp/cc.cu" <<'CU'
#include <cstdio>
#include <cuda_runtime.h>
int main() { cudaDeviceProp p; if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 1;
             printf("%d%d\n", p.major, p.minor); return 0; }
CU
        if nvcc -o "$tmp/cc" "$tmp/cc.cu" >/dev/null 2>&1 && sm=$("$tmp/cc" 2>/dev/null); then
            echo "GPU_SM := $sm"
        fi
        # cuDNN, NCCL: header + link probes. cuDNN from the CUDA toolkit, else from CUDNN_ROOT
        # (include/ and lib/ with libcudnn.so.9, as in the nvidia-cudnn Python wheel).
        printf '#include <cudnn.h>\nint main(){return (int)cudnnGetVersion()==0;}\n' > "$tmp/dnn.c"
        if "$cc" -I"$cudahome/include" "$tmp/dnn.c" -o "$tmp/dnn" -L"$cudahome/lib64" -lcudnn >/dev/null 2>&1; then
            echo "HAVE_CUDNN := 1"
        elif [ -n "${CUDNN_ROOT:-}" ] && [ -e "$CUDNN_ROOT/lib/libcudnn.so.9" ]; then
            # the wheel ships libcudnn.so.9 only: link through a libcudnn.so beside config.mk
            linkdir=$(cd "$(dirname "$out")" && pwd)/cudnn-link
            mkdir -p "$linkdir" && ln -sf "$CUDNN_ROOT/lib/libcudnn.so.9" "$linkdir/libcudnn.so"
            if "$cc" -I"$CUDNN_ROOT/include" -I"$cudahome/include" "$tmp/dnn.c" -o "$tmp/dnn" \
                    -L"$linkdir" -lcudnn >/dev/null 2>&1; then
                echo "HAVE_CUDNN := 1"
                echo "CUDNN_CFLAGS := -I$CUDNN_ROOT/include"
                echo "CUDNN_LIBS := -L$linkdir -lcudnn -Xlinker -rpath,$CUDNN_ROOT/lib"
            fi
        fi
        # CUTLASS headers (tools/fetch_cutlass.sh): the fused-epilogue GEMMs; without them the erf
        # GELU runs unfused and the product onto the fp32 stream on cuBLASLt.
        if cutlass=$(bash tools/fetch_cutlass.sh 2>"$tmp/cutlass.err"); then
            echo "HAVE_CUTLASS := 1"
            echo "CUTLASS_CFLAGS := -I$cutlass/include -I$cutlass/tools/util/include"
        else
            echo "cgspn: no CUTLASS, the erf GELU will run unfused beside its GEMM: $(cat "$tmp/cutlass.err")" >&2
        fi
        printf '#include <nccl.h>\nint main(){int v; return ncclGetVersion(&v);}\n' > "$tmp/nccl.c"
        "$cc" -I"$cudahome/include" "$tmp/nccl.c" -o "$tmp/nccl" -L"$cudahome/lib64" -lnccl >/dev/null 2>&1 \
            && echo "HAVE_NCCL := 1"
    fi
fi
# MPI through its compiler wrapper
if command -v mpicc >/dev/null 2>&1; then
    printf '#include <mpi.h>\nint main(int c,char**v){MPI_Init(&c,&v);MPI_Finalize();return 0;}\n' > "$tmp/mpi.c"
    mpicc "$tmp/mpi.c" -o "$tmp/mpi" >/dev/null 2>&1 && echo "HAVE_MPI := 1" \
        && echo "MPI_CFLAGS := $(mpicc --showme:compile 2>/dev/null)" \
        && echo "MPI_LDFLAGS := $(mpicc --showme:link 2>/dev/null)"
fi
# CMocka (tests), found through pkg-config or a local unpacked copy (CMOCKA_ROOT)
if [ -n "${CMOCKA_ROOT:-}" ]; then
    echo "CMOCKA_CFLAGS := -I$CMOCKA_ROOT/usr/include"
    echo "CMOCKA_LIBS := -L$CMOCKA_ROOT/usr/lib/x86_64-linux-gnu -Wl,-rpath,$CMOCKA_ROOT/usr/lib/x86_64-linux-gnu -lcmocka"
elif pkg-config --exists cmocka 2>/dev/null; then
    echo "CMOCKA_CFLAGS := $(pkg-config --cflags cmocka)"
    echo "CMOCKA_LIBS := $(pkg-config --libs cmocka)"
else
    echo "CMOCKA_LIBS := -lcmocka"
fi
} > "$out"
