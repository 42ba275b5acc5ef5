#include "targets.h"
#include "../kernels/error.h"

void labels_to_targets(const int *labels, int batch, int classes, float smoothing,
                       float *targets) {
    CG_CHECK(classes > 0 && smoothing >= 0.0f && smoothing <= 1.0f, "check label_smoothing",
             "label smoothing %g with %d classes", smoothing, classes);
    float off = smoothing / (float)classes;
    float on = 1.0f - smoothing + off;
    for (int b = 0; b < batch; b++) {
        CG_CHECK(labels[b] >= 0 && labels[b] < classes,
                 "the data set's labels must be 0..classes-1; check num_classes in the config",
                 "label %d of sample %d is outside 0..%d", labels[b], b, classes - 1);
        float *row = targets + (size_t)b * classes;
        for (int k = 0; k < classes; k++) row[k] = k == labels[b] ? on : off;
    }
}
