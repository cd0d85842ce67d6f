// CUDA kernels of the hierarchical 4-bit KV cache: one thread per group (per channel pair for
// keys), running the same per-group code as the CPU (hier4.h), so codes match bit for bit.
// Adjacent threads take adjacent channel pairs / groups, so global accesses coalesce.
#include "kernels/kv_quant/hier4_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/kv_quant/hier4.h"

namespace specdec::kv {
namespace {

constexpr int kThreads = 256;

dim3 grid_for(int64_t items) { return dim3(static_cast<unsigned>((items + kThreads - 1) / kThreads)); }

// Thread i: (row r = b*H + h, group g of the block, channel pair p).
template <typename T>
__global__ void quantize_keys_kernel(const T* __restrict__ k, const int64_t* __restrict__ start, int64_t H,
                                     int64_t T_, int64_t D, int64_t capacity, int64_t G, int64_t rows,
                                     uint8_t* __restrict__ upper, uint8_t* __restrict__ lower,
                                     float* __restrict__ scale, float* __restrict__ zero) {
  const int64_t pairs = D / 2, groups = T_ / G;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * groups * pairs) return;
  const int64_t p = i % pairs, g = (i / pairs) % groups, r = i / (pairs * groups);
  const int64_t s = start[r / H];
  if (s < 0 || s % G != 0 || s > capacity - T_) return;  // not s + T_: it overflows near INT64_MAX
  const int64_t tok = s + g * G;
  quantize_key_pair(k + (r * T_ + g * G) * D + 2 * p, D, G, upper + (r * capacity + tok) * pairs + p,
                    lower + (r * capacity + tok) * pairs + p, scale + (r * (capacity / G) + tok / G) * D + 2 * p,
                    zero + (r * (capacity / G) + tok / G) * D + 2 * p);
}

// Thread i: (row r, token t of the block, channel group g).
template <typename T>
__global__ void quantize_values_kernel(const T* __restrict__ v, const int64_t* __restrict__ start, int64_t H,
                                       int64_t T_, int64_t D, int64_t capacity, int64_t G, int64_t rows,
                                       uint8_t* __restrict__ upper, uint8_t* __restrict__ lower,
                                       float* __restrict__ scale, float* __restrict__ zero) {
  const int64_t groups = D / G;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * T_ * groups) return;
  const int64_t g = i % groups, t = (i / groups) % T_, r = i / (groups * T_);
  const int64_t s = start[r / H];
  if (s < 0 || s > capacity - T_) return;  // not s + T_: it overflows near INT64_MAX
  const int64_t tok = r * capacity + s + t;
  quantize_value_group(v + (r * T_ + t) * D + g * G, G, upper + tok * (D / 2) + g * G / 2,
                       lower + tok * (D / 2) + g * G / 2, scale + tok * groups + g, zero + tok * groups + g);
}

