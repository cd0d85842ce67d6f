// The constants of the vector e^x (exp_avx512.h, 16 lanes; exp_avx2.h, 8 lanes): one reduction and
// one polynomial for both, so each ISA's exp is the same function of its input up to how 2^n is
// applied. x = n ln2 + r with n = round(x * log2(e)) and |r| <= ln2 / 2; ln2 is split in two, its
// high part short enough that n * hi is exact; e^r by its Taylor series to r^7 (relative error
// below 2e-7 there), evaluated by Horner's rule from the r^7 coefficient down.
#pragma once

namespace specdec::exp_poly {

inline constexpr float kMin = -104.0f;  // below, e^x is 0 in float32 (NaN is sent here too)
inline constexpr float kMax = 88.7f;    // above, e^x would overflow
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693145751953125f;
inline constexpr float kLn2Lo = 1.428606765330187045e-06f;  // ln2 - kLn2Hi
inline constexpr int kDegree = 7;
// 1/7!, 1/6!, ..., 1/1!, 1/0!: Horner's rule from the highest power.
inline constexpr float kHorner[kDegree + 1] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                               1.0f / 6.0f,    0.5f,          1.0f,          1.0f};

}  // namespace specdec::exp_poly
