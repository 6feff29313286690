// tree_attention_cpu: the tree attention of a verification forward on the CPU (float32), packed layout.
//
// Each request's tree nodes attend the request's committed cache rows (all of them) and the tree nodes
// that are their ancestors or themselves (a bit mask per node). The work is split by (request, KV head):
// the request's queries of that KV head's query heads (nodes × group rows) are multiplied with its K rows
// read once (linear_rows' blocks), softmax per row, then multiplied with its V rows read once. Nothing is
// padded: a request reads its own rows only, whatever the longest context of the batch.
//
// Layout (N nodes, H query heads, Hkv KV heads, D head dim; strides in elements, D contiguous):
//   q, out           [N, H, D]        request b's nodes are rows offsets[b]..offsets[b+1]-1
//   k_tree, v_tree   [N, Hkv, D]      this step's K/V of the nodes
//   k_cache, v_cache [slots, Hkv, rows, D]   request b's committed rows 0..ctx_lens[b]-1 of slot slots[b]
//   masks            [N, 2] uint64    bit a (word a / 64) of node i's row: node a of its tree is visible
// Query head h reads KV head h / (H / Hkv).
#pragma once
#include <cstdint>

#include "core/simd.h"

namespace sssd {

struct TreeAttentionCpu {
  const float* q;
  int64_t q_node, q_head;
  float* out;
  int64_t out_node, out_head;
  const float* k_tree;
  int64_t kt_node, kt_head;
  const float* v_tree;
  int64_t vt_node, vt_head;
  const float* k_cache;
  const float* v_cache;
  int64_t kc_slot, kc_head, kc_row;  // shared by k_cache and v_cache
  const int64_t* offsets;            // [batch + 1]
  const int32_t* ctx_lens;           // [batch]
  const int32_t* slots;              // [batch]
  const uint64_t* masks;             // [N, 2]
  int64_t batch, heads, kv_heads, dim;
  float scale;
};

// out = softmax(q·kᵀ·scale over the visible rows)·v. OpenMP over (request, KV head) pairs on `threads`
// threads (0: OpenMP's default). Arguments are trusted: the bindings check shapes, strides and ranges.
void tree_attention_cpu(const TreeAttentionCpu& a, int threads, Isa isa = Isa::kBest);

// Node by node in double precision: the unit tests' reference.
void tree_attention_cpu_reference(const TreeAttentionCpu& a);

}  // namespace sssd
