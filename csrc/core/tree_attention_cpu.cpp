#include "core/tree_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/linear_rows_block.h"
#include "core/parallel.h"

namespace sssd {
namespace {

using simd::load;
using simd::vf16;
using simd::vf4;
using simd::vf8;

constexpr float kMasked = -std::numeric_limits<float>::infinity();

// One task's buffers, kept per thread: queries [M, D] and scores/weights [M, rows].
struct Scratch {
  std::vector<float> q, p, norm;
};

SSSD_INLINE bool visible(const uint64_t* mask_row, int64_t node) {
  return (mask_row[node >> 6] >> (node & 63)) & 1u;
}

// Row softmax in place over `len` scores (masked ones are -inf), weights e^((s - max)·scale) left
// unnormalised; returns their sum (0 when the row sees nothing: its weights are then all 0).
template <class V>
SSSD_INLINE float softmax_weights(float* row, int64_t len, float scale) {
  constexpr int lanes = simd::lanes<V>();
  const int64_t body = len - len % lanes;
  V vmax = simd::splat<V>(kMasked);
  for (int64_t j = 0; j < body; j += lanes) {
    const V x = load<V>(row + j);
    vmax = x > vmax ? x : vmax;
  }
  float mx = simd::hmax(vmax);
  for (int64_t j = body; j < len; ++j) mx = std::max(mx, row[j]);
  if (mx == kMasked) {
    std::fill(row, row + len, 0.0f);
    return 0.0f;
  }
  V vsum = V{};
  for (int64_t j = 0; j < body; j += lanes) {
    const V e = simd::exp_nonpositive<V>((load<V>(row + j) - mx) * scale);
    simd::store(row + j, e);
    vsum += e;
  }
  float sum = simd::hsum(vsum);
  for (int64_t j = body; j < len; ++j) {
    row[j] = row[j] == kMasked ? 0.0f : std::exp((row[j] - mx) * scale);
    sum += row[j];
  }
  return sum;
}

// out rows [m0, m0 + NR) x vectors [d0, d0 + NDV·lanes) = Σ_j p[m, j] · v_j, scaled by 1 / norm[m].
template <class V, int NR, int NDV>
SSSD_INLINE void weighted_values(const TreeAttentionCpu& a, const Scratch& s, int64_t b, int64_t g, int64_t m0,
                                 int64_t d0, int64_t len, int64_t ctx) {
  constexpr int lanes = simd::lanes<V>();
  V acc[NR][NDV] = {};
  const float* vc = a.v_cache + a.slots[b] * a.kc_slot + g * a.kc_head;
  const float* vt = a.v_tree + a.offsets[b] * a.vt_node + g * a.vt_head;
  const float* p = s.p.data() + m0 * len;
  for (int64_t j = 0; j < len; ++j) {
    const float* v = (j < ctx ? vc + j * a.kc_row : vt + (j - ctx) * a.vt_node) + d0;
    V vv[NDV];
    for (int k = 0; k < NDV; ++k) vv[k] = load<V>(v + k * lanes);
    for (int r = 0; r < NR; ++r) {
      const float w = p[r * len + j];
      for (int k = 0; k < NDV; ++k) acc[r][k] += w * vv[k];
    }
  }
  const int64_t group = a.heads / a.kv_heads;
  for (int r = 0; r < NR; ++r) {
    const int64_t m = m0 + r, node = a.offsets[b] + m / group, head = g * group + m % group;
    const float norm = s.norm[m];
    const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
    float* o = a.out + node * a.out_node + head * a.out_head + d0;
    for (int k = 0; k < NDV; ++k) simd::store(o + k * lanes, acc[r][k] * inv);
  }
}

template <class V, int NR>
SSSD_INLINE void weighted_values_rows(const TreeAttentionCpu& a, const Scratch& s, int64_t b, int64_t g,
                                      int64_t m0, int64_t len, int64_t ctx) {
  constexpr int lanes = simd::lanes<V>();
  const int64_t vectors = a.dim / lanes;
  for (int64_t k = 0; k < vectors; k += 4) {
    const int64_t d0 = k * lanes;
    switch (std::min<int64_t>(4, vectors - k)) {
      case 4: weighted_values<V, NR, 4>(a, s, b, g, m0, d0, len, ctx); break;
      case 3: weighted_values<V, NR, 3>(a, s, b, g, m0, d0, len, ctx); break;
      case 2: weighted_values<V, NR, 2>(a, s, b, g, m0, d0, len, ctx); break;
      default: weighted_values<V, NR, 1>(a, s, b, g, m0, d0, len, ctx); break;
    }
  }
}

// The head dimension's last dim % lanes entries (head dims that are not a multiple of the vector width).
void weighted_values_tail(const TreeAttentionCpu& a, const Scratch& s, int64_t b, int64_t g, int64_t len,
                          int64_t ctx, int64_t d_from) {
  const float* vc = a.v_cache + a.slots[b] * a.kc_slot + g * a.kc_head;
  const float* vt = a.v_tree + a.offsets[b] * a.vt_node + g * a.vt_head;
  const int64_t group = a.heads / a.kv_heads, rows = (a.offsets[b + 1] - a.offsets[b]) * group;
  for (int64_t m = 0; m < rows; ++m) {
    const int64_t node = a.offsets[b] + m / group, head = g * group + m % group;
    const float inv = s.norm[m] > 0.0f ? 1.0f / s.norm[m] : 0.0f;
    for (int64_t d = d_from; d < a.dim; ++d) {
      double acc = 0.0;
      for (int64_t j = 0; j < len; ++j) {
        const float* v = j < ctx ? vc + j * a.kc_row : vt + (j - ctx) * a.vt_node;
        acc += double(s.p[m * len + j]) * v[d];
      }
      a.out[node * a.out_node + head * a.out_head + d] = static_cast<float>(acc) * inv;
    }
  }
}

// Request b, KV head g: scores of its nodes' queries of g's query heads against its rows, softmax, values.
template <class V>
SSSD_INLINE void attend(const TreeAttentionCpu& a, int64_t b, int64_t g, Scratch& s) {
  const int64_t o = a.offsets[b], n = a.offsets[b + 1] - o, ctx = a.ctx_lens[b], len = ctx + n;
  const int64_t group = a.heads / a.kv_heads, rows = n * group, d = a.dim;
  s.q.resize(rows * d);
  s.p.resize(rows * len);
  s.norm.resize(rows);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < group; ++j) {
      std::memcpy(&s.q[(t * group + j) * d], a.q + (o + t) * a.q_node + (g * group + j) * a.q_head,
                  sizeof(float) * d);
    }
  }
  // scores: committed rows, then the tree's nodes (each K row read once for all the queries)
  const LinearRows committed{s.q.data(), a.k_cache + a.slots[b] * a.kc_slot + g * a.kc_head, nullptr, s.p.data(),
                             rows, d, ctx, d, len, a.kc_row};
  linear_detail::serial<V>(committed);
  const LinearRows tree{s.q.data(), a.k_tree + o * a.kt_node + g * a.kt_head, nullptr, s.p.data() + ctx,
                        rows, d, n, d, len, a.kt_node};
  linear_detail::serial<V>(tree);
  for (int64_t t = 0; t < n; ++t) {
    const uint64_t* mask = a.masks + (o + t) * 2;
    for (int64_t j = 0; j < group; ++j) {
      float* row = &s.p[(t * group + j) * len];
      for (int64_t k = 0; k < n; ++k) {
        if (!visible(mask, k)) row[ctx + k] = kMasked;
      }
      s.norm[t * group + j] = softmax_weights<V>(row, len, a.scale);
      for (int64_t k = 0; k < n; ++k) {  // the clamped exponential of a masked score is tiny, not 0
        if (!visible(mask, k)) row[ctx + k] = 0.0f;
      }
    }
  }
  constexpr int kRows = 4;  // output rows accumulated together (x up to 4 vectors of the head dim)
  for (int64_t m0 = 0; m0 < rows; m0 += kRows) {
    switch (std::min<int64_t>(kRows, rows - m0)) {
      case 4: weighted_values_rows<V, 4>(a, s, b, g, m0, len, ctx); break;
      case 3: weighted_values_rows<V, 3>(a, s, b, g, m0, len, ctx); break;
      case 2: weighted_values_rows<V, 2>(a, s, b, g, m0, len, ctx); break;
      default: weighted_values_rows<V, 1>(a, s, b, g, m0, len, ctx); break;
    }
  }
  constexpr int lanes = simd::lanes<V>();
  if (d % lanes != 0) weighted_values_tail(a, s, b, g, len, ctx, d - d % lanes);
}

