// PNG and JPEG decoding: see image.h.
#include "image.h"
#include "data_err.h"
#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

ImageFormat image_format(const uint8_t *d, size_t n) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && memcmp(d, png_sig, 8) == 0) return IMAGE_PNG;
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return IMAGE_JPEG;
    return IMAGE_UNKNOWN;
}

void image_free(Image *im) {
    free(im->pixels);
    memset(im, 0, sizeof *im);
}

static int check_dims(const char *name, const char *kind, uint64_t w, uint64_t h, char *err,
                      size_t n) {
    if (w < 1 || h < 1 || w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE || w * h > IMAGE_MAX_PIXELS)
        return data_fail(err, n, "%s: %s header says %llu x %llu pixels; expected sides 1..%d and "
                         "at most %llu pixels (corrupt or hostile file)", name, kind,
                         (unsigned long long)w, (unsigned long long)h, IMAGE_MAX_SIDE,
                         IMAGE_MAX_PIXELS);
    return 0;
}

// In place: src has `from` channels per pixel, the result `to` (1 or 3); the buffer holds
// max(from, to) * hw bytes. RGB -> gray uses PIL's fixed-point "L" conversion.
static void convert_channels(uint8_t *p, size_t hw, int from, int to) {
    if (from == to) return;
    if (from == 3 && to == 1) {
        for (size_t i = 0; i < hw; i++) {
            const uint8_t *q = p + 3 * i;
            p[i] = (uint8_t)((q[0] * 19595u + q[1] * 38470u + q[2] * 7471u + 0x8000u) >> 16);
        }
    } else if (from == 1 && to == 3) {
        for (size_t i = hw; i-- > 0;) p[3 * i] = p[3 * i + 1] = p[3 * i + 2] = p[i];
    }
}

// ---------------------------------------------------------------------------------------------
// PNG

typedef struct PngSrc {
    const uint8_t *data;
    size_t size, pos;
    char msg[256];
    int warned;
} PngSrc;

static void png_on_error(png_structp png, png_const_charp msg) {
    PngSrc *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    PngSrc *s = png_get_error_ptr(png);
    s->warned = 1;
    (void)msg;
}

static void png_on_read(png_structp png, png_bytep out, png_size_t len) {
    PngSrc *s = png_get_io_ptr(png);
    if (len > s->size - s->pos) png_error(png, "file is truncated (unexpected end of data)");
    memcpy(out, s->data + s->pos, len);
    s->pos += len;
}

static int decode_png(const uint8_t *data, size_t size, const char *name, int channels,
                      Image *out, int *warning, char *err, size_t n) {
    // The IHDR chunk always comes first: check the size before libpng allocates anything.
    if (size >= 24 && memcmp(data + 12, "IHDR", 4) == 0) {
        uint64_t w = (uint64_t)data[16] << 24 | data[17] << 16 | data[18] << 8 | data[19];
        uint64_t h = (uint64_t)data[20] << 24 | data[21] << 16 | data[22] << 8 | data[23];
        if (check_dims(name, "PNG", w, h, err, n)) return -1;
    }
    PngSrc src = {.data = data, .size = size};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error,
                                             png_on_warning);
    if (!png) return data_fail(err, n, "%s: out of memory (libpng)", name);
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile pixels = NULL;
    png_bytep *volatile rows = NULL;
    volatile int rc = -1;
    if (!info) {
        data_fail(err, n, "%s: out of memory (libpng)", name);
        goto done;
    }
    if (setjmp(png_jmpbuf(png))) {
        data_fail(err, n, "%s: PNG decoding failed: %s", name, src.msg[0] ? src.msg : "libpng error");
        goto done;
    }
    png_set_read_fn(png, &src, png_on_read);
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);   // check_dims gives the message
    png_set_chunk_malloc_max(png, 64u << 20);
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, color, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, NULL, NULL);
    if (check_dims(name, "PNG", w, h, err, n)) goto done;

    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_scale_16(png);
    // Palette expansion turns tRNS into an alpha channel: strip that too.
    if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
        png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int have = png_get_channels(png, info);
    if ((have != 1 && have != 3) || png_get_rowbytes(png, info) != (size_t)w * have) {
        data_fail(err, n, "%s: unexpected PNG layout after conversion (%d channels, %zu bytes per "
                  "row for width %u)", name, have, (size_t)png_get_rowbytes(png, info), w);
        goto done;
    }
    int room = have > channels ? have : channels;
    pixels = malloc((size_t)w * h * room);
    rows = malloc(sizeof(png_bytep) * h);
    if (!pixels || !rows) {
        data_fail(err, n, "%s: out of memory for %u x %u pixels", name, w, h);
        goto done;
    }
    for (png_uint_32 y = 0; y < h; y++) rows[y] = pixels + (size_t)y * w * have;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    convert_channels(pixels, (size_t)w * h, have, channels);
    *out = (Image){pixels, (int)h, (int)w, channels};
    pixels = NULL;
    if (warning) *warning = src.warned;
    rc = 0;
done:
    png_destroy_read_struct(&png, info ? &info : NULL, NULL);
    free(pixels);
    free(rows);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// JPEG

