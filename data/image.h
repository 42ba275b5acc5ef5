// Image files in and out: PNG through libpng, JPEG through libjpeg-turbo's TurboJPEG API.
// Pixels are uint8, row-major HWC, 1 (gray) or 3 (RGB) channels.
//
// Decoding handles PNG gray/gray+alpha/RGB/RGBA/palette at 1..16 bits, interlaced, and JPEG
// gray/YCbCr/CMYK, baseline or progressive. Alpha is dropped (like PIL's convert("RGB")),
// 16-bit samples are rounded to 8 bits (round(v * 255 / 65535)), RGB -> gray uses PIL's
// "L" weights (0.299, 0.587, 0.114), gray -> RGB replicates. Files are recognized by their
// first bytes, not their names. Functions return 0, or -1 with a message naming the file.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define IMAGE_MAX_SIDE   65535           // wider or taller is a corrupt or hostile header
#ifndef IMAGE_MAX_PIXELS                 // (the fuzz build lowers it)
#define IMAGE_MAX_PIXELS (1ull << 26)    // 67 Mpixel (192 MiB as RGB, per decoding thread)
#endif

typedef struct Image {
    uint8_t *pixels;   // (height, width, channels), malloc'd
    int height, width, channels;
} Image;

typedef enum { IMAGE_UNKNOWN, IMAGE_PNG, IMAGE_JPEG } ImageFormat;
ImageFormat image_format(const uint8_t *data, size_t size);

// Decodes size bytes at data (named name in messages) to `channels` (1 or 3) channels.
// min_side > 0 lets a JPEG decode at a reduced DCT scale (1/2, 1/4, 1/8, ...) whose shorter
// side is still >= min_side (the builder resizes to that side anyway); 0 = full size.
// *warning (may be NULL) is set to 1 when the decoder recovered from damaged data.
int  image_decode(const uint8_t *data, size_t size, const char *name, int channels,
                  int min_side, Image *out, int *warning, char *err, size_t n);
// Reads path and decodes it (image_decode).
int  image_read_file(const char *path, int channels, int min_side, Image *out, int *warning,
                     char *err, size_t n);
void image_free(Image *im);

// Writes a PNG (8-bit gray or RGB) to path. Returns 0 or -1 (err).
int  image_write_png(const char *path, const uint8_t *pixels, int height, int width,
                     int channels, char *err, size_t n);
// Encodes a JPEG of the given quality (1..100, 4:4:4 at 100, else 4:2:0) into *out
// (tjFree it with image_free_jpeg). Returns 0 or -1 (err).
int  image_encode_jpeg(const uint8_t *pixels, int height, int width, int channels, int quality,
                       uint8_t **out, size_t *size, char *err, size_t n);
void image_free_jpeg(uint8_t *buf);
