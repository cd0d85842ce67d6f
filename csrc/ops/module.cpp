// The pybind11 module `specdec_cuda._C`: what is not a tensor op. Importing it also runs the
// static registrations of every TORCH_LIBRARY / TORCH_LIBRARY_IMPL block linked into the module.
// pybind11 (the copy torch ships, as <torch/extension.h> would use) and c10's TORCH_CHECK alone:
// nothing here takes a tensor, and <torch/extension.h>'s C++ frontend and ATen were nearly all of
// this file's compile time.
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/skinny_linear/packed_cpu.h"
#ifdef SPECDEC_WITH_CUDA
#include "kernels/quant/w4a16_cuda.h"
#endif

void register_ngram(pybind11::module_& m);  // csrc/ops/ngram_binding.cpp

#ifndef SPECDEC_TORCH_VERSION
#error "setup.py defines SPECDEC_TORCH_VERSION"
#endif

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["version"] = std::string(SPECDEC_VERSION);
  info["torch_version"] = std::string(SPECDEC_TORCH_VERSION);
#ifdef SPECDEC_WITH_CUDA
  info["with_cuda"] = true;
  info["cuda_archs"] = std::string(SPECDEC_CUDA_ARCHS);
#else
  info["with_cuda"] = false;
  info["cuda_archs"] = std::string("");
#endif
  return info;
}

// The raw Philox stream, so tests can hold the kernels' RNG to python/.../reference/philox.py.
std::vector<uint32_t> random_bits(uint64_t seed, int64_t position, uint32_t purpose,
                                  uint32_t substream, uint32_t first, uint32_t count) {
  const specdec::RandomStream stream(seed, position, purpose, substream);
  std::vector<uint32_t> out(count);
  for (uint32_t i = 0; i < count; ++i) out[i] = stream.element(first + i);
  return out;
}

std::vector<uint32_t> philox4x32_10(std::vector<uint32_t> counter, std::vector<uint32_t> key) {
  TORCH_CHECK(counter.size() == 4 && key.size() == 2, "philox4x32_10: counter has 4 words, key 2");
  const auto out = specdec::philox4x32_10(counter[0], counter[1], counter[2], counter[3], key[0],
                                          key[1]);
  return {out.x[0], out.x[1], out.x[2], out.x[3]};
}

#ifdef SPECDEC_WITH_CUDA
// The W4A16 tensor-core kernel's launch configurations, in table order (index = the `tuning`
// argument of torch.ops.specdec._w4a16_matmul_tuned).
pybind11::list w4a16_cuda_tunings() {
  pybind11::list out;
  for (int i = 0; i < specdec::quant::w4a16_mma_tuning_count(); ++i) {
    const auto t = specdec::quant::w4a16_mma_tuning(i);
    pybind11::dict d;
    d["index"] = i;
    d["rows"] = t.rows;
    d["tiles_n"] = t.tiles_n;
    d["stages"] = t.stages;
    d["warps"] = t.warps;
    pybind11::list auto_rows;  // M values the automatic choice launches this entry for
    for (int64_t m = 1; m <= specdec::quant::kMmaMaxM; ++m)
      if (specdec::quant::w4a16_mma_auto_tuning(m) == i) auto_rows.append(m);
    d["auto_for_rows"] = auto_rows;
    out.append(d);
  }
  return out;
}
#endif

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "specdec_cuda native module: build information and non-tensor helpers";
  m.def("build_info", &build_info, "What this binary was built against and with.");
  m.def("random_bits", &random_bits, "count uint32 draws of one Philox stream from element first",
        pybind11::arg("seed"), pybind11::arg("position"), pybind11::arg("purpose"),
        pybind11::arg("substream"), pybind11::arg("first"), pybind11::arg("count"));
  m.def("philox4x32_10", &philox4x32_10, "one raw Philox4x32-10 block (for known-answer tests)");
  m.def("skinny_linear_packed_isa", &specdec::skinny::packed_linear_cpu_isa,
        "'avx512' or 'avx2' when skinny_linear_packed runs a vector kernel on this CPU, else 'portable'");
  m.def("skinny_linear_packed_isa_bf16", &specdec::skinny::packed_linear_cpu_isa_bf16,
        "the tier bfloat16 panels run: 'amx' where the AMX tier is on, else skinny_linear_packed_isa()");
  register_ngram(m);
#ifdef SPECDEC_WITH_CUDA
  m.def("w4a16_cuda_tunings", &w4a16_cuda_tunings,
        "launch configurations of the W4A16 tensor-core kernel (for tuning sweeps)");
#endif
}
