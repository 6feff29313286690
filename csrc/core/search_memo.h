// Per-thread memo of the trie that sampling a one- or two-symbol suffix produces in an empty trie
// (internal to search.cpp).
//
// It is the most frequent case (live contexts mostly match only a few tokens, and frequent tokens
// recur across requests and steps), and the same query in the same datastore always samples the same
// occurrences, so a hit copies the trie instead of reading ~max_samples scattered suffix-array entries
// and continuations. Keys carry the mapping generation (search_index.h): a later mapping may reuse a
// released one's address. An entry is valid only for the exact list of shards it was sampled from.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/candidate_trie.h"
#include "core/datastore.h"

namespace sssd {
namespace search_detail {

struct MemoKey {
  uint64_t generation = 0;
  const std::vector<DatastoreView>* shards = nullptr;  // the searched shard list (every header counts)
  int32_t len = 0, max_depth = 0, max_samples = 0;
  uint32_t q0 = 0, q1 = 0;  // the suffix's symbols (q1 = 0 for one symbol)
};

// Whether `stored` (the headers of a memo entry's shards) names exactly the shards of `views`, in order.
// The whole list is compared: [A, B] and [A, C] share their first shard and their length.
inline bool same_shards(const std::vector<const void*>& stored, const std::vector<DatastoreView>& views) {
  if (stored.size() != views.size()) return false;
  for (size_t i = 0; i < views.size(); ++i) {
    if (stored[i] != views[i].header) return false;
  }
  return true;
}

class TrieMemo {
 public:
  static TrieMemo& for_this_thread() {
    static thread_local TrieMemo m;
    return m;
  }
  static std::atomic<bool>& enabled() {
    static std::atomic<bool> on{true};
    return on;
  }

  // The trie stored under k (and its occurrence count in *total), or null.
  const CandidateTrie* find(const MemoKey& k, uint64_t* total) const {
    const Entry& e = entries_[slot(k)];
    if (!e.valid || e.generation != k.generation || e.len != k.len || e.max_depth != k.max_depth ||
        e.max_samples != k.max_samples || e.q0 != k.q0 || e.q1 != k.q1 || !same_shards(e.shards, *k.shards)) {
      return nullptr;
    }
    *total = e.total;
    return &e.trie;
  }
  void store(const MemoKey& k, const CandidateTrie& t, uint64_t total) {
    Entry& e = entries_[slot(k)];
    e.generation = k.generation;
    e.shards.resize(k.shards->size());
    for (size_t i = 0; i < k.shards->size(); ++i) e.shards[i] = (*k.shards)[i].header;
    e.len = k.len;
    e.max_depth = k.max_depth;
    e.max_samples = k.max_samples;
    e.q0 = k.q0;
    e.q1 = k.q1;
    e.trie = t;
    e.total = total;
    e.valid = true;
  }

 private:
  static constexpr size_t kEntries = 256;  // direct-mapped
  struct Entry {
    bool valid = false;
    uint64_t generation = 0;
    std::vector<const void*> shards;  // headers of the shards searched, in order
    int32_t len = 0, max_depth = 0, max_samples = 0;
    uint32_t q0 = 0, q1 = 0;
    uint64_t total = 0;
    CandidateTrie trie;
  };
  static size_t slot(const MemoKey& k) {
    const uint64_t h = (uint64_t{k.q0} * 0x9E3779B97F4A7C15ull) ^ (uint64_t{k.q1} * 0xC2B2AE3D27D4EB4Full) ^
                       static_cast<uint64_t>(k.len);
    return static_cast<size_t>((h >> 32) % kEntries);
  }
  std::vector<Entry> entries_ = std::vector<Entry>(kEntries);
};

}  // namespace search_detail
}  // namespace sssd
