/* cgspn.h: the C ABI of libcgspn.so, the C-GSPN propagation (scan) forward and backward, and
 * GSPN-1's gate recurrence (ABI version 2).
 *
 * Build: `make lib` writes ./libcgspn.so (CPU always; CUDA too when nvcc was found).
 * Link:  cc app.c -I kernels -L . -lcgspn -Wl,-rpath,$PWD, or dlopen/ctypes
 *        (tools/cgspn_torch.py wraps both as torch.autograd.Functions).
 *
 * ---- Stability -------------------------------------------------------------------------------
 * The ABI is plain C: ints, raw pointers, no structs, no callbacks, no global state a caller
 * must set up or tear down. It is append-only: published functions keep their signature and
 * meaning and enum values keep their numbers; later versions only add functions and values.
 * cgspn_abi_version() returns the version the library implements; a caller built against
 * CGSPN_ABI_VERSION works with any library for which cgspn_abi_version() >= CGSPN_ABI_VERSION.
 *
 * ---- The math (docs/design.md#cgspn-layer steps 3-5) -----------------------------------------------------------
 * For each direction d in (TB, BT, LR, RL) = (0, 1, 2, 3), in the original frame:
 *   TB: h[i,j,c] = lam[i,j,c] xc[i,j,c] + sum_k w_k[i,j,c] h[i-1, j+k, c],  i = 0..H-1
 *   BT: the same reading h[i+1, j+k], i = H-1..0; LR reads h[i+k, j-1], j = 0..W-1;
 *   RL reads h[i+k, j+1], j = W-1..0.  Rows/columns outside the grid are 0 (h[-1] = 0).
 *   k in {-1, 0, +1}; a_k = sigmoid(wt_k); S = sum of a_k over the neighbours inside the grid;
 *   w_k = a_k / max(S, 1e-7) for those neighbours, 0 for the others.
 *   yc = sum_d merge[d] * u_d * h_d.
 *
 * ---- Layouts (all dense, row-major, no strides, no padding) ----------------------------------
 *   xc, yc, dyc, dxc  (B, H, W, Cc)   channels-last: element (b,i,j,c) at ((b*H + i)*W + j)*Cc + c
 *   gates, dgates     (B, H, W, G)    channels-last; the G gates of a token are 4 blocks, one per
 *                                     direction d = TB, BT, LR, RL, in that order:
 *     shared_w = 0:  G = 20*Cc, block d at d*5*Cc:
 *                    lam (Cc) | u (Cc) | wt_{-1} (Cc) | wt_{0} (Cc) | wt_{+1} (Cc)
 *     shared_w = 1:  G = 4*(2*Cc+3), block d at d*(2*Cc+3):
 *                    lam (Cc) | u (Cc) | wt_{-1} | wt_{0} | wt_{+1}   (3 scalars shared by
 *                    the Cc channels: the GSPN-2 compact-channel variant)
 *     The neighbour offset k runs along j for TB/BT and along i for LR/RL.
 *   merge, dmerge     (4)             m_d, in direction order
 *   hidden            (4, B, H, W, Cc) h_d for each direction, d-major
 *
 * ---- Element types (dtype) -------------------------------------------------------------------
 *   dtype             xc gates yc dyc dxc dgates    merge dmerge hidden
 *   CGSPN_DTYPE_F32   float                         float
 *   CGSPN_DTYPE_BF16  bfloat16 (uint16 bits)        float  (the "master" fp32 precision)
 *   CGSPN_DTYPE_F64   double                        double (CPU only: a reference for checks)
 *   On the CPU, bf16 is computed in fp32 and rounded to nearest-even on output.
 *
 * ---- Devices ---------------------------------------------------------------------------------
 *   CGSPN_DEVICE_CPU:  every pointer is host memory; stream is ignored (pass NULL).
 *                      Runs on the calling thread and an OpenMP team; returns when done.
 *   CGSPN_DEVICE_CUDA: every pointer is device memory (cudaMalloc or managed) of one GPU; the
 *                      library runs on that GPU whatever the calling thread's current device is,
 *                      and leaves the current device as it found it. stream is a cudaStream_t
 *                      cast to void* (NULL = the legacy default stream) on that GPU. The call is
 *                      asynchronous: it enqueues work on stream and returns; buffers must stay
 *                      valid until stream reaches that point, and errors of the kernels' execution
 *                      show up at the caller's next synchronization (the returned status covers
 *                      argument checks and launches). Available when the library was built with
 *                      CUDA and the op's kernel (`make lib` links the scan's and the gate
 *                      recurrence's; see cgspn_cuda_available).
 *
 * ---- Threads ---------------------------------------------------------------------------------
 * Every function is thread-safe and may be called concurrently from any number of threads on
 * different outputs (inputs may be shared). The scan's CUDA path takes, for the length of a call,
 * a context (side streams, events, a cuBLASLt handle, 32 MiB of workspace) from an internal pool
 * guarded by a mutex: one context per GPU and concurrent caller, kept until the process exits;
 * the gate recurrence's needs none.
 * cgspn_last_error() is per thread. Outputs must not alias inputs or each other.
 *
 * ---- Errors ----------------------------------------------------------------------------------
 * Functions return a cgspn_status. Every argument is checked, and all workspace allocated, before
 * any output is written, so a call that fails a check leaves every buffer as it was. The library
 * never exits or aborts the process: a CUDA runtime call of the ABI layer that fails returns
 * CGSPN_ERR_CUDA, and a failure inside the CUDA kernel or context code (a launch error, a check
 * of the kernel's own) returns CGSPN_ERR_BACKEND; outputs may then be partly written, and after
 * a sticky CUDA error the GPU context is unusable, as for any CUDA program.
 * cgspn_last_error() describes the calling thread's last failure in words.
 */
