// The recycled-candidates source: the verifier's own top-k, kept instead of discarded (Token Recycling,
// Luo et al., ACL 2025). Every verification computes the model's distribution at the nodes it walks; the
// table keeps, for every token, the model's top-k the last time it read that token (next[token]). Drafting
// reads it as a first-order guess of what follows any node's token, and adds the best guesses to the
// fused tree, scored like the other sources by a calibrated probability (by depth and rank).
//
// One table per drafter, shared by its requests and kept across them: what the model predicts after a
// token carries over between texts (that is where the source's value comes from, a cold table per
// request would relearn it every time), and one vocabulary-sized table costs what a per-request one would
// cost per request.
#pragma once
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "core/calibration.h"
#include "core/draft_tree.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sssd {

constexpr int32_t kMaxRecycledK = 32;           // candidates per token at most (top-k of the model)
constexpr uint64_t kMaxUnsizedRows = 1u << 20;  // rows a table without a vocabulary size may grow to
// Retrieval nodes continuing a match of at least this many tokens are not rescored: their source's
// calibration is by match length (p ~ 0.85-0.99 past 9 tokens, and right), the rescored groups are by
// rank only, so rescoring pulled such nodes, and the whole chain below them, down to the average of
// every retrieval node in the rank group (on the bundled prompts: MAL 6.0 -> 4.8 at 16 nodes).
constexpr int32_t kRescoreMaxMatch = 9;

// One recorded candidate: a token the model ranked after another, and its probability (within the top-k).
struct RecycledCandidate {
  int32_t id;  // -1: none (past the row's count)
  float prob;
};

#if defined(__SSE2__)
// The ids of a row of 8 candidates (k = 8, the default; the row is one cache line), in two vectors: ids
// 0-3 and 4-7. A row's count and a token's rank in it in a few instructions (x86; other targets count and
// compare one id at a time).
struct RowIds8 {
  __m128i lo, hi;
  explicit RowIds8(const RecycledCandidate* row) {
    const auto* f = reinterpret_cast<const float*>(row);  // id, prob, id, prob, ...
    lo = _mm_castps_si128(_mm_shuffle_ps(_mm_loadu_ps(f), _mm_loadu_ps(f + 4), _MM_SHUFFLE(2, 0, 2, 0)));
    hi = _mm_castps_si128(_mm_shuffle_ps(_mm_loadu_ps(f + 8), _mm_loadu_ps(f + 12), _MM_SHUFFLE(2, 0, 2, 0)));
  }
  // Bit j set: id j < 0.
  int32_t negative() const {
    return _mm_movemask_ps(_mm_castsi128_ps(lo)) | _mm_movemask_ps(_mm_castsi128_ps(hi)) << 4;
  }
  // Bit j set: id j == token.
  uint64_t equal(int32_t token) const {
    const __m128i t = _mm_set1_epi32(token);
    return static_cast<uint64_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(lo, t))) |
                                 _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(hi, t))) << 4);
  }
};
#endif

// An allocator with 64-byte (cache line) alignment: a table's rows start on a line, so with k = 8 a row
// (64 bytes) is one line.
template <class T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT: conversions between element types are implicit
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const LineAllocator<U>&) const { return false; }
};

class RecycledTable {
 public:
  // k: candidates kept per token, in [1, kMaxRecycledK]. vocab: the model's vocabulary (tokens at or past
  // it are never recorded); 0: unknown, the table grows to the largest token recorded, at most
  // kMaxUnsizedRows rows (larger tokens are not recorded). Memory: rows x k x 8 bytes, allocated as
  // tokens are recorded; pair_slots x (k x 8 + 8) bytes for the pair rows.
  RecycledTable(int32_t k, uint64_t vocab, int32_t pair_slots = 0);

