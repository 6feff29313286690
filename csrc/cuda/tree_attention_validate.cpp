// Host-side argument checks shared by the CUDA launchers and the host emulation.
#include <string>

#include "cuda/tree_attention.h"
#include "cuda/tree_attention_math.h"

namespace sssd_cuda {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
std::string num(int64_t v) { return std::to_string(v); }

// A row start is 16-byte aligned when the base is and every stride is a multiple of 8 half elements.
bool rows_aligned(const void* base, std::initializer_list<int64_t> strides) {
  if (!aligned16(base)) return false;
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;
  }
  return true;
}

}  // namespace

void validate_tree_attention(const TreeAttentionArgs& a, bool kernel) {
  const char* op = "tree_attention";
  require(a.batch >= 1, op, "batch must be >= 1, got " + num(a.batch));
  require(a.total_nodes >= a.batch, op, "every request needs at least its root node (N >= B)");
  require(a.q_heads >= 1 && a.kv_heads >= 1, op, "head counts must be positive");
  require(a.q_heads % a.kv_heads == 0, op,
          "q_heads (" + num(a.q_heads) + ") must be a multiple of kv_heads (" + num(a.kv_heads) + ")");
  require(a.head_dim >= 1, op, "head_dim must be positive");
  require(a.max_nodes >= 1 && a.max_nodes <= kMaxTreeNodes, op,
          "trees must have 1.." + num(kMaxTreeNodes) + " nodes, got max_nodes=" + num(a.max_nodes));
  require(a.max_ctx >= 0 && a.max_ctx < (int64_t{1} << 31), op, "max_ctx out of range: " + num(a.max_ctx));
  require(a.scale > 0.f, op, "scale must be positive");
  require(a.q && a.out && a.k_tree && a.v_tree && a.offsets && a.ctx_lens && a.masks, op,
          "null pointer among q/out/k_tree/v_tree/offsets/ctx_lens/masks");
  require(a.max_ctx == 0 || (a.k_cache && a.v_cache && a.slots), op,
          "k_cache/v_cache/slots are required when max_ctx > 0");
  require(a.splits >= 1, op, "splits must be >= 1");
  require(a.chunk >= kKeyTile && a.chunk % kKeyTile == 0, op,
          "chunk must be a positive multiple of " + num(kKeyTile) + ", got " + num(a.chunk));
  require(static_cast<int64_t>(a.splits) * a.chunk >= a.max_ctx, op,
          "splits * chunk must cover max_ctx (" + num(a.max_ctx) + ")");
  require(a.splits == 1 || (a.partial_out && a.partial_lse), op,
          "partial_out/partial_lse workspaces are required when splits > 1");
  if (!kernel) return;
  require(a.dtype == DType::kFloat16 || a.dtype == DType::kBFloat16, op, "dtype must be float16 or bfloat16");
  require(a.head_dim == 64 || a.head_dim == 128, op, "head_dim must be 64 or 128, got " + num(a.head_dim));
  require(rows_aligned(a.q, {a.q_stride_token, a.q_stride_head}), op,
          "q rows must be 16-byte aligned (strides multiple of 8)");
  require(rows_aligned(a.out, {a.out_stride_token, a.out_stride_head}), op,
          "out rows must be 16-byte aligned (strides multiple of 8)");
  require(rows_aligned(a.k_tree, {a.tree_stride_token, a.tree_stride_head}) && aligned16(a.v_tree), op,
          "k_tree/v_tree rows must be 16-byte aligned (strides multiple of 8)");
  if (a.max_ctx > 0) {
    require(rows_aligned(a.k_cache, {a.cache_stride_slot, a.cache_stride_row, a.cache_stride_head}) &&
                aligned16(a.v_cache),
            op, "k_cache/v_cache rows must be 16-byte aligned (strides multiple of 8)");
  }
  require(aligned16(a.masks), op, "masks must be 16-byte aligned");
}

void validate_kv_commit(const KvCommitArgs& a) {
  const char* op = "kv_commit";
  require(a.count >= 0, op, "count must be >= 0");
  require(a.kv_heads >= 1 && a.head_dim >= 1, op, "kv_heads and head_dim must be positive");
  require(a.elem_bytes == 2 || a.elem_bytes == 4, op, "element size must be 2 or 4 bytes");
  require((a.head_dim * a.elem_bytes) % 16 == 0, op, "head_dim * element size must be a multiple of 16 bytes");
  if (a.count == 0) return;
  require(a.k_src && a.v_src && a.k_dst && a.v_dst && a.src_rows && a.dst_slots && a.dst_rows, op,
          "null pointer argument");
  require(a.src_tokens >= 1 && a.dst_num_slots >= 1 && a.dst_num_rows >= 1, op,
          "src_tokens, dst_num_slots and dst_num_rows must be positive");
  const int64_t vec = 16 / a.elem_bytes;
  for (int64_t s : {a.src_stride_token, a.src_stride_head, a.dst_stride_slot, a.dst_stride_row,
                    a.dst_stride_head}) {
    require(s % vec == 0, op, "strides must keep rows 16-byte aligned");
  }
  for (const void* p : {a.k_src, a.v_src, static_cast<const void*>(a.k_dst), static_cast<const void*>(a.v_dst)}) {
    require(aligned16(p), op, "K/V pointers must be 16-byte aligned");
  }
}

void validate_kv_append(const KvAppendArgs& a) {
  const char* op = "kv_append";
  require(a.tokens >= 0, op, "tokens must be >= 0");
  require(a.kv_heads >= 1 && a.head_dim >= 1, op, "kv_heads and head_dim must be positive");
  require(a.elem_bytes == 2 || a.elem_bytes == 4, op, "element size must be 2 or 4 bytes");
  require((a.head_dim * a.elem_bytes) % 16 == 0, op, "head_dim * element size must be a multiple of 16 bytes");
  if (a.tokens == 0) return;
  require(a.k_src && a.v_src && a.k_dst && a.v_dst, op, "null pointer argument");
  const int64_t vec = 16 / a.elem_bytes;
  for (int64_t s : {a.src_stride_token, a.src_stride_head, a.dst_stride_token, a.dst_stride_head}) {
    require(s % vec == 0, op, "strides must keep rows 16-byte aligned");
  }
  for (const void* p : {a.k_src, a.v_src, static_cast<const void*>(a.k_dst), static_cast<const void*>(a.v_dst)}) {
    require(aligned16(p), op, "K/V pointers must be 16-byte aligned");
  }
}

}  // namespace sssd_cuda
