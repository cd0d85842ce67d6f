// CPU kernel of the DDTree build: the search, the padding and the mask rows of one batch row.
#include "kernels/ddtree/ddtree.h"

namespace specdec {
namespace ddtree {

void build_row_cpu(const BuildArgs& a, int64_t b) {
  finish_row(a, b, build_row(a, b));
  for (int64_t i = 0; i <= a.budget; ++i) mask_row(a, b, i);
}

}  // namespace ddtree
}  // namespace specdec
