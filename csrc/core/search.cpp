#include "core/search.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/parallel.h"
#include "core/sa_range.h"
#include "core/search_index.h"
#include "core/trie_insert.h"

namespace sssd {

void validate_search_params(const SearchParams& p) {
  if (p.min_query_len < 1) throw std::invalid_argument("min_query_len must be >= 1");
  if (p.max_query_len < p.min_query_len) throw std::invalid_argument("max_query_len must be >= min_query_len");
  if (p.min_occurrences < 0) throw std::invalid_argument("min_occurrences must be >= 0");
  if (p.max_samples < 0) throw std::invalid_argument("max_samples must be >= 0");
  if (p.max_depth < 0) throw std::invalid_argument("max_depth must be >= 0");
}

namespace {

using search_detail::Range;

// Suffix lengths whose ranges are searched together in one lockstep round.
constexpr int32_t kLengthsPerRound = 16;
constexpr int32_t kShortLengthsFirst = 4;

// Per-thread buffers, reused across contexts so that a search allocates nothing in the steady state.
struct Scratch {
  std::vector<uint32_t> query;                    // [max_len] context suffix as stream symbols
  std::vector<uint8_t> known;                     // [max_len + 1] range of this length computed
  std::vector<uint64_t> totals;                   // [max_len + 1] occurrences over all shards
  std::vector<Range> ranges;                      // [(max_len + 1) * shards]
  std::vector<Range> round_ranges;                // [lengths in a round]
  std::vector<int32_t> lengths;                   // lengths of the current round
  std::vector<search_detail::Cursor> cursors, next_cursors;
  std::vector<uint64_t> run;                      // suffix-array indices of one sampled run
  search_detail::RunScratch insert;
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

class ContextSearch {
 public:
  ContextSearch(const std::vector<DatastoreView>& views, const std::vector<const SearchIndex*>& indexes,
                const SearchParams& p, uint64_t vocab, int32_t max_len, Scratch& sc)
      : views_(views), indexes_(indexes), p_(p), vocab_(vocab), max_len_(max_len), sc_(sc) {
    const size_t n = static_cast<size_t>(max_len) + 1;
    sc.known.assign(n, 0);
    sc.totals.assign(n, 0);
    sc.ranges.resize(n * views.size());
    sc.insert.index.clear();
  }

  uint64_t total(int32_t len) const { return sc_.totals[static_cast<size_t>(len)]; }
  bool known(int32_t len) const { return sc_.known[static_cast<size_t>(len)] != 0; }

  // Searches the ranges of sc_.lengths in every shard.
  void compute_round() {
    const auto n = static_cast<int32_t>(sc_.lengths.size());
    sc_.round_ranges.resize(sc_.lengths.size());
    const uint32_t* query_end = sc_.query.data() + max_len_;
    for (size_t s = 0; s < views_.size(); ++s) {
      search_detail::with_typed_shard(views_[s], [&](const auto& sh) {
        search_detail::find_ranges(sh, indexes_[s], query_end, sc_.lengths.data(), n, sc_.round_ranges.data(),
                                   sc_.cursors, sc_.next_cursors);
      });
      for (int32_t j = 0; j < n; ++j) {
        const auto len = static_cast<size_t>(sc_.lengths[static_cast<size_t>(j)]);
        sc_.ranges[len * views_.size() + s] = sc_.round_ranges[static_cast<size_t>(j)];
        sc_.totals[len] += sc_.round_ranges[static_cast<size_t>(j)].count();
      }
    }
    for (int32_t len : sc_.lengths) sc_.known[static_cast<size_t>(len)] = 1;
  }

  // The longest suffix length with an occurrence (0 when even min_query_len has none). Occurrence is
  // monotone in the length, so this is a search over lengths; each round probes up to
  // kLengthsPerRound lengths spread over the open interval (all of them when it is short enough).
  int32_t longest_match() {
    int32_t lo = p_.min_query_len, hi = max_len_;  // answer in [lo, hi] once total(lo) > 0
    // First round: the shortest lengths (live contexts mostly match only a few tokens) and the longest
    // (a context copied from the corpus matches in full); later rounds fill in between.
    sc_.lengths.clear();
    for (int32_t len = lo; len <= hi && len < lo + kShortLengthsFirst; ++len) sc_.lengths.push_back(len);
    if (sc_.lengths.back() != hi) sc_.lengths.push_back(hi);
    for (;;) {
      compute_round();
      if (total(p_.min_query_len) == 0) return 0;
      for (int32_t len = lo + 1; len <= hi; ++len) {
        if (!known(len)) continue;
        if (total(len) > 0) {
          lo = len;
        } else {
          hi = len - 1;
          break;
        }
      }
      if (lo == hi) return lo;
      sc_.lengths.clear();
      pick_lengths(lo, hi, kLengthsPerRound);
    }
  }

