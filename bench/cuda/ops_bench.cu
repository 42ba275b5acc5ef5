// Bandwidth of the memory-bound CUDA ops at training sizes (so14 width, 1036 px: 32 x 74 x 74
// tokens of 1152 channels; AdamW over 400M parameters), as GB/s of the bytes each op must move,
// against a device-to-device cudaMemcpy timed in the same run (bytes read + written).
#include <time.h>
#include "../../kernels/cuda/cuda_elem.cuh"
#include "kernel_bench.h"
#include "bench_util.cuh"

enum { BENCH_LN_ROWS = 32 * 74 * 74, BENCH_LN_C = 1152 };
#define BENCH_ADAMW_PARAMS 400000000ull

static void bench_line(FILE *out, const char *what, double ms, double bytes, double copy_gbs) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    fprintf(out, "  %-50s %8.3f ms %8.0f GB/s %6.1f%% of copy\n", what, ms, gbs,
            copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0);
}

int cuda_bench_ops(FILE *out) {
    if (cuda_device_count() == 0) {
        fprintf(out, "bench ops: no CUDA device visible\n");
        return 1;
    }
    Ctx ctx = cuda_ctx_create(0, DTYPE_BF16);
    CudaCtx *c = cuda_ctx_of(&ctx);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, c->device));
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    fprintf(out, "cgspn bench ops: %s (%d SMs), %s; GB/s = bytes the op must move / time\n",
            prop.name, prop.multiProcessorCount, date);

    double copy_ms, copy_gbs = bench_copy_gbs(&ctx, &copy_ms);
    bench_line(out, "cudaMemcpy D2D 1 GiB (reference)", copy_ms, 2.0 * BENCH_COPY_BYTES, copy_gbs);

    // LayerNorm at (32*74*74, 1152) bf16.
    {
        size_t N = BENCH_LN_ROWS;
        int C = BENCH_LN_C;
        Tensor x = bench_tensor(&ctx, N, C, DTYPE_BF16, 1, -2.0f, 2.0f);
        Tensor y = bench_tensor(&ctx, N, C, DTYPE_BF16, 2, 0.0f, 0.0f);
        Tensor dy = bench_tensor(&ctx, N, C, DTYPE_BF16, 3, -1.0f, 1.0f);
        Tensor dx = bench_tensor(&ctx, N, C, DTYPE_BF16, 4, 0.0f, 0.0f);
        Tensor w = bench_tensor(&ctx, C, 0, DTYPE_BF16, 5, 0.5f, 1.5f);
        Tensor b = bench_tensor(&ctx, C, 0, DTYPE_BF16, 6, -0.5f, 0.5f);
        Tensor mean = bench_tensor(&ctx, N, 0, DTYPE_F32, 7, 0.0f, 0.0f);
        Tensor rstd = bench_tensor(&ctx, N, 0, DTYPE_F32, 8, 0.0f, 0.0f);
        Tensor dw = bench_tensor(&ctx, C, 0, DTYPE_F32, 9, 0.0f, 0.0f);
        Tensor db = bench_tensor(&ctx, C, 0, DTYPE_F32, 10, 0.0f, 0.0f);
        double act = (double)N * C * 2, stats = (double)N * 8;
        char what[96];
        double ms = bench_ms(&ctx, 20, [&] { cuda_layernorm_fwd(&ctx, &x, &w, &b, 1e-6f, &y, &mean, &rstd); });
        snprintf(what, sizeof what, "layernorm_fwd bf16 (%zu, %d)", N, C);
        bench_line(out, what, ms, 2 * act + stats, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] { cuda_layernorm_bwd(&ctx, &dy, &x, &w, &mean, &rstd, &dx, &dw, &db, NULL, NULL); });
        snprintf(what, sizeof what, "layernorm_bwd bf16 (%zu, %d) dx += , dw, db", N, C);
        bench_line(out, what, ms, 4 * act + stats, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] { cuda_layernorm_bwd(&ctx, &dy, &x, &w, &mean, &rstd, &dx, NULL, NULL, NULL, NULL); });
        snprintf(what, sizeof what, "layernorm_bwd bf16 (%zu, %d) dx only", N, C);
        bench_line(out, what, ms, 4 * act + stats, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] { cuda_layer_scale_bwd(&ctx, &dy, &x, &w, &dx, &dw); });
        snprintf(what, sizeof what, "layer_scale_bwd bf16 (%zu, %d) dx += , dg", N, C);
        bench_line(out, what, ms, 4 * act, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] { cuda_softmax_fwd(&ctx, &x, &y); });
        snprintf(what, sizeof what, "softmax_fwd bf16 (%zu, %d)", N, C);
        bench_line(out, what, ms, 2 * act, copy_gbs);
        {
            // the curriculum's 2x: (32, 37, 37, C) <-> (32, 74, 74, C); dy is y's storage
            Tensor small = x, big = dy;
            int sshape[4] = {32, 37, 37, C}, bshape[4] = {32, 74, 74, C};
            tensor_set_shape(&small, 4, sshape);
            tensor_set_shape(&big, 4, bshape);
            double bytes_small = (double)small.numel * 2, bytes_big = (double)big.numel * 2;
            ms = bench_ms(&ctx, 20, [&] { cuda_resize_bilinear_fwd(&ctx, &small, &big); });
            bench_line(out, "resize_bilinear_fwd bf16 37x37 -> 74x74, B=32, C=1152", ms,
                       bytes_small + bytes_big, copy_gbs);
            Tensor dsmall = dx;
            tensor_set_shape(&dsmall, 4, sshape);
            ms = bench_ms(&ctx, 20, [&] { cuda_resize_bilinear_bwd(&ctx, &big, &dsmall); });
            bench_line(out, "resize_bilinear_bwd bf16 74x74 -> 37x37 (gather)", ms,
                       bytes_big + 2 * bytes_small, copy_gbs);
        }
        ms = bench_ms(&ctx, 20, [&] { cuda_gelu_fwd(&ctx, &x, GELU_TANH, &y); });
        snprintf(what, sizeof what, "gelu_fwd tanh bf16 (%zu, %d)", N, C);
        bench_line(out, what, ms, 2 * act, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] { cuda_accumulate(&ctx, &dy, &dx); });
        snprintf(what, sizeof what, "accumulate bf16 (%zu, %d)", N, C);
        bench_line(out, what, ms, 3 * act, copy_gbs);
        Tensor *all[] = {&x, &y, &dy, &dx, &w, &b, &mean, &rstd, &dw, &db};
        for (Tensor *t : all) cuda_free(t->data);
    }

    // The encoders' residual stream at the same size: fp32 x (the stream), bf16 sublayer input
    // and branch; the C-GSPN latent's LayerNorm (Cc = 64) over the same tokens.
    {
        size_t N = BENCH_LN_ROWS;
        int C = BENCH_LN_C, Cc = 64;
        Tensor x = bench_tensor(&ctx, N, C, DTYPE_F32, 21, -2.0f, 2.0f);
        Tensor r = bench_tensor(&ctx, N, C, DTYPE_BF16, 22, -1.0f, 1.0f);
        Tensor h = bench_tensor(&ctx, N, C, DTYPE_F32, 23, 0.0f, 0.0f);
        Tensor y = bench_tensor(&ctx, N, C, DTYPE_BF16, 24, 0.0f, 0.0f);
        Tensor dy = bench_tensor(&ctx, N, C, DTYPE_BF16, 25, -1.0f, 1.0f);
        Tensor dx = bench_tensor(&ctx, N, C, DTYPE_F32, 26, -1.0f, 1.0f);
        Tensor act = bench_tensor(&ctx, N, C, DTYPE_BF16, 27, 0.0f, 0.0f);
        Tensor w = bench_tensor(&ctx, C, 0, DTYPE_BF16, 28, 0.5f, 1.5f);
        Tensor b = bench_tensor(&ctx, C, 0, DTYPE_BF16, 29, -0.5f, 0.5f);
        Tensor mean = bench_tensor(&ctx, N, 0, DTYPE_F32, 30, 0.0f, 0.0f);
        Tensor rstd = bench_tensor(&ctx, N, 0, DTYPE_F32, 31, 0.0f, 0.0f);
        Tensor dw = bench_tensor(&ctx, C, 0, DTYPE_F32, 32, 0.0f, 0.0f);
        Tensor db = bench_tensor(&ctx, C, 0, DTYPE_F32, 33, 0.0f, 0.0f);
        Tensor dsum = bench_tensor(&ctx, C, 0, DTYPE_F32, 34, 0.0f, 0.0f);
        double f32 = (double)N * C * 4, b16 = (double)N * C * 2, stats = (double)N * 8;
        char what[96];
        double ms = bench_ms(&ctx, 20, [&] { cuda_layernorm_fwd(&ctx, &x, &w, &b, 1e-6f, &y, &mean, &rstd); });
        snprintf(what, sizeof what, "layernorm_fwd fp32 -> bf16 (%zu, %d)", N, C);
        bench_line(out, what, ms, f32 + b16 + stats, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] {
            cuda_add_layernorm_fwd(&ctx, &x, &r, &w, &b, 1e-6f, &h, &y, &mean, &rstd);
        });
        snprintf(what, sizeof what, "add_layernorm_fwd fp32 + bf16 (%zu, %d)", N, C);
        bench_line(out, what, ms, 2 * f32 + 2 * b16 + stats, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] {
            cuda_layernorm_bwd(&ctx, &dy, &x, &w, &mean, &rstd, &dx, &dw, &db, NULL, NULL);
        });
        snprintf(what, sizeof what, "layernorm_bwd fp32 x (%zu, %d) dx += , dw, db", N, C);
        bench_line(out, what, ms, 3 * f32 + b16 + stats, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] {
            cuda_layernorm_bwd(&ctx, &dy, &x, &w, &mean, &rstd, &dx, &dw, &db, &act, &dsum);
        });
        snprintf(what, sizeof what, "layernorm_bwd fp32 x, hand-off (bf16 dx, its sums)");
        bench_line(out, what, ms, 3 * f32 + 2 * b16 + stats, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] { cuda_cast_colsum(&ctx, &x, &act, &dsum); });
        snprintf(what, sizeof what, "cast_colsum fp32 -> bf16 (%zu, %d)", N, C);
        bench_line(out, what, ms, f32 + b16, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] { cuda_add_bcast_bwd(&ctx, &act, NULL, &dsum); });
        snprintf(what, sizeof what, "column sums bf16 (%zu, %d) (a bias gradient)", N, C);
        bench_line(out, what, ms, b16, copy_gbs);

        size_t Nc = N * 4;   // the 2058 px grid's tokens, about
        Tensor xc = bench_tensor(&ctx, Nc, Cc, DTYPE_BF16, 35, -2.0f, 2.0f), yc = xc, dyc = xc, dxc = xc;
        yc.data = cuda_malloc(tensor_bytes(&xc));
        dyc.data = cuda_malloc(tensor_bytes(&xc));
        dxc.data = cuda_malloc(tensor_bytes(&xc));
        CUDA_CHECK(cudaMemsetAsync(dyc.data, 0, tensor_bytes(&xc), c->stream));
        CUDA_CHECK(cudaMemsetAsync(dxc.data, 0, tensor_bytes(&xc), c->stream));
        Tensor wc = w, bc = b, meanc = bench_tensor(&ctx, Nc, 0, DTYPE_F32, 36, 0.0f, 0.0f), rstdc = meanc;
        rstdc.data = cuda_malloc(tensor_bytes(&meanc));
        tensor_set_shape(&wc, 1, &Cc);
        tensor_set_shape(&bc, 1, &Cc);
        Tensor dwc = dw, dbc = db;
        tensor_set_shape(&dwc, 1, &Cc);
        tensor_set_shape(&dbc, 1, &Cc);
        double lat = (double)Nc * Cc * 2, statc = (double)Nc * 8;
        ms = bench_ms(&ctx, 20, [&] { cuda_layernorm_fwd(&ctx, &xc, &wc, &bc, 1e-6f, &yc, &meanc, &rstdc); });
        snprintf(what, sizeof what, "layernorm_fwd bf16 (%zu, %d) (short rows)", Nc, Cc);
        bench_line(out, what, ms, 2 * lat + statc, copy_gbs);
        ms = bench_ms(&ctx, 20, [&] {
            cuda_layernorm_bwd(&ctx, &dyc, &xc, &wc, &meanc, &rstdc, &dxc, &dwc, &dbc, NULL, NULL);
        });
        snprintf(what, sizeof what, "layernorm_bwd bf16 (%zu, %d) dx += , dw, db", Nc, Cc);
        bench_line(out, what, ms, 4 * lat + statc, copy_gbs);
        Tensor *all[] = {&x, &r, &h, &y, &dy, &dx, &act, &w, &b, &mean, &rstd, &dw, &db, &dsum,
                         &xc, &yc, &dyc, &dxc, &meanc, &rstdc};
        for (Tensor *t : all) cuda_free(t->data);
    }

    // AdamW over 400M parameters: bf16 param + fp32 master, and fp32 param alone.
    {
        size_t n = BENCH_ADAMW_PARAMS;
        Tensor param = bench_tensor(&ctx, n, 0, DTYPE_BF16, 11, -0.1f, 0.1f);
        Tensor master = bench_tensor(&ctx, n, 0, DTYPE_F32, 12, -0.1f, 0.1f);
        Tensor grad = bench_tensor(&ctx, n, 0, DTYPE_F32, 13, -1e-3f, 1e-3f);
        Tensor m = bench_tensor(&ctx, n, 0, DTYPE_F32, 14, -1e-4f, 1e-4f);
        Tensor v = bench_tensor(&ctx, n, 0, DTYPE_F32, 15, 0.0f, 1e-6f);
        AdamWArgs a = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f,
                       .grad_scale = 1.0f, .step = 10};
        double ms = bench_ms(&ctx, 10, [&] { cuda_adamw(&ctx, &param, &master, &grad, &m, &v, &a); });
        bench_line(out, "adamw 400M bf16 param + fp32 master (30 B/param)", ms, 30.0 * n, copy_gbs);
        ms = bench_ms(&ctx, 10, [&] { cuda_adamw(&ctx, &master, NULL, &grad, &m, &v, &a); });
        bench_line(out, "adamw 400M fp32 param (28 B/param)", ms, 28.0 * n, copy_gbs);
        Tensor ss = bench_tensor(&ctx, 1, 0, DTYPE_F32, 16, 0.0f, 0.0f);
        ms = bench_ms(&ctx, 10, [&] { cuda_sumsq(&ctx, &grad, &ss); });
        bench_line(out, "sumsq 400M fp32", ms, 4.0 * n, copy_gbs);
        Tensor *all[] = {&param, &master, &grad, &m, &v, &ss};
        for (Tensor *t : all) cuda_free(t->data);
    }
    cuda_ctx_destroy(&ctx);
    return 0;
}
