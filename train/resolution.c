// Student and teacher images of a Stage 2 step at their resolutions: see resolution.h.
#include "resolution.h"
#include "../kernels/ops.h"
#include "../kernels/error.h"
#include "../kernels/rng.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

// The random stream of the multires draws (rng_seed_stream's purpose), apart from the loader's.
enum { PURPOSE_MULTIRES = 0x3e5 };

int resolution_views_init_err(ResolutionViews *v, const Config *c, char *err, size_t n) {
    memset(v, 0, sizeof *v);
    v->img_size = c->img_size;
    v->seed = (uint64_t)c->seed;
    v->filter = strcmp(c->interpolation, "bicubic") == 0 ? RESIZE_BICUBIC : RESIZE_BILINEAR;
    int k = config_parse_int_list("multires", c->multires, v->multires, RESOLUTION_MAX, err, n);
    if (k < 0) return -1;
    v->n_multires = k;
    int largest = 0;
    for (int i = 0; i < k; i++) {
        if (v->multires[i] <= 0 || v->multires[i] % c->patch != 0)
            return cg_set_error(err, n, "multires = %s: %d is not a positive multiple of patch %d",
                                c->multires, v->multires[i], c->patch);
        if (v->multires[i] > largest) largest = v->multires[i];
    }
    if (k > 0 && largest != c->img_size)
        return cg_set_error(err, n, "multires = %s with img_size = %d: the loader reads images at "
                            "img_size, which must be the largest side\n  hint: set img_size = %d",
                            c->multires, c->img_size, largest);
    v->n_scratch = omp_get_max_threads();
    v->scratch = cg_calloc((size_t)v->n_scratch, sizeof(ResizeScratch));
    return 0;
}

void resolution_views_free(ResolutionViews *v) {
    for (int i = 0; i < v->n_scratch; i++) resize_scratch_free(&v->scratch[i]);
    free(v->scratch);
    free(v->host);
    memset(v, 0, sizeof *v);
}

int resolution_student_side(const ResolutionViews *v, long step) {
    if (v->n_multires == 0) return v->img_size;
    Rng r;
    rng_seed_stream(&r, v->seed, PURPOSE_MULTIRES, (uint64_t)step);
    return v->multires[rng_below(&r, (uint32_t)v->n_multires)];
}

void resolution_resize_batch(ResolutionViews *v, const float *images, int B, int C, int h, int w,
                             float *out, int h2, int w2) {
    int planes = B * C;
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < planes; p++) {
        int tid = omp_get_thread_num();
        CG_CHECK(tid < v->n_scratch, "", "resolution views: thread %d of %d scratch buffers", tid,
                 v->n_scratch);
        resize_f32(images + (size_t)p * h * w, h, w, out + (size_t)p * h2 * w2, h2, w2, v->filter,
                   &v->scratch[tid]);
    }
}

ChannelAffine channel_affine_renormalize(const float *mean_s, const float *std_s, const float *mean_t,
                                         const float *std_t, int channels) {
    ChannelAffine a = {{1, 1, 1}, {0, 0, 0}};
    for (int c = 0; c < channels && c < 3; c++) {
        a.scale[c] = std_s[c] / std_t[c];
        a.shift[c] = (mean_s[c] - mean_t[c]) / std_t[c];
    }
    return a;
}

Tensor *resolution_view(ResolutionViews *v, Tape *t, const Batch *b, int side,
                        const ChannelAffine *affine, Tensor **loader_img) {
    if (side == b->height && side == b->width && !affine) {
        if (!*loader_img) {
            *loader_img = tape_tensor(t, 4, (int[]){b->count, b->channels, b->height, b->width}, true);
            tensor_upload(t->ctx, *loader_img, b->images);
        }
        return *loader_img;
    }
    size_t plane = (size_t)side * side, need = (size_t)b->count * b->channels * plane;
    if (need > v->host_cap) {
        free(v->host);
        v->host = cg_malloc(need * sizeof(float));
        v->host_cap = need;
    }
    if (side == b->height && side == b->width)
        memcpy(v->host, b->images, need * sizeof(float));
    else
        resolution_resize_batch(v, b->images, b->count, b->channels, b->height, b->width, v->host,
                                side, side);
    if (affine) {
        CG_CHECK(b->channels <= 3, "", "a renormalized view of %d-channel images (at most 3)",
                 b->channels);
        int planes = b->count * b->channels;
        #pragma omp parallel for schedule(static)
        for (int p = 0; p < planes; p++) {
            int c = p % b->channels;
            float *x = v->host + (size_t)p * plane;
            for (size_t i = 0; i < plane; i++) x[i] = x[i] * affine->scale[c] + affine->shift[c];
        }
    }
    Tensor *x = tape_tensor(t, 4, (int[]){b->count, b->channels, side, side}, true);
    tensor_upload(t->ctx, x, v->host);   // synchronous: v->host is free again on return
    return x;
}
