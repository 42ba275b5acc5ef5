#!/usr/bin/env bash
# Fuzzes every input parser with libFuzzer (clang, AddressSanitizer + UndefinedBehaviorSanitizer)
# for a fixed number of executions each, one target after another:
#   shard        shard header, index and records; the manifest (data/shard.c, data/dataset.c)
#   image        PNG and JPEG decoding (data/image_decode.c)
#   safetensors  the safetensors header and its tensors (nn/safetensors.c, safetensors_parse.c)
#   config       cfg files with includes and cpu_config, overrides, lists (train/config*.c)
#   idx          IDX image and label files, plain and gzip'd (data/idx.c)
# Usage: tools/fuzz.sh [RUNS [SECONDS]]
#   RUNS      executions per target (default 1000000: libFuzzer's -runs)
#   SECONDS   optional cap on each target's time (default 0, none); a target it stops reports
#             fewer executions than RUNS
#   FUZZ_JOBS=N            N worker processes per target, sharing the RUNS
#   FUZZ_TARGETS="idx ..." a subset of the targets above
# Seeds: a small shard set and PNG/JPEG images made by ./cgspn (built when absent), safetensors
# files written by the project's writer (tests/fuzz/seed_safetensors.c), configs/*.cfg, and IDX
# files written here. Everything lives in build/fuzz: the fuzzers, seeds/, the corpora the runs
# grow (corpus_*), a log per target, and artifacts/ (TARGET-crash-*, -leak-*, -timeout-*, -oom-*:
# the input that failed, to rerun with build/fuzz/fuzz_TARGET FILE).
# Prints one line per target: executions done, and crashes: the failing inputs this run wrote
# (sanitizer reports and aborts, leaks, inputs over 30 s or 2 GiB); exits 1 when any target
# found one.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1000000}
secs=${2:-0}
jobs=${FUZZ_JOBS:-1}
targets=${FUZZ_TARGETS:-shard image safetensors config idx}
out=build/fuzz
configs=$PWD/configs
mkdir -p "$out/artifacts"
command -v clang >/dev/null || { echo "fuzz: clang not found (apt-get install clang)"; exit 1; }
# Only the shard and image seeds need ./cgspn; an existing binary is used as it is (its writers
# only seed the corpus) rather than rebuilt under a build that may be in progress.
[ -x ./cgspn ] || make -s cgspn
# Smaller decode limit in the fuzz build: keeps each input fast; the check itself is the same.
flags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -DIMAGE_MAX_PIXELS=(1ull<<22)"
libs="-lpng -lturbojpeg -lzstd -lz -lm -lpthread"
st="nn/safetensors.c nn/safetensors_parse.c kernels/tensor.c"
clang $flags tests/fuzz/fuzz_shard.c data/shard.c data/dataset.c data/shard_writer.c kernels/error.c \
      $libs -o "$out/fuzz_shard"
clang $flags tests/fuzz/fuzz_image.c data/image_decode.c kernels/error.c $libs -o "$out/fuzz_image"
clang $flags tests/fuzz/fuzz_safetensors.c $st kernels/error.c $libs -o "$out/fuzz_safetensors"
# The key table without comparison tracing: an unknown key's "did you mean" runs an edit distance
# against every key, which traced costs most of each input's time; key names still reach the
# fuzzer through the strcmp of the lookup, which libFuzzer hooks either way.
clang ${flags/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,} -fno-sanitize-coverage=trace-cmp \
      -c train/config_table.c -o "$out/config_table.o"
clang $flags tests/fuzz/fuzz_config.c train/config.c "$out/config_table.o" kernels/error.c $libs \
      -o "$out/fuzz_config"
clang $flags tests/fuzz/fuzz_idx.c data/idx.c kernels/error.c $libs -o "$out/fuzz_idx"
clang -g -O1 -std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L tests/fuzz/seed_safetensors.c \
      $st nn/safetensors_write.c kernels/error.c -lm -lpthread -o "$out/seed_safetensors"

