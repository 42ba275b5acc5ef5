// PNG writing (libpng) and JPEG encoding (TurboJPEG): see image.h.
#include "image.h"
#include "data_err.h"
#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <unistd.h>

typedef struct PngSink { char msg[256]; } PngSink;

static void png_on_error(png_structp png, png_const_charp msg) {
    PngSink *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

int image_write_png(const char *path, const uint8_t *pixels, int height, int width, int channels,
                    char *err, size_t n) {
    if (channels != 1 && channels != 3)
        return data_fail(err, n, "%s: %d channels; PNG output takes 1 or 3", path, channels);
    FILE *f = fopen(path, "wb");
    if (!f) return data_fail(err, n, "%s: cannot create: %s", path, strerror(errno));
    PngSink sink = {{0}};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, png_on_error,
                                              png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    volatile int rc = -1;
    if (!png || !info) {
        data_fail(err, n, "%s: out of memory (libpng)", path);
        goto done;
    }
    if (setjmp(png_jmpbuf(png))) {
        data_fail(err, n, "%s: PNG writing failed: %s", path, sink.msg);
        goto done;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8,
                 channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < height; y++)
        png_write_row(png, (png_const_bytep)(pixels + (size_t)y * width * channels));
    png_write_end(png, NULL);
    rc = 0;
done:
    png_destroy_write_struct(png ? &png : NULL, info ? &info : NULL);
    if (fclose(f) != 0 && rc == 0) rc = data_fail(err, n, "%s: write failed: %s", path, strerror(errno));
    if (rc) unlink(path);
    return rc;
}

int image_encode_jpeg(const uint8_t *pixels, int height, int width, int channels, int quality,
                      uint8_t **out, size_t *size, char *err, size_t n) {
    *out = NULL;
    *size = 0;
    tjhandle tj = tjInitCompress();
    if (!tj) return data_fail(err, n, "TurboJPEG init failed: %s", tjGetErrorStr2(NULL));
    unsigned char *buf = NULL;
    unsigned long len = 0;
    int pf = channels == 1 ? TJPF_GRAY : TJPF_RGB;
    int sub = channels == 1 ? TJSAMP_GRAY : quality >= 100 ? TJSAMP_444 : TJSAMP_420;
    int rc = tjCompress2(tj, pixels, width, 0, height, pf, &buf, &len, sub, quality,
                         TJFLAG_ACCURATEDCT);
    if (rc != 0) {
        data_fail(err, n, "JPEG encoding of a %d x %d image failed: %s", width, height,
                  tjGetErrorStr2(tj));
        tjFree(buf);
    } else {
        *out = buf;
        *size = len;
    }
    tjDestroy(tj);
    return rc ? -1 : 0;
}

void image_free_jpeg(uint8_t *buf) { tjFree(buf); }
