// Host/device qualifiers shared by every kernel header.
//
// Logic that both the CPU and CUDA kernels run (Philox, uniform/Gumbel transforms, acceptance
// rules, online softmax, nibble decode) is written once with SPECDEC_HD so the CPU kernels run the
// very same code as the CUDA kernels. No torch header may be included under csrc/kernels/.
#pragma once

#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#define SPECDEC_DEVICE __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif
