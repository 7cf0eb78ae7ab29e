// Constants of NF4 (4-bit NormalFloat, QLoRA, Dettmers et al. 2023) that the host (src/ops/nf4.cpp
// and the tests' reference) and the kernels (cuda/nf4.cuh) must agree on, in ONE place both include.
// Plain C++17 (macros and constexpr, no device code, no includes): NVRTC compiles it inside the
// kernel sources and the host includes it as "cuda/nf4_constants.cuh".
//
// The 16 levels are bitsandbytes' nf4_dequantization_lut (csrc/kernels.cu; create_normal_map with
// offset 0.9677083, use_extra_value), code 0b0000 = -1 ... 0b0111 = 0 ... 0b1111 = 1. Quantising
// picks the code whose level is nearest to the absmax-normalised value; the 15 decision thresholds
// are bitsandbytes' dQuantizeNF4 tree constants (the midpoints of adjacent levels, as f32 literals),
// and a value equal to a threshold takes the lower code (bitsandbytes compares x > threshold).
#pragma once

// The levels, code order.
#define FLAME_NF4_LEVELS                                                                                   \
  -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,         \
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,      \
      0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,               \
      0.7229568362236023f, 1.0f

// thresholds[k] separates code k from code k + 1 (ascending).
#define FLAME_NF4_THRESHOLDS                                                                               \
  -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,                 \
      -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,          \
      0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,                 \
      0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f

namespace flame {

// Elements of one block of the second (double) quantisation: the absmax values are quantised to 8
// bits in blocks of this many, with an f32 scale per block (bitsandbytes' quantize_4bit with
// compress_statistics: quantize_blockwise(absmax - mean, blocksize=256)).
constexpr int kNf4NestedBlock = 256;
// Threads of one block of the quantisation kernels (a power of two, at most kNf4NestedBlock).
constexpr int kNf4QuantizeThreads = 128;

}  // namespace flame
