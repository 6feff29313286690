#include "core/linear_rows.h"

#include <algorithm>
#include <cstring>

#include "core/parallel.h"

// The 64-byte vector helpers below are always inlined into the ISA-specific clones of tile(); GCC still
// notes that passing such vectors to an out-of-line function would depend on the ISA, which never happens.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace sssd {
namespace {

typedef float vf16 __attribute__((vector_size(64)));  // one AVX-512 register
typedef float vf8 __attribute__((vector_size(32)));   // one AVX2 register
typedef float vf4 __attribute__((vector_size(16)));   // one SSE register
constexpr int kRowBlock = 4;                          // input rows multiplied with each weight row loaded
constexpr int64_t kTileBytes = 192 << 10;             // weight rows per tile: read once, then from L2
// Weight elements fetched ahead of use. The loop does several multiplications per weight vector, so it
// asks for memory more slowly than a one-row product; without the hint the weight streams well below the
// memory's speed from four rows on (docs/benchmarks.md, "The engine against vLLM").
constexpr int64_t kPrefetch = 256;

template <class V>
__attribute__((always_inline)) inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Sums of a vector's lanes as a tree of additions (log2(lanes) dependent steps, not lanes).
__attribute__((always_inline)) inline float hsum(vf4 v) { return (v[0] + v[2]) + (v[1] + v[3]); }
__attribute__((always_inline)) inline float hsum(vf8 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
__attribute__((always_inline)) inline float hsum(vf16 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

// y[r, c] for NR input rows from r0 and NC weight rows from c0, in vectors V: NR x NC accumulators.
template <class V, int NR, int NC>
__attribute__((always_inline)) inline void block(const LinearRows& a, int64_t r0, int64_t c0) {
  constexpr int lanes = sizeof(V) / sizeof(float);
  V acc[NR][NC] = {};
  const int64_t d = a.depth, body = d - d % lanes;
  const float* x[NR];
  const float* w[NC];
  for (int r = 0; r < NR; ++r) x[r] = a.x + (r0 + r) * a.x_stride;
  for (int c = 0; c < NC; ++c) w[c] = a.w + (c0 + c) * d;
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
__attribute__((always_inline)) inline void block_cols(const LinearRows& a, int64_t r0, int64_t c0, int64_t nc) {
  static_assert(NC == 2 || NC == 4, "weight rows per block: 2 or 4");
  if (nc == NC) return block<V, NR, NC>(a, r0, c0);
  if constexpr (NC == 4) {
    if (nc == 3) return block<V, NR, 3>(a, r0, c0);
    if (nc == 2) return block<V, NR, 2>(a, r0, c0);
  }
  block<V, NR, 1>(a, r0, c0);
}

// Weight rows [c_begin, c_end) for every input row: each group of NC weight rows is multiplied with every
// block of kRowBlock input rows (from L2 after the first block). NC x kRowBlock accumulators must fit the
// ISA's registers with room for the loads: 16 of 32 with AVX-512, 8 of 16 with AVX2 and SSE.
template <class V, int NC>
__attribute__((always_inline)) inline void tile(const LinearRows& a, int64_t c_begin, int64_t c_end) {
  for (int64_t r0 = 0; r0 < a.rows; r0 += kRowBlock) {
    const int64_t nr = std::min<int64_t>(kRowBlock, a.rows - r0);
    for (int64_t c0 = c_begin; c0 < c_end; c0 += NC) {
      const int64_t nc = std::min<int64_t>(NC, c_end - c0);
      switch (nr) {
        case 4: block_cols<V, 4, NC>(a, r0, c0, nc); break;
        case 3: block_cols<V, 3, NC>(a, r0, c0, nc); break;
        case 2: block_cols<V, 2, NC>(a, r0, c0, nc); break;
        default: block_cols<V, 1, NC>(a, r0, c0, nc); break;
      }
    }
  }
}

using TileFn = void (*)(const LinearRows&, int64_t, int64_t);

void tile_generic(const LinearRows& a, int64_t b, int64_t e) { tile<vf4, 2>(a, b, e); }

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma"))) void tile_avx512(const LinearRows& a, int64_t b,
                                                                                   int64_t e) {
  tile<vf16, 4>(a, b, e);
}
__attribute__((target("avx2,fma"))) void tile_avx2(const LinearRows& a, int64_t b, int64_t e) {
  tile<vf8, 2>(a, b, e);
}
#endif

bool cpu_runs(LinearIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (isa == LinearIsa::kAvx512) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }
  if (isa == LinearIsa::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == LinearIsa::kGeneric || isa == LinearIsa::kBest;
}

TileFn tile_for(LinearIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa == LinearIsa::kAvx512) return tile_avx512;
  if (isa == LinearIsa::kAvx2) return tile_avx2;
#endif
  return tile_generic;
}

// The widest vectors this CPU runs (asked of the CPU itself, once).
LinearIsa best_isa() {
  for (LinearIsa isa : {LinearIsa::kAvx512, LinearIsa::kAvx2}) {
    if (cpu_runs(isa)) return isa;
  }
  return LinearIsa::kGeneric;
}

}  // namespace

bool linear_isa_supported(LinearIsa isa) { return cpu_runs(isa); }

void linear_rows(const LinearRows& a, int threads, LinearIsa isa) {
  if (a.rows <= 0 || a.cols <= 0) return;
  static const TileFn best = tile_for(best_isa());
  const TileFn run = isa == LinearIsa::kBest ? best : tile_for(isa);
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
      for (int64_t k = 0; k < a.depth; ++k) s += double(a.x[r * a.x_stride + k]) * a.w[c * a.depth + k];
      a.y[r * a.y_stride + c] = static_cast<float>(s);
    }
  }
}

}  // namespace sssd
