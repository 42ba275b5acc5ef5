// libFuzzer target: PNG (libpng) and JPEG (TurboJPEG) decoding through image_decode, to gray
// and RGB, at full size and with DCT scaling. Built and run by tools/fuzz.sh.
#include "../../data/image.h"
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    Image im;
    int warn;
    int channels = size & 1 ? 1 : 3, min_side = size & 2 ? 24 : 0;
    if (image_decode(data, size, "fuzz", channels, min_side, &im, &warn, err, sizeof err) == 0)
        image_free(&im);
    return 0;
}