  int32_t k() const { return k_; }
  // Row i of ids / probs ([n, width] row-major, best first) becomes the row of tokens[i] (a later row of
  // the same token wins); the first min(width, k) columns are kept, a repeated id once (its best rank).
  // The caller has checked the values (tokens and ids >= 0 and in the vocabulary, probs in [0, 1]).
  // prev (null: none): the token before each tokens[i] (< 0: unknown); a pair row keyed (prev, token)
  // is kept besides the token's row.
  // stamp: the rows' stamp (the lookups return it; the drafter numbers its recycle calls).
  void update(const int32_t* tokens, int64_t n, const int32_t* ids, const float* probs, int32_t width,
              const int32_t* prev = nullptr, uint32_t stamp = 0);
  // The candidates recorded after token t: their number (0: none), and *row points to them, best first;
  // *stamp (when asked for) the row's stamp.
  int32_t lookup(int32_t t, const RecycledCandidate** row, uint32_t* stamp = nullptr) const {
    const auto r = static_cast<uint64_t>(t);
    if (t < 0 || r >= num_rows_) return 0;
    *row = rows_.data() + r * static_cast<uint64_t>(k_);
    if (stamp != nullptr) *stamp = stamps_[r];
    return count(*row);
  }
  // The candidates recorded after the pair (a, b) (a read just before b), as lookup.
  int32_t lookup_pair(int32_t a, int32_t b, const RecycledCandidate** row, uint32_t* stamp = nullptr) const {
    if (pair_keys_.empty() || a < 0 || b < 0) return 0;
    const uint64_t key = pair_key(a, b);
    const uint64_t slot = pair_slot(key);
    if (pair_keys_[slot] != key) return 0;
    *row = pair_rows_.data() + slot * static_cast<uint64_t>(k_);
    if (stamp != nullptr) *stamp = pair_stamps_[slot];
    return count(*row);
  }
  // Asks for the lines lookup_pair(a, t) and lookup(t) read, without waiting for them: a lookup soon
  // after finds them in cache.
  void prefetch(int32_t a, int32_t t) const {
    const auto r = static_cast<uint64_t>(t);
    if (t >= 0 && r < num_rows_) {
      __builtin_prefetch(rows_.data() + r * static_cast<uint64_t>(k_));
      __builtin_prefetch(stamps_.data() + r);
    }
    if (pair_keys_.empty() || a < 0 || t < 0) return;
    const uint64_t slot = pair_slot(pair_key(a, t));
    __builtin_prefetch(pair_keys_.data() + slot);
    __builtin_prefetch(pair_rows_.data() + slot * static_cast<uint64_t>(k_));
    __builtin_prefetch(pair_stamps_.data() + slot);
  }
  int64_t rows_recorded() const { return recorded_; }
  void clear();

 private:
  using Rows = std::vector<RecycledCandidate, LineAllocator<RecycledCandidate>>;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Multiplicative hashing: the top bits of key * 2^64 / phi (one slot: shift 64, which C++ leaves undefined).
  uint64_t pair_slot(uint64_t key) const { return pair_shift_ >= 64 ? 0 : (key * 0x9E3779B97F4A7C15ull) >> pair_shift_; }
  // A row's candidates come first, then ids -1: its count is the number of ids >= 0, counted without a
  // branch (an early exit on the first -1 mispredicts as often as counts vary); with k = 8 on x86 it is
  // the position of the first id < 0, read from the ids' sign bits.
  int32_t count(const RecycledCandidate* row) const {
#if defined(__SSE2__)
    if (k_ == 8) return __builtin_ctz(static_cast<uint32_t>(RowIds8(row).negative()) | 0x100u);
#endif
    return k_ == 8 ? count_of<8>(row) : count_of<0>(row);
  }
  template <int32_t K>  // K > 0: k_ == K, a fixed trip count the compiler unrolls (8: the default k)
  int32_t count_of(const RecycledCandidate* row) const {
    int32_t c = 0;
    for (int32_t j = 0; j < (K > 0 ? K : k_); ++j) c += static_cast<int32_t>(row[j].id >= 0);
    return c;
  }
  // Writes the distinct ids of ids[0 .. w) (and their probs) to out, the rest of its k entries empty.
  int32_t keep_row(const int32_t* ids, const float* probs, int32_t w, RecycledCandidate* out) const;

  int32_t k_;
  uint64_t max_rows_;
  int32_t pair_shift_ = 64;
  std::vector<uint64_t> pair_keys_;  // [slots] (a, b) of the row in the slot (~0: empty)
  Rows pair_rows_;                   // [slots * k]
  Rows rows_;                        // [rows * k] (id -1 in a row's first entry: never recorded)
  std::vector<uint32_t> stamps_;     // [rows] the stamp of each row's last update
  std::vector<uint32_t> pair_stamps_;  // [slots]
  uint64_t num_rows_ = 0;            // rows_.size() / k
  int64_t recorded_ = 0;             // rows with a record
};

struct RecycleParams {
  int32_t max_depth = 8;          // no node deeper than this
  double min_f = 1e-4;            // no recycled candidate with a smaller f
  int32_t cap = 0;                // nodes selected at most (the tree must have room for cap new nodes)
  int32_t max_width = 0;          // nodes selected per depth level at most (<= 0: no limit)
  bool from_every_node = true;    // false: below the root and recycled nodes only (a subtree of its own)
  int32_t root_prev = -1;         // the context's token before the root (-1: none)
  // A node with a retrieval child continuing a match of at least this many tokens does not consult its
  // row: its children keep their retrieval p (none rescored) and it gets no candidates (0: off).
  int32_t trust_match = 0;
  // Rows stamped before this are stale: their candidates and rescored children are calibrated in a
  // group of their own (recycled_match(..., stale)); 0: every row counts as the request's own.
  uint32_t fresh_since = 0;
};

