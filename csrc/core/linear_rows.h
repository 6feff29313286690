// linear_rows: a linear layer applied to a few rows, y = x · wᵀ (+ bias), reading the weight once.
//
// A verification forward multiplies a handful of rows (a draft tree's nodes) by every weight matrix of
// the model. For so few rows the product is bound by reading the weight from memory, but a BLAS GEMM with
// the weight transposed (what torch's F.linear calls on a CPU) reads it at a fraction of the memory's speed
// from about four rows on. Here each block of weight rows is read once, straight from the layer's own
// layout ([cols, depth], row-major), and multiplied with every input row while it is in cache: the cost of
// up to ~16 rows stays close to the cost of reading the weight.
#pragma once
#include <cstdint>

#include "core/simd.h"

namespace sssd {

struct LinearRows {
  const float* x;     // [rows, depth], row stride x_stride
  const float* w;     // [cols, depth], row-major (the layer's weight as stored)
  const float* bias;  // [cols] or nullptr
  float* y;           // [rows, cols], row stride y_stride
  int64_t rows, depth, cols, x_stride, y_stride;
  int64_t w_stride = 0;  // elements between weight rows; 0: depth (a dense weight)
};

// y = x · wᵀ (+ bias). OpenMP over blocks of weight rows on `threads` threads (0: OpenMP's default). `isa`
// other than kBest (tests) must be supported. Arguments are trusted: the bindings check shapes, strides,
// aliasing and the instruction set.
void linear_rows(const LinearRows& a, int threads, Isa isa = Isa::kBest);

// The straightforward triple loop (double accumulation): the unit tests' reference.
void linear_rows_reference(const LinearRows& a);

}  // namespace sssd
