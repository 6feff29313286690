// The blocks of linear_rows as inline templates over the vector type, for the ISA entry points of the
// kernels that multiply a few rows by many (linear_rows itself, tree_attention_cpu's scores).
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/linear_rows.h"
#include "core/simd.h"

namespace sssd {
namespace linear_detail {

using simd::hsum;
using simd::load;

constexpr int kRowBlock = 4;               // input rows multiplied with each weight row loaded
// Weight elements fetched ahead of use. The loop does several multiplications per weight vector, so it
// asks for memory more slowly than a one-row product; without the hint the weight streams well below the
// memory's speed from four rows on (docs/benchmarks.md, "The engine against vLLM").
constexpr int64_t kPrefetch = 256;

// y[r, c] for NR input rows from r0 and NC weight rows from c0, in vectors V: NR x NC accumulators.
template <class V, int NR, int NC>
SSSD_INLINE void block(const LinearRows& a, int64_t r0, int64_t c0) {
  constexpr int lanes = simd::lanes<V>();
  V acc[NR][NC] = {};
  const int64_t d = a.depth, body = d - d % lanes;
  const float* x[NR];
  const float* w[NC];
  for (int r = 0; r < NR; ++r) x[r] = a.x + (r0 + r) * a.x_stride;
  const int64_t ws = a.w_stride > 0 ? a.w_stride : d;
  for (int c = 0; c < NC; ++c) w[c] = a.w + (c0 + c) * ws;
  for (int64_t k = 0; k < body; k += lanes) {
    V wv[NC];
    for (int c = 0; c < NC; ++c) {
      __builtin_prefetch(w[c] + k + kPrefetch);  // a hint: past the row's end it is harmless
      wv[c] = load<V>(w[c] + k);
    }
    for (int r = 0; r < NR; ++r) {
      const V xv = load<V>(x[r] + k);
      for (int c = 0; c < NC; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < NR; ++r) {
    float* y = a.y + (r0 + r) * a.y_stride + c0;
    for (int c = 0; c < NC; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t k = body; k < d; ++k) s += x[r][k] * w[c][k];
      y[c] = a.bias != nullptr ? s + a.bias[c0 + c] : s;
    }
  }
}

template <class V, int NR, int NC>
SSSD_INLINE void block_cols(const LinearRows& a, int64_t r0, int64_t c0, int64_t nc) {
  static_assert(NC == 2 || NC == 4, "weight rows per block: 2 or 4");
  if (nc == NC) return block<V, NR, NC>(a, r0, c0);
  if constexpr (NC == 4) {
    if (nc == 3) return block<V, NR, 3>(a, r0, c0);
    if (nc == 2) return block<V, NR, 2>(a, r0, c0);
  }
  block<V, NR, 1>(a, r0, c0);
}

// Weight rows [c_begin, c_end) for every input row: each group of NC weight rows is multiplied with every
// block of kRowBlock input rows while it is in L1, so the weight streams from memory once, under the
// arithmetic of all the rows (the memory's prefetchers run ahead meanwhile). NC x kRowBlock accumulators
// must fit the ISA's registers with room for the loads: 16 of 32 with AVX-512, 8 of 16 with AVX2 and SSE.
template <class V, int NC>
SSSD_INLINE void tile(const LinearRows& a, int64_t c_begin, int64_t c_end) {
  for (int64_t c0 = c_begin; c0 < c_end; c0 += NC) {
    const int64_t nc = std::min<int64_t>(NC, c_end - c0);
    for (int64_t r0 = 0; r0 < a.rows; r0 += kRowBlock) {
      const int64_t nr = std::min<int64_t>(kRowBlock, a.rows - r0);
      switch (nr) {
        case 4: block_cols<V, 4, NC>(a, r0, c0, nc); break;
        case 3: block_cols<V, 3, NC>(a, r0, c0, nc); break;
        case 2: block_cols<V, 2, NC>(a, r0, c0, nc); break;
        default: block_cols<V, 1, NC>(a, r0, c0, nc); break;
      }
    }
  }
}

// Weight rows per block by vector width: NC x kRowBlock accumulators must fit the ISA's registers with
// room for the loads (16 of 32 with AVX-512, 8 of 16 with AVX2 and SSE).
template <class V>
constexpr int kColBlock = simd::lanes<V>() == 16 ? 4 : 2;

// y = x · wᵀ (+ bias) on the calling thread with the vectors V.
template <class V>
SSSD_INLINE void serial(const LinearRows& a) {
  if (a.rows > 0 && a.cols > 0) tile<V, kColBlock<V>>(a, 0, a.cols);
}

}  // namespace linear_detail
}  // namespace sssd