// Reusable buffers of select_recycled (one per thread): nothing is allocated once they are warm, and
// nothing proportional to the whole tree is cleared per call.
struct RecycleScratch {
  // A node the selection has taken and opened (its children on their way to the frontier): its row,
  // looked up once.
  struct Opened {
    const RecycledCandidate* row;
    int32_t count;   // candidates in the row (0: none, or the row was not needed)
    bool pair;       // a (previous token, token) pair's row
    bool stale;      // the row is older than the request (RecycleParams::fresh_since)
    float room;      // the p mass left to the node's recycled children
    uint64_t taken;  // bit j: the node has the rank-j candidate's token as a child
    float pending_p;  // the p of the node's next candidate (`candidate`)
    int32_t kid_next, kid_end;  // its children's keys not taken yet, best last: kids[kid_next .. kid_end)
    unsigned __int128 candidate;  // the key of its next candidate (0: none)
  };
  using Key = unsigned __int128;  // a heap item (a tree node or a recycled candidate) as one integer
  std::vector<Key> heap;          // max-heap of the frontier
  std::vector<int32_t> slot;      // [tree nodes] index in `opened` (written when a node is opened)
  std::vector<Opened> opened;     // [opened nodes] (its first entries)
  std::vector<Key> kids;          // the opened nodes' children's keys, each node's best last
  std::vector<int32_t> width;     // [max_depth + 2] nodes selected at each depth
  std::vector<float> bound;       // [max_depth + 1] largest calibrated p of a candidate at each depth
  // [2, max_depth + 1, kStaleRowMatch + 1] the calibration group of (recycled / rescored source, depth,
  // match feature)
  std::vector<int32_t> groups;
  uint64_t bound_version = 0;     // of the calibration `bound` and `groups` were computed from (0: none)
  int32_t bound_depth = -1;       // and its max_depth (-1: not computed yet)
};

// Best-first selection in a merged tree (fuse_merge's output: p the fused p of each node before sibling
// normalization) with the recycled candidates added as the selection reaches them, in place of
// fuse_finish + select_sequence. Returns in `seq` the selected nodes (at most params.cap, parents first,
// f never increasing), new nodes appended to the tree; the selected nodes' p and f are final.
//
// The frontier starts at the root. Taking a node opens it: its row (the (previous token, token) pair's
// when the model read that pair before, else its token's) is read once, and
// 1. Rescoring: each retrieval child whose token is in the row (match shorter than kRescoreMaxMatch) is
//    scored again with what the model's own ranking says of it, p = cal(kRescoredSource, depth,
//    recycled_match(its rank, pair), its retrieval p): agreement says more than either source alone. It
//    becomes a kRescoredSource node (raw = the retrieval p). A child absent from the row keeps its
//    retrieval score (the absent group would map every source and match length to one average).
// 2. The children's p are normalized as fuse_finish does (scaled to sum 1 when their sum exceeds it), f(c) =
//    f(node) * p(c), and they join the frontier in order (below).
// 3. Recycled candidates: the row's first candidate whose token is not a child yet joins the frontier with
//    p = min(cal(kRecycledSource, depth, recycled_match(rank, pair), its recorded probability), room),
//    where room is the mass the node's children leave (1 - their p sum) less what its recycled children
//    already took; taking one creates the node and makes the row's next candidate the node's. Only the
//    root, recycled nodes and (from_every_node) every node get candidates; none with f < min_f.
// The frontier holds one item per opened node, the first of its best child not taken yet and its candidate
// (taking it puts the node's next there), which selects as having every child and candidate there would;
// an item taken right after it joined (a chain of nodes) never enters the heap.
// A node with a retrieval child continuing a match of at least trust_match tokens (when > 0) skips 1 and
// 3: its row is not read, its children keep their retrieval p (2 still applies).
// Ties in f go to the lower node, tree nodes before candidates, then the lower rank. With no candidate
// in any row the selection is fuse_finish + select_sequence's, node for node. Without a calibration
// p = the raw score.
void select_recycled(const RecycledTable& table, const Calibration* cal, const RecycleParams& params,
                     CandidateTree& tree, std::vector<int32_t>& seq, RecycleScratch& s);

}  // namespace sssd
