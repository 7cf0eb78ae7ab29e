/*
 * png_tiny.h - a tiny PNG writer and checker for 8-bit RGB images, through zlib.
 *
 * A PNG file (https://www.w3.org/TR/png/) is the 8-byte signature 89 50 4E 47 0D 0A 1A 0A, then
 * chunks: a 4-byte big-endian data length, a 4-byte type, the data, and a CRC-32 (zlib's crc32) of
 * type and data. Three chunks are enough here:
 *   IHDR  width, height (4 bytes each), bit depth 8, colour type 2 (RGB), compression 0,
 *         filter method 0, interlace 0
 *   IDAT  the zlib stream (compress2) of the scanlines: each row is one filter-type byte followed
 *         by width * 3 bytes R, G, B; the writer uses filter type 0 (None) on every row
 *   IEND  no data
 * png_check re-reads such a file the way a decoder would: the signature, each chunk's CRC, IHDR
 * first with supported values, the concatenated IDAT inflated (uncompress) to exactly
 * height * (1 + 3 width) bytes, every row's filter (all five types of the standard are undone), IEND
 * last; it returns the pixels, so a caller can compare them with what it wrote.
 *
 * Header only (static functions), C99 + zlib (link ZLIB::ZLIB).
 */
#ifndef FLAME_EXAMPLES_PNG_TINY_H
#define FLAME_EXAMPLES_PNG_TINY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

static const unsigned char png_signature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

static inline void png_put32(unsigned char* p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}
static inline uint32_t png_get32(const unsigned char* p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Writes one chunk: length, type, data, CRC-32 of type and data. Returns 0 on success. */
static inline int png_chunk(FILE* f, const char type[4], const unsigned char* data, uint32_t len) {
  unsigned char head[8], tail[4];
  png_put32(head, len);
  memcpy(head + 4, type, 4);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, (const Bytef*)type, 4);
  if (len) crc = crc32(crc, data, (uInt)len);
  png_put32(tail, (uint32_t)crc);
  if (fwrite(head, 1, 8, f) != 8) return -1;
  if (len && fwrite(data, 1, len, f) != len) return -1;
  return fwrite(tail, 1, 4, f) == 4 ? 0 : -1;
}

/* Writes rgb (h rows of w pixels, 3 bytes each, row-major) as an 8-bit RGB PNG at path.
 * Returns 0 on success, -1 on failure (errno or zlib; nothing is said about a partial file). */
static inline int png_write_rgb(const char* path, const unsigned char* rgb, int w, int h) {
  const size_t row = 1 + 3 * (size_t)w, raw_len = row * (size_t)h;
  unsigned char* raw = malloc(raw_len);
  uLongf zlen = compressBound((uLong)raw_len);
  unsigned char* z = malloc(zlen);
  int rc = -1;
  FILE* f = NULL;
  if (!raw || !z) goto done;
  for (int y = 0; y < h; ++y) {
    raw[y * row] = 0; /* filter type None */
    memcpy(raw + y * row + 1, rgb + (size_t)y * 3 * (size_t)w, 3 * (size_t)w);
  }
  if (compress2(z, &zlen, raw, (uLong)raw_len, 6) != Z_OK) goto done;
  unsigned char ihdr[13];
  png_put32(ihdr, (uint32_t)w);
  png_put32(ihdr + 4, (uint32_t)h);
  ihdr[8] = 8;  /* bit depth */
  ihdr[9] = 2;  /* colour type: RGB */
  ihdr[10] = 0; /* compression: deflate */
  ihdr[11] = 0; /* filter method 0 */
  ihdr[12] = 0; /* no interlace */
  f = fopen(path, "wb");
  if (!f) goto done;
  if (fwrite(png_signature, 1, 8, f) != 8) goto done;
  if (png_chunk(f, "IHDR", ihdr, 13) || png_chunk(f, "IDAT", z, (uint32_t)zlen) || png_chunk(f, "IEND", NULL, 0)) goto done;
  rc = 0;
done:
  if (f && fclose(f) != 0) rc = -1;
  free(raw);
  free(z);
  return rc;
}

