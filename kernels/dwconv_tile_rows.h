// The tiles of rows the LPU's 3x3 backward stages on the GPU (kernels/cuda/dwconv_plane.cu), shared
// with the CPU tests (tests/test_dwconv_tiles.c), which check the plan on every layout a block may
// meet, a staging buffer that held another tile before included. The tile of an image of h rows
// that starts at output row y0 (th rows, the last tile fewer) stages image rows y0 - p .. y0 + th
// + p - 1 at staged rows 0 .. th + 2p - 1: the rows inside the image are copied, the rest written
// as zeros (where a buffer holds tiles of several kinds in turn).
#pragma once

#ifdef __CUDACC__
#define DW_TILE_HD __host__ __device__ __forceinline__
#else
#define DW_TILE_HD static inline
#endif

typedef struct DwTileRows {
    int r0, r1;        // the image rows copied: r0 .. r1 - 1
    int dst;           // the staged row of image row r0
    int top, bottom;   // the zero rows: staged rows 0 .. top - 1 and th + 2p - bottom .. th + 2p - 1
} DwTileRows;

DW_TILE_HD DwTileRows dw_tile_rows(int y0, int th, int p, int h) {
    DwTileRows t;
    t.r0 = y0 - p > 0 ? y0 - p : 0;
    t.r1 = y0 + th + p < h ? y0 + th + p : h;
    t.dst = t.r0 - (y0 - p);
    t.top = t.dst;
    t.bottom = y0 + th + p - t.r1;
    return t;
}

// The staged row of zero row z (0 .. top + bottom - 1): the rows above, then the rows below.
DW_TILE_HD int dw_tile_zero_row(DwTileRows t, int th, int p, int z) {
    return z < t.top ? z : th + 2 * p - t.bottom + z - t.top;
}
