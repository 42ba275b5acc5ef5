// Times the depthwise convolution ops on given shapes (bench/bench_dwconv.c lists gspn_t/s/b's);
// bench/cuda/kernel_bench.h.
#include "kernel_bench.h"
#include "bench_util.cuh"

int cuda_bench_dwconv(DwconvCase *cases, int n, double *copy_gbs, char *device, size_t device_n) {
    if (cuda_device_count() == 0) return 1;
    Ctx ctx = cuda_ctx_create(0, DTYPE_BF16);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, cuda_ctx_of(&ctx)->device));
    snprintf(device, device_n, "%s", prop.name);
    double copy_ms;
    *copy_gbs = bench_copy_gbs(&ctx, &copy_ms);
    for (int i = 0; i < n; i++) {
        DwconvCase *k = &cases[i];
        DType xt = k->x_f32 ? DTYPE_F32 : DTYPE_BF16;
        size_t rows = (size_t)k->B * k->H * k->W;
        Tensor x = bench_tensor(&ctx, rows, k->C, xt, 1, -1.0f, 1.0f);
        Tensor dy = bench_tensor(&ctx, rows, k->C, xt, 2, -1.0f, 1.0f);
        Tensor y = bench_tensor(&ctx, rows, k->C, xt, 3, 0.0f, 0.0f);
        Tensor dx = bench_tensor(&ctx, rows, k->C, xt, 4, 0.0f, 0.0f);
        Tensor w = bench_tensor(&ctx, (size_t)k->C, k->k * k->k, DTYPE_BF16, 5, -0.2f, 0.2f);
        Tensor b = bench_tensor(&ctx, (size_t)k->C, 0, DTYPE_BF16, 6, -0.2f, 0.2f);
        Tensor dw = bench_tensor(&ctx, (size_t)k->C, k->k * k->k, DTYPE_F32, 7, 0.0f, 0.0f);
        Tensor db = bench_tensor(&ctx, (size_t)k->C, 0, DTYPE_F32, 8, 0.0f, 0.0f);
        int shape[4] = {k->B, k->H, k->W, k->C};
        Tensor *act[] = {&x, &dy, &y, &dx};
        for (Tensor *t : act) tensor_set_shape(t, 4, shape);
        int wshape[4] = {k->C, 1, k->k, k->k};
        tensor_set_shape(&w, 4, wshape);
        tensor_set_shape(&dw, 4, wshape);
        // As the model runs them: the LPUs with the residual in both passes; dx written.
        const int flags = k->x_f32 ? DWCONV_RESIDUAL : 0;
        k->fwd_ms = bench_ms(&ctx, 20, [&] {
            cuda_dwconv_fwd(&ctx, &x, NULL, NULL, NULL, &w, k->bias ? &b : NULL, flags, NULL, &y);
        });
        k->bwd_ms = bench_ms(&ctx, 20, [&] {
            cuda_dwconv_bwd(&ctx, &dy, &x, &w, flags | DWCONV_WRITE_DX, &dx, &dw, k->bias ? &db : NULL);
        });
        Tensor *all[] = {&x, &dy, &y, &dx, &w, &b, &dw, &db};
        if (k->x_f32) {   // the up projection's u (2 channels), weight and bias; mid in dx
            Tensor u = bench_tensor(&ctx, rows, 2, DTYPE_BF16, 9, -1.0f, 1.0f);
            Tensor uw = bench_tensor(&ctx, (size_t)k->C, 2, DTYPE_BF16, 10, -0.2f, 0.2f);
            Tensor ub = bench_tensor(&ctx, (size_t)k->C, 0, DTYPE_BF16, 11, -0.2f, 0.2f);
            int ushape[4] = {k->B, k->H, k->W, 2};
            tensor_set_shape(&u, 4, ushape);
            k->added_ms = bench_ms(&ctx, 20, [&] {
                cuda_dwconv_fwd(&ctx, &x, &u, &uw, &ub, &w, &b, flags, NULL, &y);
            });
            k->added_mid_ms = bench_ms(&ctx, 20, [&] {
                cuda_dwconv_fwd(&ctx, &x, &u, &uw, &ub, &w, &b, flags, &dx, &y);
            });
            k->two_ops_ms = bench_ms(&ctx, 20, [&] {
                LinearFwdOpts onto_x = {};
                onto_x.res = &x;
                cuda_linear_fwd(&ctx, &u, &uw, &ub, &onto_x, &dx);
                cuda_dwconv_fwd(&ctx, &dx, NULL, NULL, NULL, &w, &b, flags, NULL, &y);
            });
            Tensor *more[] = {&u, &uw, &ub};
            for (Tensor *t : more) cuda_free(t->data);
        }
        for (Tensor *t : all) cuda_free(t->data);
    }
    cuda_ctx_destroy(&ctx);
    return 0;
}
