// Launcher of the tree attention kernel: validates the arguments, sizes the grid and the shared memory,
// dispatches on dtype x head dim (4 instantiations) and reports CUDA errors as exceptions naming the op.
#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_check.h"
#include "cuda/tree_attention.h"
#include "cuda/tree_attention_kernel.cuh"
#include "cuda/tree_attention_math.h"

namespace sssd_cuda {
namespace {

constexpr const char* kOp = "tree_attention";

int optin_shared_memory() {
  int dev = 0, bytes = 0;
  check_cuda(cudaGetDevice(&dev), kOp, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), kOp,
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  return bytes;
}

template <typename T, int D>
void launch(const TreeAttentionArgs& a, cudaStream_t stream) {
  using L = kernel::Layout<D>;
  const int group = a.q_heads / a.kv_heads;
  const int64_t max_rows = int64_t{a.max_nodes} * group;
  int warps = block_warps(max_rows);
  const int optin = optin_shared_memory();
  while (warps > 1 && L::bytes(warps) > static_cast<size_t>(optin)) --warps;  // e.g. sm_86: 99 KiB
  const size_t smem = L::bytes(warps);
  require(smem <= static_cast<size_t>(optin), kOp, "not enough shared memory on this device");
  const int64_t tiles_m = row_tiles(max_rows, warps);
  const int64_t grid_x = tiles_m * a.splits;
  require(grid_x < (int64_t{1} << 31) && a.kv_heads <= 65535 && a.batch <= 65535, kOp,
          "grid too large (splits x row tiles, kv_heads or batch)");
  auto* attn = kernel::tree_attention_kernel<T, D>;
  check_cuda(cudaFuncSetAttribute(attn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), kOp,
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(a.batch));
  attn<<<grid, warps * 32, smem, stream>>>(a, static_cast<int>(tiles_m));
  check_launch(kOp);
  if (a.splits > 1) {
    const int64_t warps_total = a.total_nodes * a.q_heads;
    const int64_t blocks = ceil_div(warps_total * 32, 256);
    require(blocks < (int64_t{1} << 31), kOp, "merge grid too large");
    kernel::merge_splits_kernel<T, D><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(a);
    check_launch("tree_attention (merge of splits)");
  }
}

}  // namespace

void tree_attention_launch(const TreeAttentionArgs& a, uintptr_t stream_handle) {
  validate_tree_attention(a, /*kernel=*/true);
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const bool bf16 = a.dtype == DType::kBFloat16;
  if (a.head_dim == 64) {
    bf16 ? launch<__nv_bfloat16, 64>(a, stream) : launch<__half, 64>(a, stream);
  } else {
    bf16 ? launch<__nv_bfloat16, 128>(a, stream) : launch<__half, 128>(a, stream);
  }
}

}  // namespace sssd_cuda
