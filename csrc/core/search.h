// Continuation search in one or more datastore shards (treated as one datastore).
//
// For a context c: find the longest suffix c[-L:] (L <= max_query_len) that occurs; then, for
// L = L*, L*-1, ... down to min_query_len, read at most max_samples occurrences of c[-L:] spread evenly
// over its suffix-array range (over all shards together) and insert the max_depth tokens that follow each
// occurrence (stopping at the document end) into a CandidateTrie; stop after the first L whose range
// holds at least min_occurrences occurrences. Occurrences of a longer suffix are also occurrences of
// the shorter ones, so longer matches weigh more.
//
// How it is fast (the output is exactly that of the plain algorithm above, node order included):
// - the ranges of several suffix lengths are binary-searched in lockstep with prefetching, so their
//   cache misses overlap (sa_range.h); first the 4 shortest lengths and the longest, then the rest;
// - each search starts in a lazily built in-memory index of sampled suffixes (search_index.h: inline
//   keys, first-symbol and symbol-pair tables) and only its last steps read the mapped file;
// - continuations sampled from one range arrive sorted, so insertion reuses the previous path and
//   needs a child lookup only under nodes that existed before the range (trie_insert.h);
// - per-thread scratch buffers: no allocation per context beyond the output trie;
// - optionally (SearchCache), a request's previous search is reused: when the context grew by n tokens
//   since, the occurrences of its suffix of length L are a sub-range of those of the previous context's
//   suffix of length L - n, so the new range is binary-searched inside that small window (reading one
//   new symbol per probe), lengths whose window is empty are known to have no occurrence, and the
//   longest match is at most the previous one + n: usually one cheap probe finds it;
// - the trie of a one- or two-symbol suffix sampled into an empty trie is memoized per thread.
#pragma once
#include <cstdint>
#include <vector>

#include "core/candidate_trie.h"
#include "core/datastore.h"

namespace sssd {

struct SearchParams {
  int32_t max_query_len = 16;
  int32_t min_query_len = 1;
  int64_t min_occurrences = 1;
  int32_t max_samples = 100;
  int32_t max_depth = 8;
};

void validate_search_params(const SearchParams& p);  // throws std::invalid_argument

struct TokenSpan {
  const int32_t* data;
  int64_t size;
};

// The suffix-array ranges found by one search of one context, to speed up the search of the same
// context after tokens were appended (a request's next step). Only a cache: the result is the same with
// or without it. It checks itself (same shards, and the new context starts with the cached context's
// last query symbols), so a shrunk or unrelated context just searches from scratch.
struct SearchCache {
  int64_t context_len = -1;        // context length of the cached search; -1: empty
  int32_t max_len = 0;             // query length of the cached search
  std::vector<const void*> shards;  // the headers of the shards searched, in order (all of them)
  uint64_t generation = 0;         // mapping_generation() when stored
  std::vector<uint32_t> query;     // [max_len] the cached query's symbols (token + 1)
  std::vector<uint8_t> known;      // [max_len + 1] range of this length was computed
  std::vector<uint64_t> totals;    // [max_len + 1] its occurrences over all shards
  std::vector<uint64_t> bounds;    // [(max_len + 1) * num_shards * 2] lo, hi per (length, shard)
  void clear() { context_len = -1; }
};

// What a context token >= the datastore's vocab_size means. kError: a bad argument (a caller searching
// the datastore directly passed ids of another vocabulary). kNoMatch: a token the datastore cannot hold
// (a model whose vocabulary is larger than the datastore's): no suffix containing it occurs, so the
// query is the context's tokens after the last such token. Negative ids are an error either way.
enum class OutOfVocab { kError, kNoMatch };

// Shards must share the vocabulary size (check_shards). Throws std::invalid_argument for a negative
// context token (or, with kError, one >= vocab_size) and DatastoreError for a corrupt suffix-array
// entry. With a cache: reads it (when it fits this context) and stores this search in it.
void search_context(const std::vector<DatastoreView>& shards, TokenSpan context, const SearchParams& p,
                    CandidateTrie& out, SearchCache* cache = nullptr, OutOfVocab oov = OutOfVocab::kError);


// Turns the per-thread memo of short-suffix tries (search_memo.h) on (the default) or off, for
// every thread; results are the same either way (tests compare them).
void set_search_memo(bool on);

// One trie per context, contexts searched in parallel (no Python objects are touched).
void search_batch(const std::vector<DatastoreView>& shards, const std::vector<TokenSpan>& contexts,
                  const SearchParams& p, std::vector<CandidateTrie>& out);

}  // namespace sssd
