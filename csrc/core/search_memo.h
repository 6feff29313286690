// Per-thread memo of the trie that sampling a one- or two-symbol suffix produces in an empty trie
// (internal to search.cpp).
//
// It is the most frequent case (live contexts mostly match only a few tokens, and frequent tokens
// recur across requests and steps), and the same query in the same datastore always samples the same
// occurrences, so a hit copies the trie instead of reading ~max_samples scattered suffix-array entries
// and continuations. Keys carry the mapping generation (search_index.h): a later mapping may reuse a
// released one's address.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/candidate_trie.h"

namespace sssd {
namespace search_detail {

struct MemoKey {
  uint64_t generation = 0;
  const void* shards_id = nullptr;  // the first shard's header
  size_t num_shards = 0;
  int32_t len = 0, max_depth = 0, max_samples = 0;
  uint32_t q0 = 0, q1 = 0;  // the suffix's symbols (q1 = 0 for one symbol)
  bool operator==(const MemoKey& o) const {
    return generation == o.generation && shards_id == o.shards_id && num_shards == o.num_shards && len == o.len &&
           max_depth == o.max_depth && max_samples == o.max_samples && q0 == o.q0 && q1 == o.q1;
  }
};

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
    if (!e.valid || !(e.key == k)) return nullptr;
    *total = e.total;
    return &e.trie;
  }
  void store(const MemoKey& k, const CandidateTrie& t, uint64_t total) {
    Entry& e = entries_[slot(k)];
    e.key = k;
    e.trie = t;
    e.total = total;
    e.valid = true;
  }

 private:
  static constexpr size_t kEntries = 256;  // direct-mapped
  struct Entry {
    bool valid = false;
    MemoKey key;
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