#ifndef CGSPN_H
#define CGSPN_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CGSPN_API __attribute__((visibility("default")))
#else
#define CGSPN_API
#endif

#define CGSPN_ABI_VERSION 2

enum cgspn_status {
    CGSPN_OK = 0,
    CGSPN_ERR_NULL_POINTER = 1,    /* a required pointer is NULL */
    CGSPN_ERR_BAD_SHAPE = 2,       /* B, H, W or Cc < 1, or the sizes overflow */
    CGSPN_ERR_BAD_DTYPE = 3,       /* dtype is not a cgspn_dtype */
    CGSPN_ERR_BAD_DEVICE = 4,      /* device is not a cgspn_device, or a pointer is not memory of
                                      that device (checked on CUDA only) */
    CGSPN_ERR_BAD_ARGUMENT = 5,    /* shared_w or grad_mode is not 0 or 1 */
    CGSPN_ERR_UNSUPPORTED = 6,     /* valid, but not available: fp64 on CUDA, CUDA in a build
                                      without it, or without the op's kernel, a gate recurrence
                                      plane of more than 2048 rows on CUDA */
    CGSPN_ERR_OUT_OF_MEMORY = 7,   /* host workspace could not be allocated */
    CGSPN_ERR_CUDA = 8,            /* a CUDA runtime call failed (no GPU, driver, launch) */
    CGSPN_ERR_BACKEND = 9          /* a backend kernel stopped with an error (see last_error) */
};

enum cgspn_dtype { CGSPN_DTYPE_F32 = 0, CGSPN_DTYPE_BF16 = 1, CGSPN_DTYPE_F64 = 2 };
enum cgspn_device { CGSPN_DEVICE_CPU = 0, CGSPN_DEVICE_CUDA = 1 };
/* How backward writes its gradients. */
enum cgspn_grad_mode {
    CGSPN_GRAD_OVERWRITE = 0,      /* dX = gradient (outputs need no initialization) */
    CGSPN_GRAD_ACCUMULATE = 1      /* dX += gradient (fan-out: the framework's own convention) */
};

/* CGSPN_ABI_VERSION of the library. */
CGSPN_API int cgspn_abi_version(void);

/* A constant English description of a status ("unknown status" for other values). */
CGSPN_API const char *cgspn_status_string(int status);