// Two adjacent outputs in the output dtype, stored as one 8- or 4-byte word.
template <typename OutT>
struct Pair;
template <>
struct Pair<float> {
  using type = float2;
  static __device__ __forceinline__ float2 make(float a, float b) { return make_float2(a, b); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ __half2 make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ __nv_bfloat162 make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// Thread i: (row r, token t, byte j = channels 2j, 2j+1). Output written in its own dtype so an
// fp16 / bf16 attention reads the dequantised cache without a conversion pass.
template <typename OutT>
__global__ void dequantize_kernel(bool keys, const uint8_t* __restrict__ upper, const uint8_t* __restrict__ lower,
                                  const float* __restrict__ scale, const float* __restrict__ zero, int64_t rows,
                                  int64_t T_, int64_t D, int64_t capacity, int64_t G, bool use_lower,
                                  typename Pair<OutT>::type* __restrict__ out) {
  const int64_t half = D / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * T_ * half) return;
  const int64_t j = i % half, t = (i / half) % T_, r = i / (half * T_);
  const int64_t byte = (r * capacity + t) * half + j;
  int64_t p0, p1;
  if (keys) {
    p0 = (r * (capacity / G) + t / G) * D + 2 * j;
    p1 = p0 + 1;
  } else {
    const int64_t groups = D / G;
    p0 = (r * capacity + t) * groups + (2 * j) / G;
    p1 = (r * capacity + t) * groups + (2 * j + 1) / G;
  }
  float o[2];
  dequantize_byte(upper[byte], use_lower ? lower[byte] : uint8_t{0x88}, scale[p0], zero[p0], scale[p1], zero[p1],
                  use_lower, o);
  out[(r * T_ + t) * half + j] = Pair<OutT>::make(o[0], o[1]);
}

template <typename F>
cudaError_t by_dtype(DType dtype, const F& f) {
  switch (dtype) {
    case DType::kFloat32: f(static_cast<const float*>(nullptr)); break;
    case DType::kFloat16: f(static_cast<const Half16*>(nullptr)); break;
    case DType::kBFloat16: f(static_cast<const BFloat16*>(nullptr)); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_quantize_keys(const void* k, DType dtype, const int64_t* start, int64_t B, int64_t H, int64_t T,
                                 int64_t D, int64_t capacity, int64_t G, uint8_t* upper, uint8_t* lower, float* scale,
                                 float* zero, cudaStream_t stream) {
  if (G <= 0 || T % G != 0 || D % 2 != 0 || capacity % G != 0 || T > capacity) return cudaErrorInvalidValue;
  const int64_t items = B * H * (T / G) * (D / 2);
  if (items == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto tag) {
    using Tp = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    quantize_keys_kernel<Tp><<<grid_for(items), kThreads, 0, stream>>>(static_cast<const Tp*>(k), start, H, T, D,
                                                                       capacity, G, B * H, upper, lower, scale, zero);
  });
}

cudaError_t launch_quantize_values(const void* v, DType dtype, const int64_t* start, int64_t B, int64_t H, int64_t T,
                                   int64_t D, int64_t capacity, int64_t G, uint8_t* upper, uint8_t* lower, float* scale,
                                   float* zero, cudaStream_t stream) {
  if (G <= 0 || G % 2 != 0 || D % G != 0 || T > capacity) return cudaErrorInvalidValue;
  const int64_t items = B * H * T * (D / G);
  if (items == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto tag) {
    using Tp = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    quantize_values_kernel<Tp><<<grid_for(items), kThreads, 0, stream>>>(static_cast<const Tp*>(v), start, H, T, D,
                                                                         capacity, G, B * H, upper, lower, scale, zero);
  });
}

cudaError_t launch_dequantize(bool keys, const uint8_t* upper, const uint8_t* lower, const float* scale,
                              const float* zero, int64_t B, int64_t H, int64_t T, int64_t D, int64_t capacity,
                              int64_t G, bool use_lower, void* out, DType out_dtype, cudaStream_t stream) {
  if (G <= 0 || D % 2 != 0 || T > capacity) return cudaErrorInvalidValue;
  const int64_t items = B * H * T * (D / 2);
  if (items == 0) return cudaSuccess;
  switch (out_dtype) {
    case DType::kFloat32:
      dequantize_kernel<float><<<grid_for(items), kThreads, 0, stream>>>(
          keys, upper, lower, scale, zero, B * H, T, D, capacity, G, use_lower, static_cast<float2*>(out));
      break;
    case DType::kFloat16:
      dequantize_kernel<__half><<<grid_for(items), kThreads, 0, stream>>>(
          keys, upper, lower, scale, zero, B * H, T, D, capacity, G, use_lower, static_cast<__half2*>(out));
      break;
    case DType::kBFloat16:
      dequantize_kernel<__nv_bfloat16><<<grid_for(items), kThreads, 0, stream>>>(
          keys, upper, lower, scale, zero, B * H, T, D, capacity, G, use_lower, static_cast<__nv_bfloat162*>(out));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace specdec::kv