static int decode_jpeg(const uint8_t *data, size_t size, const char *name, int channels,
                       int min_side, Image *out, int *warning, char *err, size_t n) {
    tjhandle tj = tjInitDecompress();
    if (!tj) return data_fail(err, n, "%s: TurboJPEG init failed: %s", name, tjGetErrorStr2(NULL));
    int w, h, subsamp, cs, rc = -1;
    uint8_t *pixels = NULL;
    if (size > (unsigned long)-1 ||
        tjDecompressHeader3(tj, data, (unsigned long)size, &w, &h, &subsamp, &cs) != 0) {
        data_fail(err, n, "%s: JPEG header unreadable: %s", name, tjGetErrorStr2(tj));
        goto done;
    }
    if (check_dims(name, "JPEG", (uint64_t)w, (uint64_t)h, err, n)) goto done;

    // The smallest DCT scale whose shorter side still reaches min_side (largest = 1/1).
    int sw = w, sh = h;
    if (min_side > 0) {
        int count;
        tjscalingfactor *sf = tjGetScalingFactors(&count);
        int best = w < h ? w : h;
        for (int i = 0; sf && i < count; i++) {
            if (sf[i].num > sf[i].denom) continue;   // only reductions
            int tw = TJSCALED(w, sf[i]), th = TJSCALED(h, sf[i]);
            int side = tw < th ? tw : th;
            if (side >= min_side && side < best) best = side, sw = tw, sh = th;
        }
    }
    int cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    int have = cs == TJCS_GRAY ? 1 : cmyk ? 4 : 3;
    int pf = cs == TJCS_GRAY ? TJPF_GRAY : cmyk ? TJPF_CMYK : TJPF_RGB;
    int room = have > channels ? have : channels;
    pixels = malloc((size_t)sw * sh * room);
    if (!pixels) {
        data_fail(err, n, "%s: out of memory for %d x %d pixels", name, sw, sh);
        goto done;
    }
    if (tjDecompress2(tj, data, (unsigned long)size, pixels, sw, 0, sh, pf, TJFLAG_LIMITSCANS) != 0) {
        if (tjGetErrorCode(tj) != TJERR_WARNING) {
            data_fail(err, n, "%s: JPEG decoding failed: %s", name, tjGetErrorStr2(tj));
            goto done;
        }
        if (warning) *warning = 1;   // damaged data the decoder recovered from
    } else if (warning) {
        *warning = 0;
    }
    if (cmyk) {   // Adobe CMYK JPEGs store inverted ink: R = C' K' / 255 (PIL's cmyk2rgb)
        size_t hw = (size_t)sw * sh;
        for (size_t i = 0; i < hw; i++) {
            const uint8_t *q = pixels + 4 * i;
            unsigned k = q[3];
            uint8_t r = (uint8_t)((q[0] * k + 127) / 255), g = (uint8_t)((q[1] * k + 127) / 255),
                    b = (uint8_t)((q[2] * k + 127) / 255);
            pixels[3 * i] = r, pixels[3 * i + 1] = g, pixels[3 * i + 2] = b;
        }
        have = 3;
    }
    convert_channels(pixels, (size_t)sw * sh, have, channels);
    *out = (Image){pixels, sh, sw, channels};
    pixels = NULL;
    rc = 0;
done:
    free(pixels);
    tjDestroy(tj);
    return rc;
}

int image_decode(const uint8_t *data, size_t size, const char *name, int channels, int min_side,
                 Image *out, int *warning, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    if (warning) *warning = 0;
    if (channels != 1 && channels != 3)
        return data_fail(err, n, "%s: %d output channels requested; expected 1 or 3", name,
                         channels);
    if (size == 0) return data_fail(err, n, "%s: empty file (0 bytes)", name);
    switch (image_format(data, size)) {
    case IMAGE_PNG:  return decode_png(data, size, name, channels, out, warning, err, n);
    case IMAGE_JPEG: return decode_jpeg(data, size, name, channels, min_side, out, warning, err, n);
    default:
        return data_fail(err, n, "%s: not a PNG or JPEG file (starts with %02x %02x %02x %02x)",
                         name, data[0], size > 1 ? data[1] : 0, size > 2 ? data[2] : 0,
                         size > 3 ? data[3] : 0);
    }
}

int image_read_file(const char *path, int channels, int min_side, Image *out, int *warning,
                    char *err, size_t n) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return data_fail(err, n, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return data_fail(err, n, "%s: not a regular file", path);
    }
    if (st.st_size > (off_t)1 << 31) {
        fclose(f);
        return data_fail(err, n, "%s: %lld bytes; image files above 2 GiB are refused", path,
                         (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        fclose(f);
        return data_fail(err, n, "%s: out of memory for %zu bytes", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    int rerr = ferror(f);
    fclose(f);
    int rc;
    if (rerr || got != size)
        rc = data_fail(err, n, "%s: read error (%zu of %zu bytes)", path, got, size);
    else
        rc = image_decode(buf, size, path, channels, min_side, out, warning, err, n);
    free(buf);
    return rc;
}
