// Inserting the sampled continuations of one suffix-array range into a CandidateTrie (internal to
// search.cpp).
//
// The occurrences of a suffix are consecutive in the suffix array, so the continuations sampled from
// one range (of one shard) arrive in sorted order. Two consequences make insertion cheap:
// - a continuation shares its first lcp symbols with the previous one, so those nodes are the previous
//   path (no lookup);
// - at the first differing symbol its token is larger than that of every child created so far in this
//   run under the same parent, so a child is new unless the parent existed before the run started; only
//   then is a lookup needed, in a hash index of the nodes that existed before the run.
// The result (node order included) is exactly that of inserting each continuation with add_child.
#pragma once
#include <cstdint>
#include <vector>

#include "core/candidate_trie.h"
#include "core/sa_range.h"

namespace sssd {
namespace search_detail {

// (parent, token) -> child for the nodes of one trie; open addressing, cleared in O(1) by a generation.
class ChildIndex {
 public:
  void clear() {
    indexed_ = 1;  // the root is nobody's child
    if (++gen_ == 0) {
      for (auto& s : slots_) s.gen = 0;
      gen_ = 1;
    }
  }

  // Adds the nodes created since the last call, growing the table (load <= 1/2) when needed.
  void update(const CandidateTrie& t) {
    const auto n = static_cast<size_t>(t.size());
    if (2 * n > slots_.size()) {
      size_t cap = 1024;
      while (cap < 2 * n) cap *= 2;
      slots_.assign(cap, Slot{0, 0, 0});
      gen_ = 1;
      indexed_ = 1;
    }
    const size_t mask = slots_.size() - 1;
    for (size_t i = static_cast<size_t>(indexed_); i < n; ++i) {
      const uint64_t k = key(t.parents[i], t.tokens[i]);
      size_t h = hash(k) & mask;
      while (slots_[h].gen == gen_) h = (h + 1) & mask;
      slots_[h] = Slot{k, static_cast<int32_t>(i), gen_};
    }
    indexed_ = static_cast<int32_t>(n);
  }

  int32_t find(int32_t parent, int32_t token) const {
    const uint64_t k = key(parent, token);
    const size_t mask = slots_.size() - 1;
    for (size_t h = hash(k) & mask; slots_[h].gen == gen_; h = (h + 1) & mask) {
      if (slots_[h].key == k) return slots_[h].node;
    }
    return -1;
  }

 private:
  struct Slot {
    uint64_t key;
    int32_t node;
    uint32_t gen;
  };
  static uint64_t key(int32_t parent, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) | static_cast<uint32_t>(token);
  }
  // splitmix64's finalizer: every key bit affects the low bits used as the slot.
  static size_t hash(uint64_t k) {
    k = (k ^ (k >> 30)) * 0xBF58476D1CE4E5B9ull;
    k = (k ^ (k >> 27)) * 0x94D049BB133111EBull;
    return static_cast<size_t>(k ^ (k >> 31));
  }

  std::vector<Slot> slots_;
  uint32_t gen_ = 0;
  int32_t indexed_ = 1;
};

// Per-thread buffers reused across contexts.
struct RunScratch {
  std::vector<uint64_t> starts;   // [k] stream positions of the sampled continuations
  std::vector<int32_t> path;      // [max_depth] nodes of the previous continuation
  std::vector<uint32_t> prev;     // [max_depth] its symbols
  ChildIndex index;
};

// Inserts the continuations (at most max_depth tokens, up to the document end) that follow the
// occurrences sa[idx[0..k)] of a suffix of length `len`; idx is increasing (one range, one shard).
template <class Sym, class Idx>
void insert_run(const TypedShard<Sym, Idx>& sh, const uint64_t* idx, size_t k, int32_t len, int32_t max_depth,
                uint64_t vocab, CandidateTrie& t, RunScratch& sc) {
  // Software pipeline: while continuation i is inserted, the stream of i + kAhead and the suffix-array
  // entry of i + 2 * kAhead are being fetched (a bounded number of misses in flight: prefetches beyond
  // what the core can track are dropped).
  constexpr size_t kAhead = 12;
  sc.starts.resize(k);
  const uint64_t tail = static_cast<uint64_t>(std::max(max_depth, 1) - 1);
  auto fetch_entry = [&](size_t i) { prefetch(sh.sa + idx[i]); };
  auto fetch_stream = [&](size_t i) {
    const uint64_t start = sh.position(idx[i]) + static_cast<uint64_t>(len);
    if (start >= sh.stream_length) throw DatastoreError("corrupt datastore: unsorted suffix array");
    sc.starts[i] = start;
    prefetch(sh.stream + start);
    prefetch(sh.stream + start + tail);  // the continuation may cross a cache line
  };
  for (size_t i = 0; i < k && i < 2 * kAhead; ++i) fetch_entry(i);
  for (size_t i = 0; i < k && i < kAhead; ++i) fetch_stream(i);
  const uint64_t most = uint64_t{k} * static_cast<uint64_t>(max_depth);
  t.reserve_more(static_cast<int32_t>(std::min<uint64_t>(most, 1 << 16)));
  if (sc.path.size() < static_cast<size_t>(max_depth)) {
    sc.path.resize(static_cast<size_t>(max_depth));
    sc.prev.resize(static_cast<size_t>(max_depth));
  }
  // Nodes >= run_start were created in this run; the root counts as such while it has no children.
  const int32_t run_start = t.size() == 1 ? 0 : t.size();
  if (run_start > 0) sc.index.update(t);
  int32_t* path = sc.path.data();
  uint32_t* prev = sc.prev.data();
  int32_t prev_len = 0;
  for (size_t i = 0; i < k; ++i) {
    if (i + 2 * kAhead < k) fetch_entry(i + 2 * kAhead);
    if (i + kAhead < k) fetch_stream(i + kAhead);
    const Sym* s = sh.stream + sc.starts[i];
    t.counts[0] += 1;
    int32_t d = 0, node = 0;
    while (d < prev_len && s[d] == prev[d]) {  // prev[d] >= 1, so this stops at a separator
      node = path[d++];
      t.counts[static_cast<size_t>(node)] += 1;
    }
    for (; d < max_depth; ++d) {
      const uint32_t sym = s[d];
      if (sym == 0) break;  // document end
      if (sym > vocab) throw DatastoreError("corrupt datastore: token id outside the vocabulary");
      const auto tok = static_cast<int32_t>(sym - 1);
      int32_t c = node < run_start ? sc.index.find(node, tok) : -1;
      if (c >= 0) {
        t.counts[static_cast<size_t>(c)] += 1;
      } else {
        c = t.add_new_child(node, tok, 1, len);
      }
      path[d] = c;
      prev[d] = sym;
      node = c;
    }
    prev_len = d;
  }
}

}  // namespace search_detail
}  // namespace sssd
