// The warp-level tensor-core product the hand-written kernels share (sm_80+): the depthwise
// convolutions' banded products (dwconv_mma.h), the stem's windows (conv2d_stem.cu) and the fused
// MLP (mlp_fused.cu); and ldmatrix, which loads fragments from shared memory.
#pragma once

// D (16 x 8, fp32) += A (16 x 16) B (16 x 8), bf16: one m16n8k16 MMA. a: this lane's four A
// fragment words (rows g, g + 8 at columns 2 t4; the same at 2 t4 + 8), b: its two B words (rows
// 2 t4 and 2 t4 + 8 of column g), g = lane / 4, t4 = lane % 4; the low half of a word is the lower
// column (A) or row (B). acc: rows g and g + 8 at columns 2 t4, 2 t4 + 1.
__device__ __forceinline__ void mma_16816_bf16(float (&acc)[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 (16 bytes, 16-byte aligned); r[m] is matrix m in the fragment layout above. For an A tile
// (16 x 16, row-major): lane -> row l % 16, column 8 (l / 16). For two B tiles stored as (n, k)
// rows: lane -> n row l % 8 + 8 (l / 16), k column 8 (l / 8 % 2); r[0], r[1] are the first n-tile's
// b words, r[2], r[3] the second's.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
