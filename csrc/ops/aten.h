// The ATen the op glue uses: Tensor and its methods, and the few free functions it calls (at::empty,
// at::zeros). Not <ATen/ATen.h>, which declares every ATen operator: parsing it was ~10 s of each
// glue file's compile, and the glue is ~30 files, built again by each of CI's builds. A file that
// calls another operator includes its <ATen/ops/NAME.h> itself; TORCH_ASSERT_ONLY_METHOD_OPERATORS
// turns an accidental <ATen/Functions.h> (or <ATen/ATen.h>) into a compile error.
#pragma once

#ifndef TORCH_ASSERT_ONLY_METHOD_OPERATORS
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#endif

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
