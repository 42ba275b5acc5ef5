// CUDA: the C-GSPN scan with its gate projection (gspn_scan_proj_fwd, kernels/ops_list.h). Apart
// from the scan's own files, which libcgspn.so takes without the linear ops.
#include "gspn_scan_common.cuh"
#include "../gspn_scan_shape.h"

// gspn_scan_proj_fwd: on chip the gates are made from the staged xc (fwd_img with gw); elsewhere
// linear_fwd writes them into a buffer that the scan then reads.
extern "C" void cuda_gspn_scan_proj_fwd(Ctx *ctx, const Tensor *xc, const Tensor *gw, const Tensor *gb,
                                        const Tensor *merge, int shared_w, Tensor *yc) {
    using namespace gspn;
    const char *op = "gspn_scan_proj_fwd";
    Tensor gates = gspn_scan_proj_gates(op, xc, gw, gb, shared_w);
    CG_CHECK(yc, "", "op %s: yc is required", op);
    const void *ptrs[] = {xc->data, yc->data};   // gw and gb are read element by element
    const Plan p = make_plan(op, xc, &gates, merge, shared_w, TUNING_DEFAULT, false, ptrs, 2);
    check_like(op, "yc", yc, "xc", xc);
    if (p.plane == 0) return;
    CudaCtx *c = cuda_ctx_of(ctx);
    const int merge_bf16 = merge->dtype == DTYPE_BF16;
    if (p.bf16 && img_fits<__nv_bfloat16>(c, p, false, false, ptrs, 2)) {
        using T = __nv_bfloat16;
        fwd_img<T>(c, p, static_cast<const T *>(xc->data), nullptr, static_cast<const T *>(gw->data),
                   gb ? static_cast<const T *>(gb->data) : nullptr, merge->data, merge_bf16,
                   static_cast<T *>(yc->data), nullptr);
        return;
    }
    if (!p.bf16 && img_fits<float>(c, p, false, false, ptrs, 2)) {
        fwd_img<float>(c, p, tensor_f32(xc), nullptr, tensor_f32(gw), gb ? tensor_f32(gb) : nullptr, merge->data,
                       merge_bf16, tensor_f32(yc), nullptr);
        return;
    }
    gates.data = cuda_temp_alloc(ctx, gates.numel * dtype_size(gates.dtype));
    cuda_linear_fwd(ctx, xc, gw, gb, nullptr, &gates);
    gspn_fwd_impl(ctx, xc, &gates, merge, shared_w, yc, nullptr, TUNING_DEFAULT);
    cuda_temp_free(ctx, gates.data);
}
