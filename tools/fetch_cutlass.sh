#!/usr/bin/env bash
# CUTLASS's headers for the fused-epilogue GEMMs (kernels/cuda/gemm_cutlass.cu): the nvidia-cutlass
# wheel from PyPI, one pinned version checked by its sha256, unpacked (include/ and
# tools/util/include/ only) into build/deps/cutlass-VERSION. Prints that root and exits 0; exits 1
# with the reason on stderr when it cannot (the build then runs those GEMMs unfused).
# A machine without network access names an unpacked copy (CUTLASS_ROOT=DIR, holding include/ and
# tools/util/include/) or the wheel file (CUTLASS_WHEEL=FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
dest=build/deps/cutlass-$version
complete() { [ -e "$1/include/cutlass/cutlass.h" ] && [ -e "$1/tools/util/include/cutlass/util/packed_stride.hpp" ]; }

if [ -n "${CUTLASS_ROOT:-}" ]; then
    complete "$CUTLASS_ROOT" && { echo "$CUTLASS_ROOT"; exit 0; }
    echo "CUTLASS_ROOT=$CUTLASS_ROOT has no include/cutlass/cutlass.h and tools/util/include/" >&2
    exit 1
fi
complete "$dest" && { echo "$(pwd)/$dest"; exit 0; }
command -v python3 >/dev/null || { echo "no python3 to fetch CUTLASS with" >&2; exit 1; }
mkdir -p build/deps
python3 - "$version" "$sha256" "$dest" "${CUTLASS_WHEEL:-}" <<'PY' || exit 1
import hashlib, io, json, os, shutil, sys, urllib.parse, urllib.request, zipfile
version, sha256, dest, wheel = sys.argv[1:5]
try:
    if wheel:
        data = open(wheel, "rb").read()
    else:
        url = "https://pypi.org/pypi/nvidia-cutlass/json"
        meta = json.load(urllib.request.urlopen(url, timeout=30))
        whl = [f["url"] for f in meta["releases"][version] if f["filename"].endswith(".whl")][0]
        data = urllib.request.urlopen(urllib.parse.urljoin(url, whl), timeout=300).read()
except Exception as e:
    sys.exit(f"could not fetch nvidia-cutlass {version} ({e}); CUTLASS_WHEEL=FILE names a copy")
if hashlib.sha256(data).hexdigest() != sha256:
    sys.exit(f"nvidia-cutlass {version}: sha256 mismatch")
prefix, part = "cutlass_library/source/", dest + ".part"
shutil.rmtree(part, ignore_errors=True)
z = zipfile.ZipFile(io.BytesIO(data))
for name in z.namelist():
    rel = name[len(prefix):]
    if not name.startswith(prefix) or name.endswith("/"):
        continue
    if rel.startswith("include/") or rel.startswith("tools/util/include/") or rel == "LICENSE.txt":
        out = os.path.join(part, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(z.read(name))
os.replace(part, dest)
PY
complete "$dest" || { echo "the nvidia-cutlass wheel lacks the expected headers" >&2; exit 1; }
echo "$(pwd)/$dest"
