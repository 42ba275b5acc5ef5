// The C-GSPN scan with its gate projection (gspn_scan_proj_fwd, kernels/ops_list.h) on the CPU:
// the two ops through a buffer of the gates, the reference the fused backends are held to. Apart
// from kernels/cpu/gspn_scan.c, which libcgspn.so takes without the linear ops.
#include <stdlib.h>
#include "../ops.h"
#include "../error.h"
#include "../gspn_scan_shape.h"

void cpu_gspn_scan_proj_fwd(Ctx *ctx, const Tensor *xc, const Tensor *gw, const Tensor *gb,
                            const Tensor *merge, int shared_w, Tensor *yc) {
    Tensor gates = gspn_scan_proj_gates("gspn_scan_proj_fwd", xc, gw, gb, shared_w);
    gates.data = cg_malloc(gates.numel * sizeof(float));
    cpu_linear_fwd(ctx, xc, gw, gb, NULL, &gates);
    cpu_gspn_scan_fwd(ctx, xc, &gates, merge, shared_w, yc, NULL);
    free(gates.data);
}
