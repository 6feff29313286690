// The recent-outputs pool: finished requests' outputs shared by all requests, bounded by a token budget
// with least-recently-used eviction (a document is "used" when it is added or contributes a candidate).
// Evicted documents are only marked dead; when dead tokens outnumber live ones the index is rebuilt from
// the live documents, so eviction costs O(1) amortized per token.
#pragma once
#include <cstdint>
#include <vector>

#include "core/ngram_index.h"

namespace sssd {

class RecentPool {
 public:
  RecentPool(int32_t max_n, int64_t max_tokens);
  // Adds one document (its last max_tokens tokens when longer), evicting LRU documents as needed.
  void add(const int32_t* tokens, int64_t n, int64_t stamp);
  void touch(int32_t doc, int64_t stamp) { last_used_[static_cast<size_t>(doc)] = stamp; }
  const NgramIndex& index() const { return index_; }
  int64_t live_tokens() const { return live_; }
  int64_t live_documents() const { return live_docs_; }
  int64_t max_tokens() const { return max_tokens_; }
  void clear();

 private:
  void compact();
  NgramIndex index_;
  std::vector<int64_t> last_used_;  // [index_.num_documents()]
  int64_t max_tokens_;
  int64_t live_ = 0, dead_ = 0, live_docs_ = 0;
};

}  // namespace sssd