/* The Paeth predictor of the PNG standard. */
static inline int png_paeth(int a, int b, int c) {
  int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Decodes the 8-bit RGB PNG at path. On success returns 0 with *rgb (malloc'ed, h * w * 3 bytes;
 * free it), *w and *h; on failure returns -1 with a reason in why (capacity why_len) and *rgb NULL. */
static inline int png_check(const char* path, unsigned char** rgb, int* w, int* h, char* why, size_t why_len) {
  unsigned char *file = NULL, *idat = NULL, *raw = NULL, *out = NULL;
  size_t size = 0, idat_len = 0, pos = 8;
  int rc = -1, seen_ihdr = 0, seen_iend = 0;
  uint32_t width = 0, height = 0;
  *rgb = NULL;
#define PNG_FAIL(...)                       \
  do {                                      \
    snprintf(why, why_len, __VA_ARGS__);    \
    goto done;                              \
  } while (0)
  FILE* f = fopen(path, "rb");
  if (!f) PNG_FAIL("cannot open %s", path);
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n > 0 && n < (1L << 30) && fseek(f, 0, SEEK_SET) == 0 && (file = malloc((size_t)n)) &&
        fread(file, 1, (size_t)n, f) == (size_t)n)
      size = (size_t)n;
  }
  fclose(f);
  if (!size) PNG_FAIL("cannot read %s", path);
  if (size < 8 || memcmp(file, png_signature, 8) != 0) PNG_FAIL("no PNG signature");
  while (pos < size && !seen_iend) {
    if (size - pos < 12) PNG_FAIL("truncated chunk header at byte %zu", pos);
    uint32_t len = png_get32(file + pos);
    const unsigned char* type = file + pos + 4;
    if (len > size - pos - 12) PNG_FAIL("chunk at byte %zu runs past the end of the file", pos);
    const unsigned char* data = type + 4;
    uLong crc = crc32(crc32(0L, Z_NULL, 0), type, (uInt)(4 + len));
    if ((uint32_t)crc != png_get32(data + len)) PNG_FAIL("bad CRC in chunk %.4s", (const char*)type);
    if (!seen_ihdr && memcmp(type, "IHDR", 4) != 0) PNG_FAIL("the first chunk is not IHDR");
    if (!memcmp(type, "IHDR", 4)) {
      if (seen_ihdr || len != 13) PNG_FAIL("bad IHDR");
      width = png_get32(data);
      height = png_get32(data + 4);
      if (!width || !height || width > 16384 || height > 16384) PNG_FAIL("bad size %ux%u", width, height);
      if (data[8] != 8 || data[9] != 2 || data[10] || data[11] || data[12])
        PNG_FAIL("not 8-bit RGB without interlace (depth %d, colour type %d, interlace %d)", data[8], data[9], data[12]);
      seen_ihdr = 1;
    } else if (!memcmp(type, "IDAT", 4)) {
      unsigned char* grown = realloc(idat, idat_len + len + 1);
      if (!grown) PNG_FAIL("out of memory");
      idat = grown;
      memcpy(idat + idat_len, data, len);
      idat_len += len;
    } else if (!memcmp(type, "IEND", 4)) {
      if (len) PNG_FAIL("IEND with data");
      seen_iend = 1;
    } else if (!(type[0] & 0x20)) { /* an unknown critical chunk: a decoder must refuse it */
      PNG_FAIL("unknown critical chunk %.4s", (const char*)type);
    }
    pos += 12 + len;
  }
  if (!seen_iend) PNG_FAIL("no IEND chunk");
  if (pos != size) PNG_FAIL("%zu bytes after IEND", size - pos);
  if (!idat_len) PNG_FAIL("no IDAT chunk");
  const size_t stride = 3 * (size_t)width, row = 1 + stride, raw_len = row * height;
  uLongf got = (uLongf)raw_len;
  raw = malloc(raw_len + 1);
  out = malloc(stride * height);
  if (!raw || !out) PNG_FAIL("out of memory");
  if (uncompress(raw, &got, idat, (uLong)idat_len) != Z_OK) PNG_FAIL("the IDAT stream does not inflate");
  if (got != raw_len) PNG_FAIL("IDAT inflates to %lu bytes, expected %zu", (unsigned long)got, raw_len);
  for (size_t y = 0; y < height; ++y) {
    const unsigned char* src = raw + y * row + 1;
    unsigned char* dst = out + y * stride;
    const unsigned char* up = y ? out + (y - 1) * stride : NULL;
    int filter = raw[y * row];
    if (filter > 4) PNG_FAIL("row %zu has filter type %d", y, filter);
    for (size_t x = 0; x < stride; ++x) { /* a: left (same channel), b: up, c: up-left */
      int a = x >= 3 ? dst[x - 3] : 0, b = up ? up[x] : 0, c = (x >= 3 && up) ? up[x - 3] : 0, p = 0;
      if (filter == 1) p = a;
      else if (filter == 2) p = b;
      else if (filter == 3) p = (a + b) / 2;
      else if (filter == 4) p = png_paeth(a, b, c);
      dst[x] = (unsigned char)(src[x] + p);
    }
  }
  *rgb = out;
  out = NULL;
  *w = (int)width;
  *h = (int)height;
  rc = 0;
#undef PNG_FAIL
done:
  free(file);
  free(idat);
  free(raw);
  free(out);
  return rc;
}

#endif /* FLAME_EXAMPLES_PNG_TINY_H */
