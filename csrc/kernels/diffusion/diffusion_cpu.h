// CPU kernels of the diffusion family (torch-free): the two steps of `diffusion_unmask`
// (kernels/diffusion/unmask.h). Each handles a range so the glue can spread it with
// at::parallel_for; positions are independent in step 1, rows in step 2.
#pragma once

#include <cstdint>

#include "kernels/diffusion/unmask.h"

namespace specdec {
namespace diffusion {

// Step 1 for flat positions [begin, end) (index b * width + w): sampled, confidence and
// position_status of each masked position of a row whose parameters are valid.
void unmask_positions_cpu(const UnmaskArgs& a, int64_t begin, int64_t end);

// Step 2 for rows [begin, end): status and keep of every position of the row.
void unmask_select_cpu(const UnmaskArgs& a, int64_t begin, int64_t end);

}  // namespace diffusion
}  // namespace specdec
