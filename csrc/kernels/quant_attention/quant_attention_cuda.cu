// Attention over the hierarchical 4-bit KV cache on CUDA (see quant_attention.h for the layouts).
//
// One block per (row b, KV head h, chunk of Rc queries) of the R = (Hq / Hkv) * n queries that
// share the KV head, so a KV head is read once for all its query heads (once per chunk when R
// does not fit the shared memory in one). The block walks the tokens in tiles:
//
//   tile of `tile` tokens ──decode──> kq / kf (shared)     keys: codes and / or buffer copy
//        scores ps[Rc][tile] = (q · k) * scale, masked -inf
//        per query: running max m, sum l, rescale factor alpha
//   same tile ──decode──> kq / kf (reused)                 values
//        acc[Rc][D] = acc * alpha + Σ_u p[u] · v[u]
//
// Shared memory (floats): qs[Rc*D] | acc[Rc*D] | ps[Rc*tile] | kq[tile*D] | kf[tile*D] |
// m[Rc] | l[Rc] | alpha[Rc] | flags[tile] (ints: bit 0 quantised version decoded, bit 1 buffer).
#include "kernels/quant_attention/quant_attention_cuda.h"

#include <algorithm>

namespace specdec::qattn {
namespace {

// 128 threads: four warps, enough to decode a tile (tile * D elements) in a few passes.
constexpr int kThreads = 128;
// Dynamic shared memory without opting in to more (every architecture since sm_50 has 48 KiB).
constexpr int64_t kSharedFloats = 48 * 1024 / 4;

__global__ void quant_attention_kernel(Args a, int64_t Rc, int64_t tile) {
  extern __shared__ float smem[];
  const int64_t D = a.D, n = a.n, r = a.Hq / a.Hkv, R = r * n;
  const int64_t task = blockIdx.x, b = task / a.Hkv, h = task % a.Hkv;
  const int64_t rho0 = static_cast<int64_t>(blockIdx.y) * Rc;
  const int64_t rc = R - rho0 < Rc ? R - rho0 : Rc;
  float* qs = smem;
  float* acc = qs + Rc * D;
  float* ps = acc + Rc * D;
  float* kq = ps + Rc * tile;
  float* kf = kq + tile * D;
  float* ms = kf + tile * D;
  float* ls = ms + Rc;
  float* al = ls + Rc;
  int* flags = reinterpret_cast<int*>(al + Rc);

  const float* q = a.q + ((b * a.Hq + h * r) * n + rho0) * D;  // rows rho0 .. rho0 + rc - 1 of [R, D]
  float* out = a.out + ((b * a.Hq + h * r) * n + rho0) * D;
  for (int64_t x = threadIdx.x; x < rc * D; x += blockDim.x) {
    qs[x] = q[x] * a.sm_scale;
    acc[x] = 0.f;
  }
  for (int64_t x = threadIdx.x; x < rc; x += blockDim.x) {
    ms[x] = neg_inf();
    ls[x] = 0.f;
  }
  const int64_t* qlen = a.quant_len + b * n;
  int64_t qmin = qlen[0], qmax = qlen[0];
  for (int64_t i = 1; i < n; ++i) {
    qmin = qlen[i] < qmin ? qlen[i] : qmin;
    qmax = qlen[i] > qmax ? qlen[i] : qmax;
  }
  const int64_t total = a.lengths[b] + n, start = a.buffer_start[b];
  const float* kbuf = a.k_buffer + task * a.F * D;  // token t's row: kbuf + (t - start) * D
  const float* vbuf = a.v_buffer + task * a.F * D;
  __syncthreads();

  for (int64_t t0 = 0; t0 < total; t0 += tile) {
    const int64_t tt = total - t0 < tile ? total - t0 : tile;
    for (int64_t u = threadIdx.x; u < tt; u += blockDim.x) {
      const int64_t t = t0 + u;
      flags[u] = ((t < qmax && in_quant(a, t)) ? 1 : 0) | ((t >= qmin && in_buffer(a, b, t)) ? 2 : 0);
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < tt * D; x += blockDim.x) {  // keys
      const int64_t u = x / D, d = x % D, t = t0 + u;
      if (flags[u] & 1) kq[x] = quant_key(a, task, t, d);
      if (flags[u] & 2) kf[x] = kbuf[(t - start) * D + d];
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < rc * tt; x += blockDim.x) {  // scores
      const int64_t rr = x / tt, u = x % tt, t = t0 + u, i = (rho0 + rr) % n;
      const bool quant = t < qlen[i];
      float s = neg_inf();
      if (visible(a, b, i, t) && (flags[u] & (quant ? 1 : 2))) {
        const float* k = (quant ? kq : kf) + u * D;
        const float* qr = qs + rr * D;
        s = 0.f;
        for (int64_t d = 0; d < D; ++d) s = fmaf(qr[d], k[d], s);
      }
      ps[rr * tile + u] = s;
    }
    __syncthreads();
    for (int64_t rr = threadIdx.x; rr < rc; rr += blockDim.x) {  // running softmax, one thread per query
      float* pr = ps + rr * tile;
      float block_max = neg_inf();
      for (int64_t u = 0; u < tt; ++u) block_max = pr[u] > block_max ? pr[u] : block_max;
      const float alpha = online_rescale(ms[rr], block_max);
      float sum = ls[rr] * alpha;
      for (int64_t u = 0; u < tt; ++u) {
        pr[u] = exp_shifted(pr[u], ms[rr]);
        sum += pr[u];
      }
      ls[rr] = sum;
      al[rr] = alpha;
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < tt * D; x += blockDim.x) {  // values, into the key tiles
      const int64_t u = x / D, d = x % D, t = t0 + u;
      if (flags[u] & 1) kq[x] = quant_value(a, task, t, d);
      if (flags[u] & 2) kf[x] = vbuf[(t - start) * D + d];
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < rc * D; x += blockDim.x) {
      const int64_t rr = x / D, d = x % D, i = (rho0 + rr) % n;
      float v = acc[x] * al[rr];
      for (int64_t u = 0; u < tt; ++u) {
        const float p = ps[rr * tile + u];
        if (p != 0.f) v = fmaf(p, ((t0 + u) < qlen[i] ? kq : kf)[u * D + d], v);
      }
      acc[x] = v;
    }
    __syncthreads();
  }
  for (int64_t x = threadIdx.x; x < rc * D; x += blockDim.x) out[x] = acc[x] / ls[x / D];
}

}  // namespace

cudaError_t launch_quant_attention(const Args& a, cudaStream_t stream) {
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0 || a.D <= 0 || a.D % 2 != 0 || a.D > 1024 || a.n <= 0)
    return cudaErrorInvalidValue;
  const int64_t R = (a.Hq / a.Hkv) * a.n;
  if (a.B * a.Hkv == 0 || R == 0) return cudaSuccess;
  // Tile: 16 tokens up to D = 256, fewer beyond, so the two decoded tiles take at most half the
  // shared memory; the queries of a chunk fill the rest.
  const int64_t tile = std::max<int64_t>(1, std::min<int64_t>(16, 4096 / a.D));
  const int64_t fixed = 2 * tile * a.D + tile;    // kq, kf, flags
  const int64_t per_query = 2 * a.D + tile + 3;   // qs, acc, ps, m, l, alpha
  const int64_t Rc = std::min<int64_t>(R, (kSharedFloats - fixed) / per_query);
  if (Rc < 1) return cudaErrorInvalidValue;
  const int64_t chunks = (R + Rc - 1) / Rc;
  if (chunks > 65535 || a.B * a.Hkv > 2147483647LL) return cudaErrorInvalidValue;
  const size_t shared = static_cast<size_t>(fixed + Rc * per_query) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(a.B * a.Hkv), static_cast<unsigned>(chunks));
  quant_attention_kernel<<<grid, kThreads, shared, stream>>>(a, Rc, tile);
  return cudaGetLastError();
}

}  // namespace specdec::qattn
