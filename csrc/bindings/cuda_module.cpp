// Module sssd._cuda: the CUDA kernels, bound with raw pointers, shapes, strides and the stream passed as
// Python integers (the Python side, python/sssd/cuda_ops.py, validates torch tensors and passes
// tensor.data_ptr(), tensor.stride() and stream.cuda_stream). No torch headers, no libtorch.
// Bad arguments raise ValueError (std::invalid_argument), CUDA failures RuntimeError naming the op.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>

#include "cuda/tree_attention.h"
#include "cuda/tree_attention_math.h"

namespace py = pybind11;
using sssd_cuda::DType;

namespace {

template <typename T>
const T* cptr(uintptr_t p) {
  return reinterpret_cast<const T*>(p);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: clear the sticky error, report zero
    return 0;
  }
  return n;
}

void tree_attention(uintptr_t q, std::array<int64_t, 2> q_strides, uintptr_t out, std::array<int64_t, 2> out_strides,
                    uintptr_t k_cache, uintptr_t v_cache, std::array<int64_t, 3> cache_strides, uintptr_t k_tree,
                    uintptr_t v_tree, std::array<int64_t, 2> tree_strides, uintptr_t offsets, uintptr_t ctx_lens,
                    uintptr_t slots, uintptr_t masks, int batch, int64_t total_nodes, int q_heads, int kv_heads,
                    int head_dim, int max_nodes, int64_t max_ctx, float scale, int dtype, int splits, int64_t chunk,
                    uintptr_t partial_out, uintptr_t partial_lse, uintptr_t stream) {
  sssd_cuda::require(dtype == 0 || dtype == 1, "tree_attention", "dtype code must be 0 (float16) or 1 (bfloat16)");
  sssd_cuda::TreeAttentionArgs a;
  a.batch = batch;
  a.total_nodes = total_nodes;
  a.q_heads = q_heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.max_nodes = max_nodes;
  a.max_ctx = max_ctx;
  a.scale = scale;
  a.dtype = static_cast<DType>(dtype);
  a.q = cptr<void>(q);
  a.q_stride_token = q_strides[0];
  a.q_stride_head = q_strides[1];
  a.out = reinterpret_cast<void*>(out);
  a.out_stride_token = out_strides[0];
  a.out_stride_head = out_strides[1];
  a.k_cache = cptr<void>(k_cache);
  a.v_cache = cptr<void>(v_cache);
  a.cache_stride_slot = cache_strides[0];
  a.cache_stride_row = cache_strides[1];
  a.cache_stride_head = cache_strides[2];
  a.k_tree = cptr<void>(k_tree);
  a.v_tree = cptr<void>(v_tree);
  a.tree_stride_token = tree_strides[0];
  a.tree_stride_head = tree_strides[1];
  a.offsets = cptr<int64_t>(offsets);
  a.ctx_lens = cptr<int32_t>(ctx_lens);
  a.slots = cptr<int32_t>(slots);
  a.masks = cptr<uint64_t>(masks);
  a.splits = splits;
  a.chunk = chunk;
  a.partial_out = reinterpret_cast<float*>(partial_out);
  a.partial_lse = reinterpret_cast<float*>(partial_lse);
  py::gil_scoped_release nogil;
  sssd_cuda::tree_attention_launch(a, stream);
}

void kv_commit(uintptr_t k_src, uintptr_t v_src, std::array<int64_t, 2> src_strides, int64_t src_tokens,
               uintptr_t k_dst, uintptr_t v_dst, std::array<int64_t, 3> dst_strides, int64_t num_slots,
               int64_t num_rows, uintptr_t src_rows, uintptr_t dst_slots, uintptr_t dst_rows, int64_t count,
               int kv_heads, int head_dim, int elem_bytes, uintptr_t stream) {
  sssd_cuda::KvCommitArgs a;
  a.count = count;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.elem_bytes = elem_bytes;
  a.k_src = cptr<void>(k_src);
  a.v_src = cptr<void>(v_src);
  a.src_stride_token = src_strides[0];
  a.src_stride_head = src_strides[1];
  a.src_tokens = src_tokens;
  a.k_dst = reinterpret_cast<void*>(k_dst);
  a.v_dst = reinterpret_cast<void*>(v_dst);
  a.dst_stride_slot = dst_strides[0];
  a.dst_stride_row = dst_strides[1];
  a.dst_stride_head = dst_strides[2];
  a.dst_num_slots = num_slots;
  a.dst_num_rows = num_rows;
  a.src_rows = cptr<int32_t>(src_rows);
  a.dst_slots = cptr<int32_t>(dst_slots);
  a.dst_rows = cptr<int32_t>(dst_rows);
  py::gil_scoped_release nogil;
  sssd_cuda::kv_commit_launch(a, stream);
}

