// Classification targets: integer labels -> soft target rows for the cross-entropy op.
#pragma once

// timm label smoothing (timm.data.mixup.one_hot): with K classes,
//   off = smoothing / K,  on = 1 - smoothing + smoothing / K,
// so every row sums to 1. targets is (batch, classes); smoothing 0 gives one-hot rows.
void labels_to_targets(const int *labels, int batch, int classes, float smoothing,
                       float *targets);
