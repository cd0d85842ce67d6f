// One group of activations rounded to int8 with one float32 scale: the steps q8.h (groups of 32)
// and q8k.h (groups of 256) specify, in one place. Torch-free; compiled into baseline-x86-64 files
// (no FMA to contract into).
#pragma once

#include <cmath>
#include <cstdint>

namespace specdec::gguf {

// round half to even for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits, and the float add
// rounds to nearest even (the default rounding mode, which torch does not change).
inline float round_even(float v) {
  const float magic = 12582912.0f;
  return (v + magic) - magic;
}

// q[0 .. n) = the codes of v[0 .. n): amax = max |v_i| (exact), d = amax / 127 (one float32
// division), q_i = clamp(rne(v_i / d), -127, 127), all 0 where d == 0, 0 where v_i / d is NaN
// (non-finite x: no undefined conversion). Returns d.
inline float quantize_group_int8(const float* v, int n, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fabs(v[i]) > amax ? std::fabs(v[i]) : amax;
  const float d = amax / 127.0f;
  for (int i = 0; i < n; ++i) {
    if (d == 0.0f) {
      q[i] = 0;
      continue;
    }
    float r = round_even(v[i] / d);
    r = r > 127.0f ? 127.0f : r;
    r = r < -127.0f ? -127.0f : r;
    if (r != r) r = 0.0f;
    q[i] = static_cast<int8_t>(static_cast<int32_t>(r));
  }
  return d;
}

// One row of K values rounded group by group (`group` values each, K a multiple of it and of 16):
// q[0 .. K), d[g] the scale of group g, s[h] = q[16h] + ... + q[16h + 15] (int16). The layout of
// both activation formats' rows (q8.h: groups of 32; q8k.h: of 256), whose callers place q, d, s.
inline void quantize_row_int8(const float* x, int64_t K, int group, int8_t* q, float* d, int16_t* s) {
  for (int64_t g = 0; g < K / group; ++g) d[g] = quantize_group_int8(x + group * g, group, q + group * g);
  for (int64_t h = 0; h < K / 16; ++h) {
    int32_t sum = 0;
    for (int i = 0; i < 16; ++i) sum += q[16 * h + i];
    s[h] = static_cast<int16_t>(sum);
  }
}

}  // namespace specdec::gguf