using TaskFn = void (*)(const TreeAttentionCpu&, int64_t, int64_t, Scratch&);

void task_generic(const TreeAttentionCpu& a, int64_t b, int64_t g, Scratch& s) { attend<vf4>(a, b, g, s); }
#if SSSD_X86
SSSD_TARGET_AVX512 void task_avx512(const TreeAttentionCpu& a, int64_t b, int64_t g, Scratch& s) {
  attend<vf16>(a, b, g, s);
}
SSSD_TARGET_AVX2 void task_avx2(const TreeAttentionCpu& a, int64_t b, int64_t g, Scratch& s) {
  attend<vf8>(a, b, g, s);
}
#endif

TaskFn task_for(Isa isa) {
#if SSSD_X86
  if (isa == Isa::kAvx512) return task_avx512;
  if (isa == Isa::kAvx2) return task_avx2;
#endif
  return task_generic;
}

}  // namespace

void tree_attention_cpu(const TreeAttentionCpu& a, int threads, Isa isa) {
  if (a.batch <= 0 || a.kv_heads <= 0) return;
  const TaskFn run = task_for(isa == Isa::kBest ? best_isa() : isa);
  parallel_for(
      a.batch * a.kv_heads,
      [&](int64_t i) {
        thread_local Scratch scratch;
        run(a, i / a.kv_heads, i % a.kv_heads, scratch);
      },
      2, threads);
}

