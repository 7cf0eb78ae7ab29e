/*
 * shapes_data.h - the procedural shapes data set of train_cnn.c and train_diffusion.c.
 *
 * 32x32 RGB images (planar CHW floats in about [-1, 1]) of one filled circle, square or triangle at a
 * random position, size (circumradius 4 to 8 pixels) and colour (each channel 0.3 to 1.0 before the
 * mapping to [-1, 1]) on a dark noisy background (each channel 0 to 0.15), drawn on the host from a
 * xorshift64* stream: the same images on every machine for a given seed. Header only (static
 * functions), C99; no FLAME calls.
 */
#ifndef FLAME_EXAMPLES_SHAPES_DATA_H
#define FLAME_EXAMPLES_SHAPES_DATA_H

#include <math.h>
#include <stdint.h>
#include <stddef.h>

#define SHAPES_PI 3.14159265358979323846
#define IMG 32     /* images are IMG x IMG */
#define CLASSES 3  /* 0 circle, 1 square, 2 triangle */

/* xorshift64*: the state must be non-zero. */
static inline uint64_t rng_next(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}
/* Uniform in [0, 1) with 53 bits. */
static inline double rng_uniform(uint64_t* s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

/* Draws one image (planar CHW floats in about [-1, 1]) of class c into img. */
static inline void draw_shape(uint64_t* s, int c, float* img) {
  double cx = 8 + 16 * rng_uniform(s), cy = 8 + 16 * rng_uniform(s), r = 4 + 4 * rng_uniform(s);
  double col[3];
  for (int k = 0; k < 3; ++k) col[k] = 0.3 + 0.7 * rng_uniform(s);
  double ang = 2 * SHAPES_PI * rng_uniform(s); /* triangles point anywhere */
  for (int y = 0; y < IMG; ++y)
    for (int x = 0; x < IMG; ++x) {
      double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
      int inside = 0;
      if (c == 0) {
        inside = dx * dx + dy * dy <= r * r;
      } else if (c == 1) {
        inside = fabs(dx) <= r * 0.85 && fabs(dy) <= r * 0.85;
      } else { /* equilateral triangle of circumradius r: inside all three half-planes */
        inside = 1;
        for (int e = 0; e < 3; ++e) {
          double a = ang + e * 2 * SHAPES_PI / 3;
          if (dx * cos(a) + dy * sin(a) > r * 0.5) inside = 0;
        }
      }
      for (int k = 0; k < 3; ++k) {
        double bg = 0.15 * rng_uniform(s);
        img[(k * IMG + y) * IMG + x] = (float)((inside ? col[k] : bg) * 2.0 - 1.0);
      }
    }
}

/* n images of random classes into imgs [n, 3, IMG, IMG]; their classes into labels (may be NULL). */
static inline void draw_batch(uint64_t* s, int n, float* imgs, int64_t* labels) {
  for (int i = 0; i < n; ++i) {
    int c = (int)(rng_next(s) % CLASSES);
    if (labels) labels[i] = c;
    draw_shape(s, c, imgs + (size_t)i * 3 * IMG * IMG);
  }
}

#endif /* FLAME_EXAMPLES_SHAPES_DATA_H */
