#include "core/linear_rows.h"

#include <algorithm>

#include "core/linear_rows_block.h"
#include "core/parallel.h"

namespace sssd {
namespace {

using linear_detail::kColBlock;
using linear_detail::tile;
using simd::vf16;
using simd::vf4;
using simd::vf8;
constexpr int64_t kTileBytes = 192 << 10;  // weight rows per tile: read once from memory, then from L2

using TileFn = void (*)(const LinearRows&, int64_t, int64_t);

void tile_generic(const LinearRows& a, int64_t b, int64_t e) { tile<vf4, kColBlock<vf4>>(a, b, e); }
#if SSSD_X86
SSSD_TARGET_AVX512 void tile_avx512(const LinearRows& a, int64_t b, int64_t e) {
  tile<vf16, kColBlock<vf16>>(a, b, e);
}
SSSD_TARGET_AVX2 void tile_avx2(const LinearRows& a, int64_t b, int64_t e) { tile<vf8, kColBlock<vf8>>(a, b, e); }
#endif

TileFn tile_for(Isa isa) {
#if SSSD_X86
  if (isa == Isa::kAvx512) return tile_avx512;
  if (isa == Isa::kAvx2) return tile_avx2;
#endif
  return tile_generic;
}

}  // namespace

void linear_rows(const LinearRows& a, int threads, Isa isa) {
  if (a.rows <= 0 || a.cols <= 0) return;
  const TileFn run = tile_for(isa == Isa::kBest ? best_isa() : isa);
  const int64_t row_bytes = std::max<int64_t>(a.depth, 1) * static_cast<int64_t>(sizeof(float));
  int64_t per_tile = std::max<int64_t>(4, kTileBytes / row_bytes);
  per_tile -= per_tile % 4;
  const int64_t tiles = (a.cols + per_tile - 1) / per_tile;
  parallel_for(
      tiles, [&](int64_t t) { run(a, t * per_tile, std::min(a.cols, (t + 1) * per_tile)); }, 2, threads);
}

void linear_rows_reference(const LinearRows& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t c = 0; c < a.cols; ++c) {
      double s = a.bias != nullptr ? a.bias[c] : 0.0;
      const int64_t ws = a.w_stride > 0 ? a.w_stride : a.depth;
      for (int64_t k = 0; k < a.depth; ++k) s += double(a.x[r * a.x_stride + k]) * a.w[c * ws + k];
      a.y[r * a.y_stride + c] = static_cast<float>(s);
    }
  }
}

}  // namespace sssd
