// Fusion of the sources' candidate tries into one scored tree, and best-first selection in it.
//
// Each source's counts become raw estimates raw(v) = count(v) / (count(parent) + alpha) (alpha > 0 makes
// a continuation seen once less certain than one seen a hundred times); the calibration maps them to
// p_s(v); the fused p(v) is the largest p_s(v) over the sources that propose v (its "winner" source,
// whose features are kept for calibration) or their noisy-or; siblings are scaled down when their p sum
// exceeds 1. f(v) = product of p along the path from the root.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/calibration.h"
#include "core/candidate_trie.h"

namespace sssd {

struct FusionParams {
  float alpha = 1.0f;       // count smoothing of raw estimates
  bool noisy_or = false;    // fuse sources with 1 - prod(1 - p_s) instead of max_s p_s
  int32_t max_depth = 8;    // deeper candidates are dropped
  double min_f = 1e-4;      // candidates whose f (before sibling normalization) is below are dropped
};

// The fused tree, flat in creation order (parents[v] < v, node 0 the root). The arrays are sized for
// the largest tree seen so far and never shrink (a thread's tree is rebuilt for every request, so no
// allocation happens once warm); only the first size() entries belong to the current tree.
struct CandidateTree {
  std::vector<int32_t> tokens, parents, depth, match_len;  // [size()] (used part)
  std::vector<float> p, raw;                               // [size()] fused p(v|parent); winner's raw
  std::vector<double> f;                                   // [size()] accumulated probability
  std::vector<int8_t> source;                              // [size()] winner source (-1 for the root)
  std::vector<uint8_t> source_mask;                        // [size()] bit s: source s proposed v
  std::vector<int32_t> first_child, next_sibling;          // [size()] child lists (-1: none)
  // Scratch of fuse(), per trie node of the source being merged: trie node -> tree node (-1: dropped),
  // and the source's raw estimate and calibrated p_s.
  std::vector<int32_t> fuse_map;
  std::vector<float> fuse_raw, fuse_ps;

  // Empties the tree to its root, with room for max_nodes nodes (root included) without reallocation.
  void reset(int32_t root_token, int32_t max_nodes);
  int32_t size() const { return n_; }
  int32_t find_child(int32_t node, int32_t token) const {  // -1: none
    for (int32_t c = first_child[node]; c >= 0; c = next_sibling[c]) {
      if (tokens[c] == token) return c;
    }
    return -1;
  }
  int32_t child(int32_t node, int32_t token) {  // finds or creates
    const int32_t c = find_child(node, token);
    return c >= 0 ? c : new_child(node, token);
  }
  // Creates a child the caller knows is new. At most max_nodes (of reset) nodes may exist.
  int32_t new_child(int32_t node, int32_t token) {
    const int32_t c = n_++;
    tokens[c] = token;
    parents[c] = node;
    depth[c] = depth[node] + 1;
    match_len[c] = 0;
    p[c] = 0.0f;
    raw[c] = 0.0f;
    f[c] = 0.0;
    source[c] = -1;
    source_mask[c] = 0;
    first_child[c] = -1;
    next_sibling[c] = first_child[node];
    first_child[node] = c;
    return c;
  }

 private:
  int32_t n_ = 0;
};

// Reusable buffers of select_sequence (one per thread or per request: nothing allocated once warm).
struct SelectScratch {
  std::vector<int32_t> start, kids, fill, width;
  std::vector<std::pair<double, int32_t>> heap;
  std::vector<unsigned __int128> key_heap;  // the same heap as (f, node) integer keys
};

// tries[s] may be null (source off). Calibration may be null (p_s = raw). fuse = fuse_merge + fuse_finish.
void fuse(const CandidateTrie* const tries[kNumTrieSources], const Calibration* cal, const FusionParams& params,
          CandidateTree& out);
// The sources' tries merged into `out` (root: the first non-empty trie's), with room for extra_nodes
// more nodes: p(v) fused over the sources, f(v) a pruning estimate (the largest f(parent) * p_s(v)).
void fuse_merge(const CandidateTrie* const tries[kNumTrieSources], const Calibration* cal,
                const FusionParams& params, CandidateTree& out, int32_t extra_nodes = 0);
// Siblings whose p sum exceeds 1 scaled down to sum 1, then f(v) = f(parent) * p(v) exactly.
void fuse_finish(CandidateTree& out);

// Best-first selection: the non-root nodes of a connected subtree containing the root, in the order a
// greedy by f takes them (ties: lower index first), at most `cap` nodes, depth <= max_depth, at most
// max_width nodes per depth level (<= 0: no limit). Without the width limit the first k of the sequence
// maximize the sum of f over all connected subtrees of k non-root nodes (f never increases along a
// path). f values along the sequence never increase. parents[i] < i, node 0 is the root.
void select_sequence(const int32_t* parents, const double* f, const int32_t* depth, int32_t n, int32_t cap,
                     int32_t max_depth, int32_t max_width, std::vector<int32_t>& seq);
// The same on a fused tree (its child lists instead of a CSR built from the parents).
void select_sequence(const CandidateTree& t, int32_t cap, int32_t max_depth, int32_t max_width,
                     std::vector<int32_t>& seq, SelectScratch& scratch);

// Batch-wide allocation: seq_f[i] (non-increasing, len[i] entries) are the f values of tree i's greedy
// sequence. Returns in `order` the tree taking each rank 0, 1, ..., at most `budget` ranks.
// Without targets: a merge by f (joint greedy; ties to the lower tree index) -- maximizes the total f.
// With targets (tpot[i] > 0 seconds per token; <= 0 or NaN: none): first, while some request is short
// (need_i = (step_time + slack) / tpot[i] - (1 + sum of its taken f) > 0), give the next node of the
// request with the largest need; then merge by f.
void allocate_budget(const std::vector<const double*>& seq_f, const std::vector<int32_t>& len, int64_t budget,
                     const double* tpot, double step_time, double slack, std::vector<int32_t>& order);

}  // namespace sssd
