// Host emulation of the tree attention kernel: the same blocks, row tiles, 64-key tiles, split ranges,
// online softmax and log-sum-exp merge, written as plain loops over float data. It lets CPU-only machines
// test the kernel's decomposition (tree_attention_math.h) against a float64 reference.
#include "cuda/tree_attention_emulate.h"

#include <cstring>
#include <vector>

#include "cuda/tree_attention_math.h"

namespace sssd_cuda {

float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

namespace {

struct Block {
  int request, kv_head, row_tile, split;
};

// One block of the kernel: rows [row0, row0 + rows_per_block) of request b, KV head h, split s.
void emulate_block(const TreeAttentionArgs& a, const Block& blk, int rows_per_block, bool round_p) {
  const float* q = static_cast<const float*>(a.q);
  const float* kc = static_cast<const float*>(a.k_cache);
  const float* vc = static_cast<const float*>(a.v_cache);
  const float* kt = static_cast<const float*>(a.k_tree);
  const float* vt = static_cast<const float*>(a.v_tree);
  const int D = a.head_dim, group = a.q_heads / a.kv_heads;
  const int64_t tok0 = a.offsets[blk.request];
  const int n = static_cast<int>(a.offsets[blk.request + 1] - tok0);
  const int64_t ctx = a.ctx_lens[blk.request];
  const int splits_b = request_splits(ctx, a.chunk);
  const int rows = n * group, row0 = blk.row_tile * rows_per_block;
  if (row0 >= rows || blk.split >= splits_b) return;  // the kernel's early exit
  const KeyRange range = split_context_range(blk.split, ctx, a.chunk);
  const bool tree = split_has_tree(blk.split, splits_b);
  const float scale2 = a.scale * kLog2e;
  const int64_t slot = ctx > 0 ? a.slots[blk.request] : 0;

  for (int r = row0; r < row0 + rows_per_block && r < rows; ++r) {
    const int node = row_node(r, group), hq = row_query_head(r, group, blk.kv_head);
    const float* qr = q + (tok0 + node) * a.q_stride_token + hq * a.q_stride_head;
    const uint64_t* mask = a.masks + (tok0 + node) * kMaskWords;
    RowState st = row_state_init();
    std::vector<float> o(D, 0.f);
    // Context tiles (no mask) and then, for the last split, tree tiles (ancestor mask).
    const int64_t ctx_tiles = ceil_div(range.end - range.begin, kKeyTile);
    const int64_t tree_tiles = tree ? ceil_div(n, kKeyTile) : 0;
    for (int64_t t = 0; t < ctx_tiles + tree_tiles; ++t) {
      const bool is_tree = t >= ctx_tiles;
      const int64_t key0 = is_tree ? (t - ctx_tiles) * kKeyTile : range.begin + t * kKeyTile;
      float s2[kKeyTile];
      const float* krow[kKeyTile];
      const float* vrow[kKeyTile];
      float tile_max = kNegInf;
      for (int c = 0; c < kKeyTile; ++c) {
        const int64_t key = key0 + c;
        const bool valid = is_tree ? (key < n && mask_allows(mask, static_cast<int>(key))) : key < range.end;
        s2[c] = kNegInf;
        if (!valid) continue;
        if (is_tree) {
          krow[c] = kt + (tok0 + key) * a.tree_stride_token + blk.kv_head * a.tree_stride_head;
          vrow[c] = vt + (tok0 + key) * a.tree_stride_token + blk.kv_head * a.tree_stride_head;
        } else {
          const int64_t off = slot * a.cache_stride_slot + key * a.cache_stride_row + blk.kv_head * a.cache_stride_head;
          krow[c] = kc + off;
          vrow[c] = vc + off;
        }
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot += qr[d] * krow[c][d];
        s2[c] = dot * scale2;
        if (s2[c] > tile_max) tile_max = s2[c];
      }
      const float m_new = st.m > tile_max ? st.m : tile_max;
      const float alpha = rescale_factor(st.m, m_new);
      float psum = 0.f;
      for (int d = 0; d < D; ++d) o[d] *= alpha;
      for (int c = 0; c < kKeyTile; ++c) {
        const float p = score_weight(s2[c], m_new);
        psum += p;
        if (p == 0.f) continue;
        const float pr = round_p ? round_to_bf16(p) : p;
        for (int d = 0; d < D; ++d) o[d] += pr * vrow[c][d];
      }
      st.l = st.l * alpha + psum;
      st.m = m_new;
    }
    const float inv = row_inv_sum(st);
    const int64_t tok = tok0 + node;
    if (a.splits == 1) {
      float* out = static_cast<float*>(a.out) + tok * a.out_stride_token + hq * a.out_stride_head;
      for (int d = 0; d < D; ++d) out[d] = o[d] * inv;
    } else {
      const int64_t prow = (static_cast<int64_t>(blk.split) * a.total_nodes + tok) * a.q_heads + hq;
      for (int d = 0; d < D; ++d) a.partial_out[prow * D + d] = o[d] * inv;
      a.partial_lse[prow] = row_lse2(st);
    }
  }
}

// The merge kernel: one (token, query head) row at a time.
void emulate_merge(const TreeAttentionArgs& a) {
  const int D = a.head_dim;
  for (int64_t tok = 0; tok < a.total_nodes; ++tok) {
    const int b = find_request(a.offsets, a.batch, tok);
    const int splits_b = request_splits(a.ctx_lens[b], a.chunk);
    for (int hq = 0; hq < a.q_heads; ++hq) {
      float lmax = kNegInf;
      for (int s = 0; s < splits_b; ++s) {
        const float l = a.partial_lse[(static_cast<int64_t>(s) * a.total_nodes + tok) * a.q_heads + hq];
        if (l > lmax) lmax = l;
      }
      float wsum = 0.f;
      std::vector<float> o(D, 0.f);
      for (int s = 0; s < splits_b; ++s) {
        const int64_t prow = (static_cast<int64_t>(s) * a.total_nodes + tok) * a.q_heads + hq;
        const float w = merge_weight(a.partial_lse[prow], lmax);
        wsum += w;
        if (w == 0.f) continue;
        for (int d = 0; d < D; ++d) o[d] += w * a.partial_out[prow * D + d];
      }
      const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
      float* out = static_cast<float*>(a.out) + tok * a.out_stride_token + hq * a.out_stride_head;
      for (int d = 0; d < D; ++d) out[d] = o[d] * inv;
    }
  }
}

}  // namespace

void tree_attention_emulate(const TreeAttentionArgs& a, bool round_p_to_bf16) {
  validate_tree_attention(a, /*kernel=*/false);
  require(a.dtype == DType::kFloat32, "tree_attention_emulate", "the emulation takes float32 data");
  const int group = a.q_heads / a.kv_heads;
  const int warps = block_warps(int64_t{a.max_nodes} * group);
  const int rows_per_block = warps * kRowsPerWarp;
  const int64_t tiles = row_tiles(int64_t{a.max_nodes} * group, warps);
  for (int b = 0; b < a.batch; ++b) {
    const int64_t n = a.offsets[b + 1] - a.offsets[b];
    require(n >= 1 && n <= a.max_nodes, "tree_attention_emulate", "tree size outside 1..max_nodes");
    require(a.ctx_lens[b] >= 0 && a.ctx_lens[b] <= a.max_ctx, "tree_attention_emulate",
            "context length outside 0..max_ctx");
  }
  for (int b = 0; b < a.batch; ++b) {
    for (int h = 0; h < a.kv_heads; ++h) {
      for (int64_t mt = 0; mt < tiles; ++mt) {
        for (int s = 0; s < a.splits; ++s) {
          emulate_block(a, Block{b, h, static_cast<int>(mt), s}, rows_per_block, round_p_to_bf16);
        }
      }
    }
  }
  if (a.splits > 1) emulate_merge(a);
}

}  // namespace sssd_cuda
