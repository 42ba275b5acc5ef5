// Seeds for fuzz_safetensors: small files written by the project's writer (st_write_err), so
// the fuzzer starts from headers as cgspn writes them (padding, tensor order, __metadata__).
//   seed_safetensors FOLDER      writes FOLDER/{tensors,scalar,empty}.safetensors
// Built and run by tools/fuzz.sh.
#include "../../nn/safetensors.h"
#include <stdint.h>
#include <stdio.h>

static int write_seed(const char *dir, const char *name, const StWriteTensor *t, int n,
                 const StMeta *meta, int n_meta) {
    char path[4096], err[2048];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    if (st_write_err(path, t, n, meta, n_meta, NULL, NULL, err, sizeof err) == 0) return 0;
    fprintf(stderr, "seed_safetensors: %s\n", err);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: seed_safetensors FOLDER\n");
        return 2;
    }
    // One tensor per dtype the reader converts to fp32, and some it only maps, so the seeds reach
    // every branch of st_read_f32_err; a 0-dim scalar and a zero-size tensor are legal too.
    static const float f32[6] = {1, -2, 0.5f, 3e-8f, 65504, -0.0f};
    static const uint16_t half[4] = {0x3c00, 0xc000, 0x0001, 0x7c00};   // fp16 / bf16 bits
    static const double f64[2] = {1.5, -1e300};
    static const int64_t i64[3] = {-1, 0, 1};
    static const uint8_t u8[5] = {0, 1, 2, 254, 255};
    const StWriteTensor t[] = {
        {"blocks.0.attn.qkv.weight", ST_F32, 2, {2, 3}, f32},
        {"blocks.0.norm.bias", ST_BF16, 1, {4}, half},
        {"head.weight", ST_F16, 2, {2, 2}, half},
        {"pos_embed", ST_F64, 3, {1, 1, 2}, f64},
        {"step", ST_I64, 1, {3}, i64},
        {"mask", ST_U8, 1, {5}, u8},
    };
    const StMeta meta[] = {{"format", "pt"}, {"cgspn_config", "model = \"vit\"\\n"}};
    const StWriteTensor scalar[] = {{"loss_scale", ST_F32, 0, {0}, f32}};
    const StWriteTensor empty[] = {{"none", ST_F32, 2, {0, 3}, f32}, {"one", ST_BOOL, 1, {1}, u8}};
    int bad = write_seed(argv[1], "tensors", t, (int)(sizeof t / sizeof t[0]), meta, 2);
    bad |= write_seed(argv[1], "scalar", scalar, 1, NULL, 0);
    bad |= write_seed(argv[1], "empty", empty, 2, meta, 1);
    return bad;
}
