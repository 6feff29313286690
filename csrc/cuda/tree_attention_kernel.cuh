// The tree attention kernel (device code). One block = one request x one KV head x one tile of query rows
// x one context split. Every K/V tile (64 keys) is loaded once into shared memory (cp.async, two stages)
// and used by all query rows of the block: all nodes of the tree (up to the block's rows) and all query
// heads of the KV head's group. Each warp owns 16 query rows: S = Q.K^T and O += P.V run on tensor cores
// (WMMA 16x16x16, fp32 accumulation); the online softmax runs in registers, two lanes per row.
// Index arithmetic and softmax algebra come from tree_attention_math.h (tested on the host).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "cuda/tree_attention.h"
#include "cuda/tree_attention_math.h"

namespace sssd_cuda {
namespace kernel {

using namespace nvcuda;

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16-byte global -> shared copy that bypasses L1; copies zeros instead when !valid (no global read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned saddr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Shared memory layout (bytes): [2 stages][K, V][64 keys][D + 8] T, then per warp S [16][68] float
// (also the Q staging area and, as T with row pitch 136, the P tile) and a 16x16 float P.V scratch.
template <int D>
struct Layout {
  static constexpr int kKvLd = D + 8;           // T elements per K/V row (pad: fewer bank conflicts)
  static constexpr int kSLd = kKeyTile + 4;     // floats per S row
  static constexpr int kPLd = 2 * kSLd;         // T elements per P row (P aliases S)
  static constexpr int kTileElems = kKeyTile * kKvLd;
  static constexpr size_t kKvBytes = 2 * 2 * kTileElems * 2;  // 2 stages x {K, V}, 2-byte elements
  static constexpr int kWarpFloats = kRowsPerWarp * kSLd + 16 * 16;
  static size_t bytes(int warps) { return kKvBytes + static_cast<size_t>(warps) * kWarpFloats * 4; }
  static_assert(kRowsPerWarp * kKvLd * 2 <= kRowsPerWarp * kSLd * 4, "Q staging must fit in S");
};

// Issues the cp.async copies of key tile `t` (context tiles first, then tree tiles) into `dst` (K then V).
template <typename T, int D>
__device__ __forceinline__ void load_kv_tile(const TreeAttentionArgs& a, T* dst, int64_t t, int64_t ctx_tiles,
                                             KeyRange range, int64_t slot, int64_t tok0, int n, int kvh) {
  using L = Layout<D>;
  constexpr int kVecs = D / 8;  // 16-byte vectors per row
  const bool is_tree = t >= ctx_tiles;
  const T* kbase;
  const T* vbase;
  int64_t row_stride, key0, key_end;
  if (is_tree) {
    const int64_t off = tok0 * a.tree_stride_token + kvh * a.tree_stride_head;
    kbase = static_cast<const T*>(a.k_tree) + off;
    vbase = static_cast<const T*>(a.v_tree) + off;
    row_stride = a.tree_stride_token;
    key0 = (t - ctx_tiles) * kKeyTile;
    key_end = n;
  } else {
    const int64_t off = slot * a.cache_stride_slot + kvh * a.cache_stride_head;
    kbase = static_cast<const T*>(a.k_cache) + off;
    vbase = static_cast<const T*>(a.v_cache) + off;
    row_stride = a.cache_stride_row;
    key0 = range.begin + t * kKeyTile;
    key_end = range.end;
  }
  for (int v = threadIdx.x; v < kKeyTile * kVecs; v += blockDim.x) {
    const int c = v / kVecs, part = (v % kVecs) * 8;
    const int64_t key = key0 + c;
    const bool valid = key < key_end;
    const int64_t src = (valid ? key : key0) * row_stride + part;
    cp_async16(dst + c * L::kKvLd + part, kbase + src, valid);
    cp_async16(dst + L::kTileElems + c * L::kKvLd + part, vbase + src, valid);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(256) tree_attention_kernel(const TreeAttentionArgs a, const int tiles_m) {
  using L = Layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int mt = blockIdx.x % tiles_m, split = blockIdx.x / tiles_m;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int group = a.q_heads / a.kv_heads;
  const int64_t tok0 = a.offsets[b];
  const int n = static_cast<int>(a.offsets[b + 1] - tok0);
  const int64_t ctx = a.ctx_lens[b];
  const int splits_b = request_splits(ctx, a.chunk);
  const int rows = n * group, row0 = mt * warps * kRowsPerWarp;
  if (row0 >= rows || split >= splits_b) return;  // block-uniform: nothing of this request here
  const KeyRange range = split_context_range(split, ctx, a.chunk);
  const int64_t ctx_tiles = ceil_div(range.end - range.begin, kKeyTile);
  const int64_t total_tiles = ctx_tiles + (split_has_tree(split, splits_b) ? ceil_div(n, kKeyTile) : 0);
  const int64_t slot = ctx > 0 ? a.slots[b] : 0;

  T* kv = reinterpret_cast<T*>(smem);
  float* ws = reinterpret_cast<float*>(smem + L::kKvBytes) + warp * L::kWarpFloats;  // S / Q / P
  float* wpv = ws + kRowsPerWarp * L::kSLd;                                            // P.V scratch
  const int wrow0 = row0 + warp * kRowsPerWarp;
  const bool warp_active = wrow0 < rows;  // warp-uniform

  // Queries of the warp's 16 rows -> registers (zeros for rows past the request).
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[D / 16];
  if (warp_active) {
    T* qs = reinterpret_cast<T*>(ws);
    for (int v = lane; v < kRowsPerWarp * (D / 8); v += 32) {
      const int r = v / (D / 8), part = (v % (D / 8)) * 8, row = wrow0 + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (row < rows) {
        const int64_t tok = tok0 + row_node(row, group);
        const T* src = static_cast<const T*>(a.q) + tok * a.q_stride_token +
                       row_query_head(row, group, kvh) * a.q_stride_head + part;
        val = *reinterpret_cast<const uint4*>(src);
      }
      *reinterpret_cast<uint4*>(qs + r * L::kKvLd + part) = val;
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) wmma::load_matrix_sync(qf[k], qs + k * 16, L::kKvLd);
    __syncwarp();
  }

  // This lane's softmax row (two lanes per row, 32 key columns each) and its ancestor mask.
  const int my_r = lane >> 1, my_half = lane & 1, my_row = wrow0 + my_r;
  const bool my_valid = my_row < rows;
  const int my_node = my_valid ? row_node(my_row, group) : 0;
  uint64_t my_mask[kMaskWords] = {0, 0};
  if (my_valid) {
    for (int w = 0; w < kMaskWords; ++w) my_mask[w] = a.masks[(tok0 + my_node) * kMaskWords + w];
  }
  const float scale2 = a.scale * kLog2e;
  RowState st = row_state_init();
  float o[D / 16][8];
#pragma unroll
  for (int f = 0; f < D / 16; ++f) {
#pragma unroll
    for (int e = 0; e < 8; ++e) o[f][e] = 0.f;
  }

  if (total_tiles > 0) load_kv_tile<T, D>(a, kv, 0, ctx_tiles, range, slot, tok0, n, kvh);
  cp_async_commit();
  for (int64_t t = 0; t < total_tiles; ++t) {
    if (t + 1 < total_tiles) {
      load_kv_tile<T, D>(a, kv + ((t + 1) & 1) * 2 * L::kTileElems, t + 1, ctx_tiles, range, slot, tok0, n, kvh);
    }
    cp_async_commit();
    cp_async_wait<1>();  // tile t has landed (only tile t+1 may still be in flight)
    __syncthreads();
    const T* ks = kv + (t & 1) * 2 * L::kTileElems;
    const T* vs = ks + L::kTileElems;
    if (warp_active) {
      // S = Q K^T for the warp's 16 rows x 64 keys.
#pragma unroll
      for (int nb = 0; nb < kKeyTile / 16; ++nb) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc;
        wmma::fill_fragment(sacc, 0.f);
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
          wmma::load_matrix_sync(kf, ks + nb * 16 * L::kKvLd + k * 16, L::kKvLd);
          wmma::mma_sync(sacc, qf[k], kf, sacc);
        }
        wmma::store_matrix_sync(ws + nb * 16, sacc, L::kSLd, wmma::mem_row_major);
      }
      __syncwarp();
      // Online softmax of this lane's half row.
      const bool is_tree = t >= ctx_tiles;
      const int64_t key0 = is_tree ? (t - ctx_tiles) * kKeyTile : range.begin + t * kKeyTile;
      float p[kKeyTile / 2];
      float tile_max = kNegInf;
#pragma unroll
      for (int c = 0; c < kKeyTile / 2; ++c) {
        const int col = my_half * (kKeyTile / 2) + c;
        const int64_t key = key0 + col;
        const bool ok = my_valid && (is_tree ? (key < n && mask_allows(my_mask, static_cast<int>(key)))
                                             : key < range.end);
        p[c] = ok ? ws[my_r * L::kSLd + col] * scale2 : kNegInf;
        tile_max = fmaxf(tile_max, p[c]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float m_new = fmaxf(st.m, tile_max);
      const float alpha = rescale_factor(st.m, m_new);
      float psum = 0.f;
#pragma unroll
      for (int c = 0; c < kKeyTile / 2; ++c) {
        p[c] = score_weight(p[c], m_new);
        psum += p[c];
      }
      psum += __shfl_xor_sync(0xffffffffu, psum, 1);
      st.l = st.l * alpha + psum;
      st.m = m_new;
      __syncwarp();  // every lane has read its S values before P overwrites them
      T* ps = reinterpret_cast<T*>(ws);
#pragma unroll
      for (int c = 0; c < kKeyTile / 2; ++c) {
        ps[my_r * L::kPLd + my_half * (kKeyTile / 2) + c] = from_float<T>(p[c]);
      }
      __syncwarp();
      // O = alpha * O + P V, one 16-column block at a time through the scratch (this lane: row my_r,
      // columns my_half*8 .. +8 of every block).
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf[kKeyTile / 16];
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; ++kk) wmma::load_matrix_sync(pf[kk], ps + kk * 16, L::kPLd);
#pragma unroll
      for (int f = 0; f < D / 16; ++f) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> pv;
        wmma::fill_fragment(pv, 0.f);
#pragma unroll
        for (int kk = 0; kk < kKeyTile / 16; ++kk) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
          wmma::load_matrix_sync(vf, vs + kk * 16 * L::kKvLd + f * 16, L::kKvLd);
          wmma::mma_sync(pv, pf[kk], vf, pv);
        }
        wmma::store_matrix_sync(wpv, pv, 16, wmma::mem_row_major);
        __syncwarp();
#pragma unroll
        for (int e = 0; e < 8; ++e) o[f][e] = o[f][e] * alpha + wpv[my_r * 16 + my_half * 8 + e];
        __syncwarp();
      }
    }
    __syncthreads();  // the stage of tile t is refilled by the load of tile t + 2
  }
  cp_async_wait<0>();

  if (!my_valid) return;
  const float inv = row_inv_sum(st);
  const int64_t tok = tok0 + my_node;
  const int hq = row_query_head(my_row, group, kvh);
  if (a.splits == 1) {
    T* dst = static_cast<T*>(a.out) + tok * a.out_stride_token + hq * a.out_stride_head + my_half * 8;
#pragma unroll
    for (int f = 0; f < D / 16; ++f) {
      alignas(16) T packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = from_float<T>(o[f][e] * inv);
      *reinterpret_cast<uint4*>(dst + f * 16) = *reinterpret_cast<const uint4*>(packed);
    }
  } else {
    const int64_t prow = (static_cast<int64_t>(split) * a.total_nodes + tok) * a.q_heads + hq;
    float* dst = a.partial_out + prow * D + my_half * 8;
#pragma unroll
    for (int f = 0; f < D / 16; ++f) {
      *reinterpret_cast<float4*>(dst + f * 16) = make_float4(o[f][0] * inv, o[f][1] * inv, o[f][2] * inv, o[f][3] * inv);
      *reinterpret_cast<float4*>(dst + f * 16 + 4) =
          make_float4(o[f][4] * inv, o[f][5] * inv, o[f][6] * inv, o[f][7] * inv);
    }
    if (my_half == 0) a.partial_lse[prow] = row_lse2(st);
  }
}

// Merge of the splits: one warp per (token, query head); lane l owns D/32 consecutive dimensions.
template <typename T, int D>
__global__ void __launch_bounds__(256) merge_splits_kernel(const TreeAttentionArgs a) {
  constexpr int kPer = D / 32;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= a.total_nodes * a.q_heads) return;
  const int64_t tok = w / a.q_heads;
  const int hq = static_cast<int>(w % a.q_heads);
  const int b = find_request(a.offsets, a.batch, tok);
  const int splits_b = request_splits(a.ctx_lens[b], a.chunk);
  const int64_t stride = a.total_nodes * a.q_heads;  // between splits, in rows
  float lmax = kNegInf;
  for (int s = lane; s < splits_b; s += 32) lmax = fmaxf(lmax, a.partial_lse[s * stride + w]);
  for (int off = 16; off > 0; off >>= 1) lmax = fmaxf(lmax, __shfl_xor_sync(0xffffffffu, lmax, off));
  float acc[kPer] = {};
  float wsum = 0.f;
  for (int s = 0; s < splits_b; ++s) {
    const float wt = merge_weight(a.partial_lse[s * stride + w], lmax);
    wsum += wt;
    if (wt == 0.f) continue;
    const float* src = a.partial_out + (s * stride + w) * D + lane * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] += wt * src[e];
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  T* dst = static_cast<T*>(a.out) + tok * a.out_stride_token + hq * a.out_stride_head + lane * kPer;
#pragma unroll
  for (int e = 0; e < kPer; ++e) dst[e] = from_float<T>(acc[e] * inv);
}

}  // namespace kernel
}  // namespace sssd_cuda
