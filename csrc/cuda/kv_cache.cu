// KV append (this step's K/V -> the scratch area) and KV commit (accepted tree nodes: scratch -> the
// request's cache rows). Both are byte copies of whole 16-byte vectors, so one kernel serves every dtype.
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/tree_attention.h"
#include "cuda/tree_attention_math.h"

namespace sssd_cuda {
namespace {

constexpr int kThreads = 256;

// Thread i copies vector i % vecs of (row, head) i / vecs, for K and for V. Strides are in elements.
__global__ void kv_commit_kernel(const KvCommitArgs a, const int vecs) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = a.count * a.kv_heads * vecs;
  if (i >= total) return;
  const int v = static_cast<int>(i % vecs);
  const int h = static_cast<int>((i / vecs) % a.kv_heads);
  const int64_t e = i / (int64_t{vecs} * a.kv_heads);
  const int64_t src_row = a.src_rows[e], slot = a.dst_slots[e], row = a.dst_rows[e];
  if (src_row < 0 || src_row >= a.src_tokens || slot < 0 || slot >= a.dst_num_slots || row < 0 ||
      row >= a.dst_num_rows) {
    return;  // validated on the host; never write out of bounds
  }
  const int64_t src = (src_row * a.src_stride_token + h * a.src_stride_head) * a.elem_bytes + v * 16;
  const int64_t dst =
      (slot * a.dst_stride_slot + row * a.dst_stride_row + h * a.dst_stride_head) * a.elem_bytes + v * 16;
  *reinterpret_cast<uint4*>(static_cast<char*>(a.k_dst) + dst) =
      *reinterpret_cast<const uint4*>(static_cast<const char*>(a.k_src) + src);
  *reinterpret_cast<uint4*>(static_cast<char*>(a.v_dst) + dst) =
      *reinterpret_cast<const uint4*>(static_cast<const char*>(a.v_src) + src);
}

__global__ void kv_append_kernel(const KvAppendArgs a, const int vecs) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = a.tokens * a.kv_heads * vecs;
  if (i >= total) return;
  const int v = static_cast<int>(i % vecs);
  const int h = static_cast<int>((i / vecs) % a.kv_heads);
  const int64_t t = i / (int64_t{vecs} * a.kv_heads);
  const int64_t src = (t * a.src_stride_token + h * a.src_stride_head) * a.elem_bytes + v * 16;
  const int64_t dst = (t * a.dst_stride_token + h * a.dst_stride_head) * a.elem_bytes + v * 16;
  *reinterpret_cast<uint4*>(static_cast<char*>(a.k_dst) + dst) =
      *reinterpret_cast<const uint4*>(static_cast<const char*>(a.k_src) + src);
  *reinterpret_cast<uint4*>(static_cast<char*>(a.v_dst) + dst) =
      *reinterpret_cast<const uint4*>(static_cast<const char*>(a.v_src) + src);
}

unsigned blocks_for(int64_t threads, const char* op) {
  const int64_t blocks = ceil_div(threads, kThreads);
  require(blocks < (int64_t{1} << 31), op, "too many rows for one launch");
  return static_cast<unsigned>(blocks);
}

}  // namespace

void kv_commit_launch(const KvCommitArgs& a, uintptr_t stream) {
  validate_kv_commit(a);
  if (a.count == 0) return;
  const int vecs = a.head_dim * a.elem_bytes / 16;
  const unsigned blocks = blocks_for(a.count * a.kv_heads * vecs, "kv_commit");
  kv_commit_kernel<<<blocks, kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(a, vecs);
  check_launch("kv_commit");
}

void kv_append_launch(const KvAppendArgs& a, uintptr_t stream) {
  validate_kv_append(a);
  if (a.tokens == 0) return;
  const int vecs = a.head_dim * a.elem_bytes / 16;
  const unsigned blocks = blocks_for(a.tokens * a.kv_heads * vecs, "kv_append");
  kv_append_kernel<<<blocks, kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(a, vecs);
  check_launch("kv_append");
}

}  // namespace sssd_cuda