void tree_attention_cpu_reference(const TreeAttentionCpu& a) {
  const int64_t group = a.heads / a.kv_heads, d = a.dim;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t o = a.offsets[b], n = a.offsets[b + 1] - o, ctx = a.ctx_lens[b];
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < a.heads; ++h) {
        const int64_t g = h / group;
        const float* q = a.q + (o + t) * a.q_node + h * a.q_head;
        std::vector<double> w;
        std::vector<const float*> vrows;
        for (int64_t j = 0; j < ctx + n; ++j) {
          const bool tree = j >= ctx;
          if (tree && !visible(a.masks + (o + t) * 2, j - ctx)) continue;
          const int64_t off = g * (tree ? a.kt_head : a.kc_head);
          const float* k = tree ? a.k_tree + (o + j - ctx) * a.kt_node + off
                                : a.k_cache + a.slots[b] * a.kc_slot + off + j * a.kc_row;
          double s = 0.0;
          for (int64_t e = 0; e < d; ++e) s += double(q[e]) * k[e];
          w.push_back(s * a.scale);
          vrows.push_back(tree ? a.v_tree + (o + j - ctx) * a.vt_node + g * a.vt_head
                               : a.v_cache + a.slots[b] * a.kc_slot + off + j * a.kc_row);
        }
        const double mx = w.empty() ? 0.0 : *std::max_element(w.begin(), w.end());
        double sum = 0.0;
        for (double& x : w) sum += (x = std::exp(x - mx));
        float* out = a.out + (o + t) * a.out_node + h * a.out_head;
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0.0;
          for (size_t j = 0; j < w.size(); ++j) acc += w[j] * vrows[j][e];
          out[e] = w.empty() ? 0.0f : static_cast<float>(acc / sum);
        }
      }
    }
  }
}

}  // namespace sssd
