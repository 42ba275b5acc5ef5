// `make bench-gspn`: runs cuda_bench_gspn until `cgspn bench gspn` calls it. With arguments,
// one configuration: bench_gspn B H W Cc shared cg vec stages prefetch dirs reps (reps 0: run
// once, untimed, e.g. under ncu).
#include <stdlib.h>
#include "../kernels/cuda/gspn_bench.h"

int main(int argc, char **argv) {
    if (argc == 12) {
        int v[11];
        for (int i = 0; i < 11; i++) v[i] = atoi(argv[i + 1]);
        return cuda_bench_gspn_config(stdout, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8],
                                      v[9], v[10]);
    }
    return cuda_bench_gspn(stdout);
}
