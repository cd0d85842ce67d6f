// pybind11 face of the n-gram index (csrc/kernels/ngram): the class `specdec_cuda._C.NgramIndex`
// and the batched `ngram_lookup` / `ngram_extend_rows`. Not tensor ops: the index is host state
// kept per request, so it lives in the pybind11 module rather than in the op schema.
// Argument errors raise ValueError / TypeError naming the input (pybind11 maps
// std::invalid_argument from the kernels to ValueError).
// ATen and torch's pybind11 type casters (the tensors cross into Python here) rather than
// <torch/extension.h>, which adds the C++ frontend (torch::nn, optim, data) on top. The casters'
// header is itself most of this file's ~50 s compile, so this saved little (53 -> 52 s measured).
#include "ops/aten.h"
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ngram/ngram_index.h"

namespace {

namespace py = pybind11;
using specdec::ngram::NgramIndex;

// A CPU int64 copy of an integer tensor of `dim` dimensions (int32 / int64 accepted).
at::Tensor cpu_int64(const at::Tensor& t, int64_t dim, const char* name) {
  if (t.scalar_type() != at::kLong && t.scalar_type() != at::kInt)
    throw py::type_error(std::string(name) + ": expected an int64 or int32 tensor, got " +
                         std::string(c10::toString(t.scalar_type())));
  if (t.dim() != dim)
    throw py::value_error(std::string(name) + ": expected " + std::to_string(dim) +
                          " dimension(s), got shape " + c10::str(t.sizes()));
  return t.to(at::kCPU, at::kLong).contiguous();
}

// Row b's index: None -> nullptr (no draft for that row); anything else must be an NgramIndex.
std::vector<NgramIndex*> index_list(const py::sequence& indexes, const char* name) {
  std::vector<NgramIndex*> out;
  out.reserve(indexes.size());
  for (size_t b = 0; b < indexes.size(); ++b) {
    py::object item = indexes[b];
    if (item.is_none()) {
      out.push_back(nullptr);
      continue;
    }
    if (!py::isinstance<NgramIndex>(item))
      throw py::type_error(std::string(name) + "[" + std::to_string(b) +
                           "]: expected an NgramIndex or None, got " +
                           std::string(py::str(py::type::of(item))));
    out.push_back(item.cast<NgramIndex*>());
  }
  return out;
}

void extend(NgramIndex& index, const at::Tensor& tokens) {
  // tokens: (n,)
  const at::Tensor t = cpu_int64(tokens, 1, "tokens");
  index.extend(t.data_ptr<int64_t>(), t.numel());
}

at::Tensor tokens_of(const NgramIndex& index) {
  // (size,) int64 copy
  auto out = at::empty({index.size()}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < index.size(); ++i) p[i] = index.tokens()[i];
  return out;
}

int64_t count(const NgramIndex& index, const at::Tensor& ngram) {
  // ngram: (n,)
  const at::Tensor t = cpu_int64(ngram, 1, "ngram");
  std::vector<int32_t> g(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = t.data_ptr<int64_t>()[i];
    if (v < 0 || v > INT32_MAX) return 0;  // never indexed
    g[i] = static_cast<int32_t>(v);
  }
  return index.count(g.data(), static_cast<int>(std::min<int64_t>(t.numel(), INT32_MAX)));
}

py::tuple lookup(const py::sequence& indexes, const py::object& corpus, int64_t k,
                 int64_t num_candidates, int64_t max_occurrences, const at::Tensor& max_nodes,
                 const std::optional<at::Tensor>& max_depth) {
  const std::vector<NgramIndex*> rows = index_list(indexes, "indexes");
  const int64_t batch = static_cast<int64_t>(rows.size());
  const NgramIndex* shared = nullptr;
  if (!corpus.is_none()) {
    if (!py::isinstance<NgramIndex>(corpus))
      throw py::type_error("corpus: expected an NgramIndex or None, got " +
                           std::string(py::str(py::type::of(corpus))));
    shared = corpus.cast<NgramIndex*>();
  }
  // Bounds before the width product, so it cannot overflow and the outputs stay a sane size.
  if (k < 1 || k > 4096 || num_candidates < 1 || num_candidates > 4096 || max_occurrences < 1 ||
      max_occurrences > (1 << 20))
    throw py::value_error("ngram_lookup: need 1 <= k <= 4096, 1 <= num_candidates <= 4096 and "
                          "1 <= max_occurrences <= 2^20, got k=" + std::to_string(k) +
                          ", num_candidates=" + std::to_string(num_candidates) +
                          ", max_occurrences=" + std::to_string(max_occurrences));
  // max_nodes: (B,) node budget per row
  const at::Tensor budget = cpu_int64(max_nodes, 1, "max_nodes");
  if (budget.size(0) != batch)
    throw py::value_error("max_nodes: expected shape (" + std::to_string(batch) + ",), got " +
                          c10::str(budget.sizes()));
  // max_depth: (B,) most tokens per candidate, or None (= k)
  at::Tensor depth;
  if (max_depth.has_value()) {
    depth = cpu_int64(*max_depth, 1, "max_depth");
    if (depth.size(0) != batch)
      throw py::value_error("max_depth: expected shape (" + std::to_string(batch) + ",), got " +
                            c10::str(depth.sizes()));
  }
  const int64_t width = k * num_candidates;
  auto tokens = at::empty({batch, width}, at::kLong);   // (B, width)
  auto parents = at::empty({batch, width}, at::kLong);  // (B, width)
  auto num_nodes = at::empty({batch}, at::kLong);       // (B,)
  std::vector<const NgramIndex*> const_rows(rows.begin(), rows.end());
  specdec::ngram::lookup_batch(
      const_rows, shared, static_cast<int>(k), static_cast<int>(num_candidates),
      static_cast<int>(max_occurrences), budget.data_ptr<int64_t>(),
      max_depth.has_value() ? depth.data_ptr<int64_t>() : nullptr,
      specdec::ngram::DraftRows{tokens.data_ptr<int64_t>(), parents.data_ptr<int64_t>(),
                                num_nodes.data_ptr<int64_t>(), width});
  return py::make_tuple(tokens, parents, num_nodes);
}

void extend_rows(const py::sequence& indexes, const at::Tensor& tokens,
                 const at::Tensor& num_tokens) {
  const std::vector<NgramIndex*> rows = index_list(indexes, "indexes");
  const int64_t batch = static_cast<int64_t>(rows.size());
  // tokens: (B, m), row b's new tokens in tokens[b, :num_tokens[b]]; num_tokens: (B,)
  const at::Tensor t = cpu_int64(tokens, 2, "tokens");
  const at::Tensor n = cpu_int64(num_tokens, 1, "num_tokens");
  if (t.size(0) != batch || n.size(0) != batch)
    throw py::value_error("ngram_extend_rows: tokens " + c10::str(t.sizes()) + " and num_tokens " +
                          c10::str(n.sizes()) + " must have " + std::to_string(batch) +
                          " rows (one per index)");
  const int64_t m = t.size(1);
  const int64_t* counts = n.data_ptr<int64_t>();
  // All rows are checked before any index changes, so an error leaves every index as it was.
  for (int64_t b = 0; b < batch; ++b) {
    if (counts[b] < 0 || counts[b] > m)
      throw py::value_error("num_tokens[" + std::to_string(b) + "] = " + std::to_string(counts[b]) +
                            " is outside [0, " + std::to_string(m) + "]");
    if (!rows[b] && counts[b] > 0)
      throw py::value_error("indexes[" + std::to_string(b) + "] is None but num_tokens[" +
                            std::to_string(b) + "] = " + std::to_string(counts[b]));
    const int64_t* row = t.data_ptr<int64_t>() + b * m;
    for (int64_t j = 0; j < counts[b]; ++j)
      if (row[j] < 0 || row[j] > INT32_MAX)
        throw py::value_error("tokens[" + std::to_string(b) + ", " + std::to_string(j) + "] = " +
                              std::to_string(row[j]) + " is not a token id in [0, 2^31)");
  }
  for (int64_t b = 0; b < batch; ++b)
    if (rows[b]) rows[b]->extend(t.data_ptr<int64_t>() + b * m, counts[b]);
}

}  // namespace

