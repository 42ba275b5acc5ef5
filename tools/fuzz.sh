#!/usr/bin/env bash
# Fuzzes the shard reader / manifest parser and the image decoders with libFuzzer (clang,
# AddressSanitizer + UndefinedBehaviorSanitizer) for a bounded time each.
#   tools/fuzz.sh [SECONDS_PER_TARGET]     (default 60; FUZZ_JOBS=N runs N workers per target)
# Seeds: a small shard set and PNG/JPEG images made by ./cgspn (built first). Crashes are
# written to build/fuzz/crash-*; the summary line per target gives executions and crashes.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
jobs=${FUZZ_JOBS:-1}
out=build/fuzz
mkdir -p "$out"
command -v clang >/dev/null || { echo "fuzz: clang not found (apt-get install clang)"; exit 1; }
make -s cgspn
# Smaller decode limit in the fuzz build: keeps each input fast; the check itself is the same.
flags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -DIMAGE_MAX_PIXELS=(1ull<<22)"
libs="-lpng -lturbojpeg -lzstd -lz -lm -lpthread"
clang $flags tests/fuzz/fuzz_shard.c data/shard.c data/dataset.c data/shard_writer.c kernels/error.c \
      $libs -o "$out/fuzz_shard"
clang $flags tests/fuzz/fuzz_image.c data/image_decode.c kernels/error.c $libs -o "$out/fuzz_image"

# Seed corpora.
seeds=$out/seeds
rm -rf "$seeds" && mkdir -p "$seeds/shard" "$seeds/image" "$seeds/tmp"
./cgspn data synth "$seeds/tmp/jpg" --count 6 --classes 2 --height 40 --width 48 >/dev/null
./cgspn data synth "$seeds/tmp/png" --count 4 --classes 2 --height 24 --width 20 --png >/dev/null
./cgspn data build --from imagefolder "$seeds/tmp/jpg" --out "$seeds/tmp/shards" --size 16 \
    --shard-mb 1 --quiet >/dev/null
cp "$seeds"/tmp/shards/*.cgs "$seeds"/tmp/shards/*.manifest "$seeds/shard/"
find "$seeds/tmp/jpg" "$seeds/tmp/png" -type f -exec cp {} "$seeds/image/" \;

status=0
for t in shard image; do
    mkdir -p "$out/corpus_$t"
    log=$out/fuzz_$t.log
    # -rss_limit_mb: a decoder may legitimately allocate a limit-sized image per input.
    if ! "$out/fuzz_$t" "$out/corpus_$t" "$seeds/$t" -max_total_time="$secs" -jobs="$jobs" \
        -workers="$jobs" -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$out/crash-$t-" \
        -print_final_stats=1 >"$log" 2>&1; then
        status=1
    fi
    execs=$(cat "$log" fuzz-*.log 2>/dev/null | awk '/stat::number_of_executed_units/ {s += $2}
                                                     END {print s + 0}')
    rm -f fuzz-*.log
    crashes=$(find "$out" -name "crash-$t-*" | wc -l)
    echo "fuzz $t: $execs executions in ${secs}s, $crashes crash/leak/timeout artifacts (log: $log)"
done
rm -rf "$seeds/tmp"
exit $status
