// Tree attention and KV commit: argument structures, host-side validation and the launchers' interface.
// Pure C++17 (no CUDA, no Python, no torch): the launchers live in .cu files, the host emulation in
// tree_attention_emulate.h, and both check their arguments with validate_tree_attention() below.
//
// Packed batch layout (B requests, N = total tree nodes, Hq query heads, Hkv KV heads, D head dim):
//   q, out           [N, Hq, D]      tree i's queries are rows offsets[i] .. offsets[i+1]-1
//   k_tree, v_tree   [N, Hkv, D]     this step's K/V of the tree nodes (the scratch area)
//   k_cache, v_cache [slots, rows, Hkv, D]   request i's committed context = rows [0, ctx_lens[i]) of
//                                            slot slots[i]; attended without a mask
//   masks            [N, 2] uint64   bit j of masks[offsets[i] + a] set <=> node a attends node j of tree i
//                                    (its ancestors and itself; bit j lives in word j / 64)
// The innermost dimension (D) is contiguous; every other stride is in elements and given explicitly.
#pragma once
#include <stdint.h>

#include <stdexcept>
#include <string>

namespace sssd_cuda {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

struct TreeAttentionArgs {
  int batch = 0;            // B
  int64_t total_nodes = 0;  // N
  int q_heads = 0;          // Hq
  int kv_heads = 0;         // Hkv (divides Hq)
  int head_dim = 0;         // D (64 or 128 for the kernel)
  int max_nodes = 0;        // max over requests of tree size (host knowledge; sizes the grid)
  int64_t max_ctx = 0;      // max over requests of ctx_lens (host knowledge; sizes the splits)
  float scale = 0.f;        // softmax scale, usually 1/sqrt(D)
  DType dtype = DType::kBFloat16;

  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;

  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  int64_t cache_stride_slot = 0, cache_stride_row = 0, cache_stride_head = 0;

  const void* k_tree = nullptr;
  const void* v_tree = nullptr;
  int64_t tree_stride_token = 0, tree_stride_head = 0;

  const int64_t* offsets = nullptr;  // [B+1], offsets[0] = 0, offsets[B] = N, non-decreasing
  const int32_t* ctx_lens = nullptr;  // [B]
  const int32_t* slots = nullptr;     // [B]
  const uint64_t* masks = nullptr;    // [N, 2]

  int splits = 1;                 // context splits (1: no merge, out written directly)
  int64_t chunk = 0;              // context keys per split, a multiple of kKeyTile (>= max_ctx if splits == 1)
  float* partial_out = nullptr;   // [splits, N, Hq, D] float32, needed when splits > 1
  float* partial_lse = nullptr;   // [splits, N, Hq] float32 (log2 domain), needed when splits > 1
};

struct KvCommitArgs {
  int64_t count = 0;  // A: rows to copy
  int kv_heads = 0;
  int head_dim = 0;
  int elem_bytes = 2;
  const void* k_src = nullptr;  // [N, Hkv, D] scratch
  const void* v_src = nullptr;
  int64_t src_stride_token = 0, src_stride_head = 0;
  void* k_dst = nullptr;  // [slots, rows, Hkv, D] cache
  void* v_dst = nullptr;
  int64_t dst_stride_slot = 0, dst_stride_row = 0, dst_stride_head = 0;
  const int32_t* src_rows = nullptr;  // [A] row of the scratch
  const int32_t* dst_slots = nullptr; // [A] cache slot
  const int32_t* dst_rows = nullptr;  // [A] row inside the slot
  // Bounds: entries whose indexes fall outside are skipped by the kernel (callers validate on the host).
  int64_t src_tokens = 0, dst_num_slots = 0, dst_num_rows = 0;
};

struct KvAppendArgs {  // strided copy [N, Hkv, D] -> [N, Hkv, D] for K and V
  int64_t tokens = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int elem_bytes = 2;
  const void* k_src = nullptr;
  const void* v_src = nullptr;
  int64_t src_stride_token = 0, src_stride_head = 0;
  void* k_dst = nullptr;
  void* v_dst = nullptr;
  int64_t dst_stride_token = 0, dst_stride_head = 0;
};

// Thrown for bad arguments (the bindings map it to ValueError); CUDA failures are std::runtime_error.
struct ArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw ArgumentError(std::string(op) + ": " + what);
}

// Host-side checks of everything that can be checked without reading device memory. `kernel` adds the
// constraints of the CUDA kernel (dtype, head dim, 16-byte alignment of rows).
void validate_tree_attention(const TreeAttentionArgs& a, bool kernel);
void validate_kv_commit(const KvCommitArgs& a);
void validate_kv_append(const KvAppendArgs& a);

// CUDA launchers (defined in the .cu files; only in builds with CUDA). `stream` is a cudaStream_t.
void tree_attention_launch(const TreeAttentionArgs& a, uintptr_t stream);
void kv_commit_launch(const KvCommitArgs& a, uintptr_t stream);
void kv_append_launch(const KvAppendArgs& a, uintptr_t stream);

}  // namespace sssd_cuda
