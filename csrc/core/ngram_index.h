// An incremental index of a token stream (split into documents) for finding continuations of the
// longest matching suffix of a query: the input source (one request's prompt + output, one document)
// and the recent-outputs pool (many documents) both use it.
//
// For every position p and n = 1..max_n it records the previous position whose n-gram ending there has
// the same hash (a hash chain per n), so appending a token costs O(max_n) amortized and a 32k-token
// prompt is indexed in a few milliseconds. A query walks the chain of its longest indexed suffix that
// occurs, verifies each hit by comparing tokens backwards (no false matches from hash collisions) and
// measures the true match length up to max_match.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/candidate_trie.h"

namespace sssd {

struct MatchParams {
  int32_t max_match = 32;        // true match lengths are measured up to this
  int32_t min_n = 1;             // shortest suffix used
  int32_t min_occurrences = 4;   // fall back to shorter suffixes while fewer occurrences were found
  int32_t max_samples = 16;      // occurrences kept (longest matches first, then most recent)
  int32_t max_chain = 64;        // chain entries walked per suffix length
  int32_t max_depth = 8;         // continuation tokens per occurrence
};

struct Occurrence {
  int64_t end;        // position of the last matched token
  int32_t match_len;  // true length of the match (<= max_match)
};

class NgramIndex {
 public:
  explicit NgramIndex(int32_t max_n = 4);
  int32_t max_n() const { return max_n_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int32_t num_documents() const { return static_cast<int32_t>(doc_starts_.size()); }
  int32_t document_of(int64_t pos) const { return doc_of_[static_cast<size_t>(pos)]; }
  int64_t document_start(int32_t d) const { return doc_starts_[static_cast<size_t>(d)]; }
  int64_t document_end(int32_t d) const {
    return d + 1 < num_documents() ? doc_starts_[static_cast<size_t>(d) + 1] : size();
  }
  bool alive(int32_t d) const { return alive_[static_cast<size_t>(d)] != 0; }
  void kill_document(int32_t d) { alive_[static_cast<size_t>(d)] = 0; }

  void clear();
  // Starts a new document: later tokens never match across the boundary.
  void start_document();
  void append(const int32_t* tokens, int64_t n);

  // Occurrences of suffixes of query[0:qlen) whose end lies before `limit` (positions >= limit are
  // ignored, e.g. the query itself when it is the indexed stream) in live documents and have at least
  // one continuation token. Sorted by match length (desc), then position (most recent first).
  void find(const int32_t* query, int64_t qlen, int64_t limit, const MatchParams& p,
            std::vector<Occurrence>& out) const;

  // Inserts the continuations of `occ` (at most p.max_depth tokens, stopping at the document end)
  // into `trie` with weight 1 each. Appends the documents used to `docs_used` when not null.
  void add_continuations(const std::vector<Occurrence>& occ, const MatchParams& p,
                         CandidateTrie& trie, std::vector<int32_t>* docs_used) const;

 private:
  uint64_t key(int32_t n, uint64_t h) const;
  int32_t* slot(uint64_t k);
  int32_t lookup(uint64_t k) const;
  void grow();
  int32_t match_back(int64_t end, const int32_t* query, int64_t qlen, int32_t max_match) const;

  int32_t max_n_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> doc_of_;     // [size()] document of each position
  std::vector<int64_t> doc_starts_;
  std::vector<uint8_t> alive_;      // [num_documents()]
  std::vector<int32_t> prev_;       // [size() * max_n] previous end position with the same n-gram hash
  // Open addressing (linear probing): key -> latest end position (-1 = empty slot).
  std::vector<uint64_t> keys_;
  std::vector<int32_t> heads_;
  int64_t used_ = 0;
};

}  // namespace sssd
