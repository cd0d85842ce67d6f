// CPU kernel of the DDTree build: the search, the padding and the mask rows of one batch row.
#include "kernels/ddtree/ddtree.h"

#include <cstring>

namespace specdec {
namespace ddtree {

void build_row_cpu(const BuildArgs& a, int64_t b) {
  finish_row(a, b, build_row(a, b, row_work(a, b)));
  const int64_t n = a.budget + 1;
  std::memset(a.tree_mask + b * n * n, 0, static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) mark_ancestors(a, b, i);
}

}  // namespace ddtree
}  // namespace specdec