# Seed corpora.
seeds=$out/seeds
rm -rf "$seeds" && mkdir -p "$seeds"/{shard,image,safetensors,config,idx,tmp}
./cgspn data synth "$seeds/tmp/jpg" --count 6 --classes 2 --height 40 --width 48 >/dev/null
./cgspn data synth "$seeds/tmp/png" --count 4 --classes 2 --height 24 --width 20 --png >/dev/null
./cgspn data build --from imagefolder "$seeds/tmp/jpg" --out "$seeds/tmp/shards" --size 16 \
    --shard-mb 1 --quiet >/dev/null
cp "$seeds"/tmp/shards/*.cgs "$seeds"/tmp/shards/*.manifest "$seeds/shard/"
find "$seeds/tmp/jpg" "$seeds/tmp/png" -type f -exec cp {} "$seeds/image/" \;
"$out/seed_safetensors" "$seeds/safetensors"
cp configs/*.cfg "$seeds/config/"
# IDX (big-endian u32 magic and dims, then uint8 data): images 3 x 4 x 5 and 0 x 28 x 28, labels,
# each also gzip'd (the reader takes both).
be32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }
{ printf "$(be32 2051)$(be32 3)$(be32 4)$(be32 5)"; head -c 60 /dev/zero | tr '\0' '\200'; } \
    >"$seeds/idx/images"
printf "$(be32 2051)$(be32 0)$(be32 28)$(be32 28)" >"$seeds/idx/images_empty"
printf "$(be32 2049)$(be32 5)\\x00\\x01\\x09\\x03\\x07" >"$seeds/idx/labels"
for f in images labels; do gzip -9n <"$seeds/idx/$f" >"$seeds/idx/$f.gz"; done
rm -rf "$seeds/tmp"

# Artifacts of kind $1 (crash, leak, ...) target $t wrote during this run.
artifacts_new() { find "$out/artifacts" -name "$t-$1-*" -newer "$out/.start_$t" | wc -l; }
status=0
per_job=$(((runs + jobs - 1) / jobs))
for t in $targets; do
    [ -x "$out/fuzz_$t" ] || { echo "fuzz: unknown target '$t'"; exit 2; }
    mkdir -p "$out/corpus_$t"
    touch "$out/.start_$t"
    # Run inside build/fuzz: with FUZZ_JOBS > 1 libFuzzer writes fuzz-N.log to the working folder.
    # -rss_limit_mb: a decoder may legitimately allocate a limit-sized image per input.
    # -close_fd_mask=1: the targets' stdout (cpu_config's notice) is noise; libFuzzer uses stderr.
    args=(-runs="$per_job" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=30
          -close_fd_mask=1 -artifact_prefix="artifacts/$t-" -print_final_stats=1)
    [ "$jobs" -gt 1 ] && args+=(-jobs="$jobs" -workers="$jobs")
    start=$(date +%s)
    rc=0
    (cd "$out" && FUZZ_CONFIG_DIR=$configs \
        "./fuzz_$t" "corpus_$t" "seeds/$t" "${args[@]}") >"$out/fuzz_$t.log" 2>&1 || rc=$?
    rm -f "$out"/fuzz-*.log   # the workers' logs: libFuzzer has copied each into this one
    execs=$(awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}' "$out/fuzz_$t.log")
    found=$(($(artifacts_new crash) + $(artifacts_new leak) + $(artifacts_new timeout) + $(artifacts_new oom)))
    slow=$(artifacts_new slow-unit)
    rm -f "$out/.start_$t"
    note=""
    [ "$slow" -gt 0 ] && note=", $slow inputs slower than 10 s in artifacts/"
    [ "$rc" -ne 0 ] && { status=1; note="$note, fuzzer exit status $rc"; }
    [ "$found" -gt 0 ] && status=1
    echo "fuzz $t: $execs executions, $found crashes$note ($(($(date +%s) - start)) s; log: $out/fuzz_$t.log)"
done
exit $status
