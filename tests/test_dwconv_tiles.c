// The tiles of rows the LPU's 3x3 backward stages on the GPU (kernels/dwconv_tile_rows.h), checked
// on the host: a model of the kernel's blocks (each takes items blockIdx.y, + gridDim.y, ...
// through two staging buffers in turn, an item a tile of one image) writes each buffer's rows as
// the plan says, and every staged row a tile's sweep reads must then hold its image row or a zero.
// Every layout of up to 40 rows, every tile height, halos of 1 to 3 rows, 1 to 3 images and 1 to
// 5 blocks; and a planted plan one row short above its first tile must be caught.
#include "testlib.h"
#include "../kernels/dwconv_tile_rows.h"

enum { MAX_H = 40, MAX_P = 3, MAX_B = 3, MAX_GRID = 5, MAX_STAGED = MAX_H + 2 * MAX_P };
enum { ZERO_ROW = -1 };   // a staged row's label: ZERO_ROW, or image * MAX_H + row

typedef DwTileRows (*TilePlan)(int y0, int th, int p, int h);

// The plan with its zero rows above one row short at the first tile.
static DwTileRows planted_short_top(int y0, int th, int p, int h) {
    DwTileRows t = dw_tile_rows(y0, th, p, h);
    if (t.top > 0) t.top--;
    return t;
}

// The first read that holds the wrong row over the model's blocks, or 0; *what says where.
static int first_wrong_read(TilePlan plan, int h, int th, int p, int images, int grid, char *what, size_t n) {
    const int tiles = (h + th - 1) / th, items = images * tiles, staged = th + 2 * p;
    for (int block = 0; block < grid; block++) {
        int buf[2][MAX_STAGED];
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < staged; s++) buf[k][s] = ZERO_ROW;   // the kernel zeroes both once
        int k = 0;
        for (int it = block; it < items; it += grid, k ^= 1) {
            const int b = it / tiles, y0 = (it - b * tiles) * th;
            const DwTileRows t = plan(y0, th, p, h);
            for (int r = t.r0; r < t.r1; r++) buf[k][t.dst + r - t.r0] = b * MAX_H + r;
            if (tiles > 1)   // one tile an image: the zero rows stay from the start
                for (int z = 0; z < t.top + t.bottom; z++) buf[k][dw_tile_zero_row(t, th, p, z)] = ZERO_ROW;
            const int rows = h - y0 < th ? h - y0 : th;
            for (int s = 0; s < rows + 2 * p; s++) {   // the sweep's windows: staged rows 0 .. rows + 2p - 1
                const int r = y0 - p + s, want = r >= 0 && r < h ? b * MAX_H + r : ZERO_ROW;
                if (buf[k][s] != want) {
                    snprintf(what, n, "h %d th %d p %d images %d blocks %d: item %d staged row %d holds %d, not %d",
                             h, th, p, images, grid, it, s, buf[k][s], want);
                    return 1;
                }
            }
        }
    }
    return 0;
}

static void test_every_layout_reads_its_rows_or_zeros(void **state) {
    (void)state;
    char what[256];
    int layouts = 0;
    for (int h = 1; h <= MAX_H; h++)
        for (int th = 1; th <= h; th++)
            for (int p = 1; p <= MAX_P; p++) {
                const DwTileRows first = dw_tile_rows(0, th, p, h);
                // copied and zero rows fill the staged rows exactly
                assert_int_equal(first.r1 - first.r0 + first.top + first.bottom, th + 2 * p);
                for (int images = 1; images <= MAX_B; images++)
                    for (int grid = 1; grid <= MAX_GRID; grid++, layouts++)
                        if (first_wrong_read(dw_tile_rows, h, th, p, images, grid, what, sizeof what)) fail_msg("%s", what);
            }
    assert_int_equal(layouts, MAX_H * (MAX_H + 1) / 2 * MAX_P * MAX_B * MAX_GRID);
}

static void test_a_plan_one_row_short_above_is_caught(void **state) {
    (void)state;
    char what[256] = "";
    // 23 rows in tiles of 8 over 3 images and 2 blocks: a block's buffer holds a last tile, then a
    // first one, whose staged row 0 must be a zero again
    assert_int_equal(first_wrong_read(planted_short_top, 23, 8, 1, 3, 2, what, sizeof what), 1);
    assert_contains(what, "staged row 0 holds");
    // one tile an image never rewrites its zero rows, and needs not
    assert_int_equal(first_wrong_read(planted_short_top, 14, 14, 1, 3, 2, what, sizeof what), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_layout_reads_its_rows_or_zeros),
        cmocka_unit_test(test_a_plan_one_row_short_above_is_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