  // Samples the occurrences of suffix length len and inserts their continuations. Returns the number
  // of occurrences.
  uint64_t sample(int32_t len, CandidateTrie& out) {
    if (!known(len)) {  // search a round of shorter lengths as well: they may be needed next
      sc_.lengths.clear();
      for (int32_t l = len; l >= p_.min_query_len && l > len - kLengthsPerRound; --l) {
        if (!known(l)) sc_.lengths.push_back(l);
      }
      compute_round();
    }
    const uint64_t n = total(len);
    const uint64_t k = std::min<uint64_t>(n, static_cast<uint64_t>(p_.max_samples));
    const Range* r = &sc_.ranges[static_cast<size_t>(len) * views_.size()];
    size_t s = 0;
    uint64_t base = 0;  // global index of shard s's first occurrence
    sc_.run.clear();
    for (uint64_t i = 0; i < k; ++i) {
      // The i-th of k indices spread evenly over the concatenated ranges.
      uint64_t g = i;
      if (n != k) {  // i * n fits in 64 bits unless the range is beyond 2^32 occurrences
        g = n < (uint64_t{1} << 32) ? i * n / k
                                    : static_cast<uint64_t>((static_cast<unsigned __int128>(i) * n) / k);
      }
      while (g >= base + r[s].count()) {
        flush_run(s, len, out);
        base += r[s++].count();
      }
      sc_.run.push_back(r[s].lo + (g - base));
    }
    flush_run(s, len, out);
    return n;
  }

 private:
  void pick_lengths(int32_t lo, int32_t hi, int32_t max_count) {
    const int32_t width = hi - lo;  // candidates lo + 1 .. hi
    if (width <= 0) return;
    if (width <= max_count) {
      for (int32_t len = lo + 1; len <= hi; ++len) sc_.lengths.push_back(len);
      return;
    }
    for (int32_t j = 1; j <= max_count; ++j) {
      const int64_t step = (static_cast<int64_t>(width) * j + max_count - 1) / max_count;
      const int32_t len = lo + static_cast<int32_t>(step);
      if (sc_.lengths.empty() || sc_.lengths.back() != len) sc_.lengths.push_back(len);
    }
  }

  void flush_run(size_t s, int32_t len, CandidateTrie& out) {
    if (sc_.run.empty()) return;
    search_detail::with_typed_shard(views_[s], [&](const auto& sh) {
      search_detail::insert_run(sh, sc_.run.data(), sc_.run.size(), len, p_.max_depth, vocab_, out, sc_.insert);
    });
    sc_.run.clear();
  }

  const std::vector<DatastoreView>& views_;
  const std::vector<const SearchIndex*>& indexes_;
  const SearchParams& p_;
  uint64_t vocab_;
  int32_t max_len_;
  Scratch& sc_;
};

// indexes[s]: the SearchIndex of views[s], or nullptr.
void search_one(const std::vector<DatastoreView>& views, const std::vector<const SearchIndex*>& indexes,
                TokenSpan context, const SearchParams& p, CandidateTrie& out) {
  out.reset(context.size > 0 ? context.data[context.size - 1] : -1);
  if (views.empty()) return;
  const uint64_t vocab = views[0].header->vocab_size;
  Scratch& sc = scratch();

  const int32_t max_len = static_cast<int32_t>(std::min<int64_t>(p.max_query_len, context.size));
  sc.query.resize(static_cast<size_t>(std::max(max_len, 0)));
  for (int32_t j = 0; j < max_len; ++j) {
    const int32_t t = context.data[context.size - max_len + j];
    if (t < 0 || static_cast<uint64_t>(t) >= vocab) {
      throw std::invalid_argument("context token id " + std::to_string(t) +
                                  " is outside the datastore vocabulary [0, " + std::to_string(vocab) + ")");
    }
    sc.query[static_cast<size_t>(j)] = static_cast<uint32_t>(t) + 1;
  }
  if (max_len < p.min_query_len || p.max_samples == 0) return;

  ContextSearch search(views, indexes, p, vocab, max_len, sc);
  const int32_t longest = search.longest_match();
  for (int32_t len = longest; len >= p.min_query_len && longest > 0; --len) {
    const uint64_t n = search.sample(len, out);
    if (static_cast<int64_t>(n) >= p.min_occurrences) break;
  }
}

// Holds the shards' indexes (built on first use) for the duration of a search.
struct Indexes {
  explicit Indexes(const std::vector<DatastoreView>& views) {
    for (const auto& v : views) {
      owned.push_back(search_index_for(v));
      raw.push_back(owned.back().get());
    }
  }
  std::vector<std::shared_ptr<const SearchIndex>> owned;
  std::vector<const SearchIndex*> raw;
};

}  // namespace

void search_context(const std::vector<DatastoreView>& views, TokenSpan context, const SearchParams& p,
                    CandidateTrie& out) {
  const Indexes indexes(views);
  search_one(views, indexes.raw, context, p, out);
}

void search_batch(const std::vector<DatastoreView>& shards, const std::vector<TokenSpan>& contexts,
                  const SearchParams& p, std::vector<CandidateTrie>& out) {
  validate_search_params(p);
  out.resize(contexts.size());
  if (contexts.empty()) return;
  const Indexes indexes(shards);
  parallel_for(static_cast<int64_t>(contexts.size()), [&](int64_t i) {
    search_one(shards, indexes.raw, contexts[static_cast<size_t>(i)], p, out[static_cast<size_t>(i)]);
  });
}

}  // namespace sssd
