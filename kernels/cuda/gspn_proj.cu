// CUDA: the C-GSPN scan with its gate projection (gspn_scan_proj_fwd, kernels/ops_list.h). Apart
// from the scan's own files, which libcgspn.so takes without the linear ops.
#include "gspn_scan_common.cuh"
#include "../gspn_scan_shape.h"

namespace {
// The on-chip kernels with the gates made from the staged xc, where they take the call.
template <typename T>
bool proj_on_chip(CudaCtx *c, const gspn::Plan &p, const Tensor *xc, const Tensor *gw, const Tensor *gb,
                  const Tensor *merge, Tensor *yc, const void *const *ptrs, int nptrs) {
    if (!gspn::img_fits<T>(c, p, false, false, ptrs, nptrs)) return false;
    gspn::fwd_img<T>(c, p, static_cast<const T *>(xc->data), nullptr, static_cast<const T *>(gw->data),
                     gb ? static_cast<const T *>(gb->data) : nullptr, merge->data, merge->dtype == DTYPE_BF16,
                     static_cast<T *>(yc->data), nullptr);
    return true;
}
}  // namespace

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
    if (p.bf16 ? proj_on_chip<__nv_bfloat16>(c, p, xc, gw, gb, merge, yc, ptrs, 2)
               : proj_on_chip<float>(c, p, xc, gw, gb, merge, yc, ptrs, 2))
        return;
    gates.data = cuda_temp_alloc(ctx, gates.numel * dtype_size(gates.dtype));
    cuda_linear_fwd(ctx, xc, gw, gb, nullptr, &gates);
    gspn_fwd_impl(ctx, xc, &gates, merge, shared_w, yc, nullptr, TUNING_DEFAULT);
    cuda_temp_free(ctx, gates.data);
}