void register_ngram(py::module_& m) {
  py::class_<NgramIndex>(m, "NgramIndex",
                         "Per-request (or static corpus) n-gram index; see specdec_cuda.ngram.")
      .def(py::init<int, int>(), py::arg("n_min"), py::arg("n_max"))
      .def("extend", &extend, py::arg("tokens"), "append committed tokens (1-D int tensor)")
      .def("start_document", &NgramIndex::start_document,
           "later tokens start a new document (no n-gram crosses the boundary)")
      .def("tokens", &tokens_of, "the indexed tokens, (size,) int64")
      .def("count", &count, py::arg("ngram"), "occurrences of an n-gram with a following token")
      .def("memory_bytes", &NgramIndex::memory_bytes, "bytes held, capacity included")
      .def("document_starts", &NgramIndex::document_starts)
      .def("__len__", &NgramIndex::size)
      .def_property_readonly("n_min", &NgramIndex::n_min)
      .def_property_readonly("n_max", &NgramIndex::n_max)
      .def_property_readonly("num_documents", &NgramIndex::num_documents)
      .def("to_bytes", [](const NgramIndex& ix) { return py::bytes(ix.serialize()); },
           "the file image (header, tokens, document starts, checksum)")
      .def_static("from_bytes", [](const py::bytes& image) {
        const std::string s = image;
        return NgramIndex::deserialize(s.data(), s.size());
      }, py::arg("image"), "an index from its file image; ValueError if it is corrupt");
  m.def("ngram_lookup", &lookup, py::arg("indexes"), py::arg("corpus"), py::arg("k"),
        py::arg("num_candidates"), py::arg("max_occurrences"), py::arg("max_nodes"),
        py::arg("max_depth") = py::none(),
        "batched draft-tree lookup: (tokens [B, W], parents [B, W], num_nodes [B]), W = k * "
        "num_candidates");
  m.def("ngram_extend_rows", &extend_rows, py::arg("indexes"), py::arg("tokens"),
        py::arg("num_tokens"), "append tokens[b, :num_tokens[b]] to indexes[b] for every row");
}
