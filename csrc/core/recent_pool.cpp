#include "core/recent_pool.h"

#include <stdexcept>

namespace sssd {

RecentPool::RecentPool(int32_t max_n, int64_t max_tokens) : index_(max_n), max_tokens_(max_tokens) {
  if (max_tokens < 0) throw std::invalid_argument("pool max_tokens must be >= 0");
  clear();
}

void RecentPool::clear() {
  index_.clear();
  index_.kill_document(0);  // the initial (empty) document holds nothing
  last_used_.assign(1, -1);
  live_ = dead_ = live_docs_ = 0;
}

void RecentPool::add(const int32_t* tokens, int64_t n, int64_t stamp) {
  if (n > max_tokens_) {
    tokens += n - max_tokens_;
    n = max_tokens_;
  }
  if (n <= 0) return;
  while (live_ + n > max_tokens_) {
    int32_t lru = -1;
    for (int32_t d = 0; d < index_.num_documents(); ++d) {
      if (index_.alive(d) && (lru < 0 || last_used_[static_cast<size_t>(d)] < last_used_[static_cast<size_t>(lru)])) lru = d;
    }
    if (lru < 0) break;
    const int64_t len = index_.document_end(lru) - index_.document_start(lru);
    index_.kill_document(lru);
    live_ -= len;
    dead_ += len;
    --live_docs_;
  }
  if (dead_ > live_ && dead_ > 4096) compact();
  index_.start_document();
  if (index_.num_documents() > static_cast<int32_t>(last_used_.size())) last_used_.push_back(stamp);
  const int32_t d = index_.num_documents() - 1;
  last_used_[static_cast<size_t>(d)] = stamp;
  if (!index_.alive(d)) throw std::logic_error("recent pool: new document is not alive");
  index_.append(tokens, n);
  live_ += n;
  ++live_docs_;
}

void RecentPool::compact() {
  NgramIndex fresh(index_.max_n());
  fresh.kill_document(0);
  std::vector<int64_t> used;
  for (int32_t d = 0; d < index_.num_documents(); ++d) {
    if (!index_.alive(d)) continue;
    fresh.start_document();
    const int64_t s = index_.document_start(d);
    fresh.append(index_.tokens().data() + s, index_.document_end(d) - s);
    used.push_back(last_used_[static_cast<size_t>(d)]);
  }
  if (used.empty()) used.push_back(-1);
  index_ = std::move(fresh);
  last_used_ = std::move(used);
  dead_ = 0;
}

}  // namespace sssd
