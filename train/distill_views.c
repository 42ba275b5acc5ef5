// The images of a Stage 2 step for the student and each teacher (train/distill.h): one loader
// batch, each teacher's view at its side and in its input normalization.
#include "distill.h"
#include "../kernels/error.h"

void distill_set_normalization(Distiller *d, const float *mean, const float *std) {
    for (int k = 0; k < d->n_teachers; k++) {
        DistillTeacher *dt = &d->teachers[k];
        if (dt->have_norm)
            dt->affine = channel_affine_renormalize(mean, std, dt->mean, dt->std,
                                                    dt->teacher.enc.cfg.in_chans);
    }
}

void distill_views(Distiller *d, ResolutionViews *v, Tape *t, const Batch *b, int side,
                   Tensor **student, Tensor **teachers) {
    CG_CHECK(b->height == v->img_size && b->width == v->img_size, "",
             "distill views: a batch of %dx%d images, img_size is %d", b->height, b->width,
             v->img_size);
    Tensor *loader_img = NULL;
    *student = resolution_view(v, t, b, side, NULL, &loader_img);
    for (int k = 0; k < d->n_teachers; k++) {
        const DistillTeacher *dt = &d->teachers[k];
        teachers[k] = resolution_view(v, t, b, dt->side, dt->have_norm ? &dt->affine : NULL,
                                      &loader_img);
    }
}
