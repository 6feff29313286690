#include "core/ngram_index.h"

#include <algorithm>
#include <stdexcept>

namespace sssd {

namespace {
inline uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
}  // namespace

NgramIndex::NgramIndex(int32_t max_n) : max_n_(max_n) {
  if (max_n < 1 || max_n > 16) throw std::invalid_argument("index max_n must be in [1, 16]");
  clear();
}

void NgramIndex::clear() {
  tokens_.clear();
  doc_of_.clear();
  doc_starts_.assign(1, 0);
  alive_.assign(1, 1);
  prev_.clear();
  keys_.assign(1024, 0);
  heads_.assign(1024, -1);
  used_ = 0;
}

void NgramIndex::start_document() {
  if (doc_starts_.back() == size()) {  // the current document is still empty: reuse it
    alive_.back() = 1;
    return;
  }
  doc_starts_.push_back(size());
  alive_.push_back(1);
}

uint64_t NgramIndex::key(int32_t n, uint64_t h) const { return mix(h + static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ULL); }

int32_t NgramIndex::lookup(uint64_t k) const {
  const size_t mask = keys_.size() - 1;
  for (size_t i = k & mask;; i = (i + 1) & mask) {
    if (heads_[i] < 0) return -1;
    if (keys_[i] == k) return heads_[i];
  }
}

int32_t* NgramIndex::slot(uint64_t k) {
  const size_t mask = keys_.size() - 1;
  for (size_t i = k & mask;; i = (i + 1) & mask) {
    if (heads_[i] < 0) {  // heads_ (4 bytes a slot) is probed first: new keys rarely touch keys_
      keys_[i] = k;
      ++used_;
      return &heads_[i];
    }
    if (keys_[i] == k) return &heads_[i];
  }
}

void NgramIndex::grow() {
  std::vector<uint64_t> old_keys(keys_.size() * 2, 0);
  std::vector<int32_t> old_heads(heads_.size() * 2, -1);
  old_keys.swap(keys_);
  old_heads.swap(heads_);
  used_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_heads[i] >= 0) *slot(old_keys[i]) = old_heads[i];
  }
}

void NgramIndex::append(const int32_t* tokens, int64_t n) {
  if (size() + n >= (int64_t{1} << 31)) throw std::length_error("n-gram index holds at most 2^31 tokens");
  // Geometric growth (reserve(size + n) on every small append would copy the whole index each time).
  if (tokens_.size() + static_cast<size_t>(n) > tokens_.capacity()) {
    const size_t want = std::max(tokens_.size() + static_cast<size_t>(n), 2 * tokens_.capacity());
    tokens_.reserve(want);
    doc_of_.reserve(want);
    prev_.reserve(want * static_cast<size_t>(max_n_));
  }
  // One rehash up front for a long append (at most one new key per n-gram).
  const uint64_t keys_needed = static_cast<uint64_t>(used_) + static_cast<uint64_t>(n) * static_cast<uint64_t>(max_n_);
  while (keys_needed * 2 > keys_.size() && static_cast<uint64_t>(n) > keys_.size() / 8) grow();
  const int32_t doc = num_documents() - 1;
  const int64_t doc_start = doc_starts_.back();
  for (int64_t i = 0; i < n; ++i) {
    const auto pos = static_cast<int32_t>(size());
    tokens_.push_back(tokens[i]);
    doc_of_.push_back(doc);
    uint64_t h = 0;
    for (int32_t len = 1; len <= max_n_; ++len) {
      int32_t prev = -1;
      if (pos - len + 1 >= doc_start) {
        h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens_[static_cast<size_t>(pos - len + 1)])) + 1));
        if (static_cast<uint64_t>(used_ + 1) * 2 > keys_.size()) grow();
        int32_t* head = slot(key(len, h));
        prev = *head;
        *head = pos;
      }
      prev_.push_back(prev);
    }
  }
}

int32_t NgramIndex::match_back(int64_t end, const int32_t* query, int64_t qlen, int32_t max_match) const {
  const int64_t start = doc_starts_[static_cast<size_t>(doc_of_[static_cast<size_t>(end)])];
  int32_t m = 0;
  while (m < max_match && end - m >= start && qlen - 1 - m >= 0 &&
         tokens_[static_cast<size_t>(end - m)] == query[qlen - 1 - m]) {
    ++m;
  }
  return m;
}

void NgramIndex::find(const int32_t* query, int64_t qlen, int64_t limit, const MatchParams& p,
                      std::vector<Occurrence>& out) const {
  out.clear();
  if (qlen <= 0 || size() == 0) return;
  const int32_t top = static_cast<int32_t>(std::min<int64_t>(max_n_, qlen));
  uint64_t hashes[17];
  uint64_t h = 0;
  for (int32_t len = 1; len <= top; ++len) {
    h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(query[qlen - len])) + 1));
    hashes[len] = key(len, h);
  }
  for (int32_t len = top; len >= std::max(p.min_n, 1); --len) {
    int32_t pos = lookup(hashes[len]);
    for (int32_t walked = 0; pos >= 0 && walked < p.max_chain; ++walked) {
      const int32_t at = pos;
      pos = prev_[static_cast<size_t>(at) * static_cast<size_t>(max_n_) + static_cast<size_t>(len - 1)];
      if (at >= limit) continue;
      const int32_t d = doc_of_[static_cast<size_t>(at)];
      if (!alive_[static_cast<size_t>(d)] || at + 1 >= document_end(d)) continue;  // no continuation
      const int32_t m = match_back(at, query, qlen, p.max_match);
      if (m < len) continue;                  // hash collision
      if (len < top && m > len) continue;  // already found at a longer length
      out.push_back({at, m});
    }
    if (static_cast<int64_t>(out.size()) >= p.min_occurrences) break;
  }
  std::sort(out.begin(), out.end(), [](const Occurrence& a, const Occurrence& b) {
    return a.match_len != b.match_len ? a.match_len > b.match_len : a.end > b.end;
  });
  if (static_cast<int64_t>(out.size()) > p.max_samples) out.resize(static_cast<size_t>(p.max_samples));
}

void NgramIndex::add_continuations(const std::vector<Occurrence>& occ, const MatchParams& p,
                                   CandidateTrie& trie, std::vector<int32_t>* docs_used) const {
  trie.reserve_more(static_cast<int32_t>(occ.size()) * std::max(p.max_depth, 0));
  for (const Occurrence& o : occ) {
    const int32_t d = doc_of_[static_cast<size_t>(o.end)];
    const int64_t stop = std::min(document_end(d), o.end + 1 + static_cast<int64_t>(p.max_depth));
    trie.counts[0] += 1;
    int32_t node = 0;
    int64_t q = o.end + 1;
    // Follow (or extend) the existing path while it exists; once a node is created it has no children,
    // so the rest of the continuation is appended without sibling scans (same nodes, same order).
    for (; q < stop; ++q) {
      const int32_t next_new = trie.size();  // the index a created child gets
      node = trie.add_child(node, tokens_[static_cast<size_t>(q)], 1, o.match_len);
      if (node == next_new) {
        ++q;
        break;
      }
    }
    for (; q < stop; ++q) node = trie.add_new_child(node, tokens_[static_cast<size_t>(q)], 1, o.match_len);
    if (docs_used != nullptr) docs_used->push_back(d);
  }
}

}  // namespace sssd