/* The calling thread's last failure, with the argument or call that caused it; "" when the
 * thread's last call succeeded. Valid until this thread's next call into the library. */
CGSPN_API const char *cgspn_last_error(void);

/* 1 when this library can run the scan on CUDA (built with CUDA, the scan kernel linked in, at
 * least one GPU visible), else 0. */
CGSPN_API int cgspn_cuda_available(void);

/* Forward. Reads xc, gates, merge; overwrites yc. hidden is optional: when non-NULL it receives
 * h_d (4, B, H, W, Cc) so that the backward need not recompute the scans; NULL skips it.
 *   device  cgspn_device;   stream  cudaStream_t for CUDA (NULL: default stream), else NULL
 *   dtype   cgspn_dtype;    B, H, W, Cc >= 1;   shared_w 0 (per channel) or 1 (shared weights)
 */
CGSPN_API int cgspn_gspn_scan_fwd(int device, void *stream, int dtype,
                                  int B, int H, int W, int Cc, int shared_w,
                                  const void *xc, const void *gates, const void *merge,
                                  void *yc, void *hidden);

/* Backward of sum(dyc * yc). Reads dyc, xc, gates, merge and hidden (optional: the forward's
 * hidden for the same xc, gates; NULL recomputes it) and writes the gradients asked for:
 * dxc (B,H,W,Cc), dgates (B,H,W,G), dmerge (4), each optional (NULL = not needed; with all three
 * NULL the call does nothing). grad_mode says whether they are overwritten or accumulated into.
 * dyc is required when any gradient is asked for.
 */
CGSPN_API int cgspn_gspn_scan_bwd(int device, void *stream, int dtype,
                                  int B, int H, int W, int Cc, int shared_w,
                                  const void *dyc, const void *xc, const void *gates,
                                  const void *merge, const void *hidden, int grad_mode,
                                  void *dxc, void *dgates, void *dmerge);

/* ---- GSPN-1's gate recurrence (ABI version 2) ------------------------------------------------
 * NVlabs/GSPN's GateRecurrent2dnoind, for GSPN-1 models: one scan, left to right along W, per
 * channel, in runs of items_each_chunk columns (the state restarts at each run's first column;
 * the last run may be shorter):
 *   out[h][w] = b[h][w] x[h][w] + g1[h][w] out[h-1][w-1] + g2[h][w] out[h][w-1] + g3[h][w] out[h+1][w-1]
 * with out outside the plane or left of the run's first column 0. The gates are used as given
 * (no sigmoid, no normalization). Every tensor is (N, C, H, W), dense, row-major.
 * items_each_chunk >= 1 (>= W: one run). dtype, device and stream as for the scan; bf16 is
 * computed in fp32 (the state is not rounded between columns) and rounded on output. On CUDA,
 * H <= 2048 (a block per plane, its threads holding the rows; CGSPN_ERR_UNSUPPORTED past that).
 * The backward is the gradient of this forward for every W (runs start at column 0 in both).
 */
CGSPN_API int cgspn_gate_recurrent_fwd(int device, void *stream, int dtype,
                                       int N, int C, int H, int W, int items_each_chunk,
                                       const void *x, const void *b, const void *g1,
                                       const void *g2, const void *g3, void *out);

/* Backward of sum(dout * out): reads dout, x, b, g1, g2, g3 and out (the forward's, for the same
 * inputs) and writes the gradients asked for (dx, db, dg1, dg2, dg3; NULL = not needed; all NULL:
 * nothing to do), overwritten or accumulated into as grad_mode says.
 */
CGSPN_API int cgspn_gate_recurrent_bwd(int device, void *stream, int dtype,
                                       int N, int C, int H, int W, int items_each_chunk,
                                       const void *dout, const void *x, const void *b,
                                       const void *g1, const void *g2, const void *g3,
                                       const void *out, int grad_mode,
                                       void *dx, void *db, void *dg1, void *dg2, void *dg3);

#ifdef __cplusplus
}
#endif
#endif /* CGSPN_H */
