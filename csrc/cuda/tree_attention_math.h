// Index arithmetic and softmax algebra of the tree attention kernel, shared by the CUDA kernel and by its
// host emulation (tree_attention_emulate.h) so that the CPU tests exercise the very functions the GPU runs.
// Plain C++17 when compiled by a host compiler; __host__ __device__ under nvcc. No CUDA headers needed.
//
// Work decomposition (see docs/cuda.md):
//   request i owns query rows r = node * group + g  (node-major: node in [0, n_i), g in [0, group))
//   a block covers kRowsPerWarp * warps consecutive rows of one request and one KV head;
//   the context [0, ctx_i) is cut into chunks of `chunk` keys (a multiple of kKeyTile); split s handles
//   chunk s; the last split of a request also handles the tree keys (masked by the ancestor bits).
//   Scores live in the log2 domain: s2 = (q . k) * scale * log2(e), so exp2 replaces exp.
#pragma once
#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define SSSD_HD __host__ __device__ __forceinline__
#else
#define SSSD_HD inline
#endif

namespace sssd_cuda {

constexpr int kKeyTile = 64;      // keys per shared-memory K/V tile
constexpr int kRowsPerWarp = 16;  // query rows per warp (one WMMA M tile)
constexpr int kMaxTreeNodes = 128;
constexpr int kMaskWords = 2;  // uint64 words of an ancestor mask (kMaxTreeNodes / 64)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

SSSD_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Number of context splits request i uses: at least one (it carries the tree part even with ctx 0).
SSSD_HD int request_splits(int64_t ctx_len, int64_t chunk) {
  const int64_t s = ceil_div(ctx_len, chunk);
  return s < 1 ? 1 : static_cast<int>(s);
}

// Context keys [begin, end) of split s; empty when the split lies past the context.
struct KeyRange {
  int64_t begin;
  int64_t end;
};
SSSD_HD KeyRange split_context_range(int split, int64_t ctx_len, int64_t chunk) {
  int64_t b = static_cast<int64_t>(split) * chunk;
  int64_t e = b + chunk;
  if (b > ctx_len) b = ctx_len;
  if (e > ctx_len) e = ctx_len;
  return {b, e};
}

// True when split s of a request with `splits` splits also processes the tree keys.
SSSD_HD bool split_has_tree(int split, int splits) { return split == splits - 1; }

// Query row r of a request -> (tree node, query head of the KV head's group).
SSSD_HD int row_node(int row, int group) { return row / group; }
SSSD_HD int row_query_head(int row, int group, int kv_head) { return kv_head * group + row % group; }

// Whether tree node `node` attends tree node `key`: bit key of masks[node] (two little-endian uint64 words).
SSSD_HD bool mask_allows(const uint64_t* node_mask, int key) {
  return ((node_mask[key >> 6] >> (key & 63)) & 1ull) != 0;
}

// Online softmax of one query row in the log2 domain. m: running max, l: running sum of exp2(s - m).
// Rows that have seen no key keep m = -inf; the guards keep them free of NaN (0 * inf, inf - inf).
struct RowState {
  float m;
  float l;
};
SSSD_HD RowState row_state_init() { return {kNegInf, 0.f}; }

// New running max after a tile whose largest score is tile_max; returns the factor that rescales the old
// accumulator and sum (0 when nothing was seen before, 1 when the row is still empty).
SSSD_HD float rescale_factor(float m_old, float m_new) {
  if (m_new == kNegInf) return 1.f;
  return exp2f(m_old - m_new);  // exp2(-inf) = 0 for an empty past
}
// Probability weight of a score under the running max (0 for masked scores and for empty rows).
SSSD_HD float score_weight(float s2, float m_new) {
  if (s2 == kNegInf) return 0.f;
  return exp2f(s2 - m_new);
}

// log2-sum-exp2 of a finished row (-inf when it attended nothing) and its normalizer (0 for empty rows).
SSSD_HD float row_lse2(RowState st) { return st.l > 0.f ? st.m + log2f(st.l) : kNegInf; }
SSSD_HD float row_inv_sum(RowState st) { return st.l > 0.f ? 1.f / st.l : 0.f; }

// Merge of split partials: weight of split s is exp2(lse_s - lse_max); a row where every split is empty
// gets zero weights (and therefore an output of 0).
SSSD_HD float merge_weight(float lse2, float lse2_max) {
  if (lse2 == kNegInf) return 0.f;
  return exp2f(lse2 - lse2_max);
}

// Warps per block (each owns kRowsPerWarp query rows): at least 4 so that K/V tiles load with enough
// threads, at most 8 (shared memory); a tree whose rows fit in one block shares every K/V tile load.
SSSD_HD int block_warps(int64_t max_rows) {
  const int64_t w = ceil_div(max_rows, kRowsPerWarp);
  return static_cast<int>(w < 4 ? 4 : (w > 8 ? 8 : w));
}
SSSD_HD int64_t row_tiles(int64_t max_rows, int warps) { return ceil_div(max_rows, int64_t{warps} * kRowsPerWarp); }

// The request that owns packed token t (offsets [B+1] non-decreasing): the last i with offsets[i] <= t.
SSSD_HD int find_request(const int64_t* offsets, int batch, int64_t t) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The launch plan: how many splits and how long each context chunk is. Chunks are whole key tiles; the
// split count is chosen so that (requests x KV heads x row tiles x splits) blocks fill the device about
// `waves` times, never cutting chunks below min_chunk keys (merging costs a little per split).
struct SplitPlan {
  int splits;
  int64_t chunk;
};
SSSD_HD SplitPlan plan_splits(int64_t batch, int64_t kv_heads, int64_t row_tiles, int64_t max_ctx, int num_sms,
                              int min_chunk) {
  const int64_t tile_min = ceil_div(min_chunk < kKeyTile ? kKeyTile : min_chunk, kKeyTile) * kKeyTile;
  const int64_t base_blocks = batch * kv_heads * (row_tiles < 1 ? 1 : row_tiles);
  const int64_t want_blocks = 2LL * (num_sms < 1 ? 1 : num_sms);
  int64_t splits = base_blocks >= want_blocks ? 1 : ceil_div(want_blocks, base_blocks);
  const int64_t max_splits = ceil_div(max_ctx, tile_min);
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  int64_t chunk = ceil_div(ceil_div(max_ctx < 1 ? 1 : max_ctx, splits), kKeyTile) * kKeyTile;
  if (chunk < kKeyTile) chunk = kKeyTile;
  // Rounding the chunk up may leave trailing splits without keys: drop them.
  splits = request_splits(max_ctx, chunk);
  return {static_cast<int>(splits), chunk};
}

}  // namespace sssd_cuda