void kv_append(uintptr_t k_src, uintptr_t v_src, std::array<int64_t, 2> src_strides, uintptr_t k_dst,
               uintptr_t v_dst, std::array<int64_t, 2> dst_strides, int64_t tokens, int kv_heads, int head_dim,
               int elem_bytes, uintptr_t stream) {
  sssd_cuda::KvAppendArgs a;
  a.tokens = tokens;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.elem_bytes = elem_bytes;
  a.k_src = cptr<void>(k_src);
  a.v_src = cptr<void>(v_src);
  a.src_stride_token = src_strides[0];
  a.src_stride_head = src_strides[1];
  a.k_dst = reinterpret_cast<void*>(k_dst);
  a.v_dst = reinterpret_cast<void*>(v_dst);
  a.dst_stride_token = dst_strides[0];
  a.dst_stride_head = dst_strides[1];
  py::gil_scoped_release nogil;
  sssd_cuda::kv_append_launch(a, stream);
}

std::pair<int, int64_t> plan(int64_t batch, int q_heads, int kv_heads, int max_nodes, int64_t max_ctx, int num_sms,
                             int min_chunk) {
  sssd_cuda::require(batch >= 1 && kv_heads >= 1 && q_heads % kv_heads == 0 && max_nodes >= 1 && max_ctx >= 0,
                     "tree_attention_plan", "invalid shape");
  const int64_t rows = int64_t{max_nodes} * (q_heads / kv_heads);
  const auto p = sssd_cuda::plan_splits(batch, kv_heads, sssd_cuda::row_tiles(rows, sssd_cuda::block_warps(rows)),
                                        max_ctx, num_sms, min_chunk);
  return {p.splits, p.chunk};
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "sssd CUDA kernels: tree attention, KV append/commit (raw pointers; see sssd.cuda_ops)";
  m.def("device_count", &device_count, "CUDA devices visible to this extension's runtime (0 without a driver).");
  m.attr("architectures") = SSSD_CUDA_ARCHITECTURES_STR;
  m.attr("key_tile") = sssd_cuda::kKeyTile;
  m.attr("max_tree_nodes") = sssd_cuda::kMaxTreeNodes;
  m.def("tree_attention", &tree_attention, py::arg("q"), py::arg("q_strides"), py::arg("out"), py::arg("out_strides"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("cache_strides"), py::arg("k_tree"), py::arg("v_tree"),
        py::arg("tree_strides"), py::arg("offsets"), py::arg("ctx_lens"), py::arg("slots"), py::arg("masks"),
        py::arg("batch"), py::arg("total_nodes"), py::arg("q_heads"), py::arg("kv_heads"), py::arg("head_dim"),
        py::arg("max_nodes"), py::arg("max_ctx"), py::arg("scale"), py::arg("dtype"), py::arg("splits"),
        py::arg("chunk"), py::arg("partial_out"), py::arg("partial_lse"), py::arg("stream"),
        "Tree attention over a packed batch (pointers/strides as integers; strides in elements).");
  m.def("kv_commit", &kv_commit, py::arg("k_src"), py::arg("v_src"), py::arg("src_strides"), py::arg("src_tokens"),
        py::arg("k_dst"), py::arg("v_dst"), py::arg("dst_strides"), py::arg("num_slots"), py::arg("num_rows"),
        py::arg("src_rows"), py::arg("dst_slots"), py::arg("dst_rows"), py::arg("count"), py::arg("kv_heads"),
        py::arg("head_dim"), py::arg("elem_bytes"), py::arg("stream"),
        "Copy scratch rows src_rows[i] to cache (dst_slots[i], dst_rows[i]) for K and V.");
  m.def("kv_append", &kv_append, py::arg("k_src"), py::arg("v_src"), py::arg("src_strides"), py::arg("k_dst"),
        py::arg("v_dst"), py::arg("dst_strides"), py::arg("tokens"), py::arg("kv_heads"), py::arg("head_dim"),
        py::arg("elem_bytes"), py::arg("stream"), "Strided copy of [tokens, kv_heads, head_dim] K and V.");
  m.def("tree_attention_plan", &plan, py::arg("batch"), py::arg("q_heads"), py::arg("kv_heads"), py::arg("max_nodes"),
        py::arg("max_ctx"), py::arg("num_sms"), py::arg("min_chunk") = 256,
        "(splits, chunk) for a batch: enough blocks to fill num_sms twice, chunks of >= min_chunk keys.");
}
