#include "core/search.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/parallel.h"
#include "core/sa_range.h"
#include "core/search_index.h"
#include "core/search_memo.h"
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
  std::vector<int32_t> full_lengths, win_lengths, win_slots, win_lcps;  // one shard's round, split
  std::vector<Range> windows, full_out, win_out;
  std::vector<search_detail::Cursor> cursors, next_cursors;
  std::vector<uint64_t> run;                      // suffix-array indices of one sampled run
  search_detail::RunScratch insert;
  // Whether this thread's recent contexts (searched without a cache) matched in full: a saturating
  // score, up when the longest match is the whole query, down otherwise (see longest_match).
  int32_t full_score = 0;
};

// Contexts copied from the corpus match at every length; live ones mostly at a few. The first round
// searches all lengths at once (one chain of memory latencies instead of two dependent rounds) when the
// score is at least this; it affects only which rounds run, never a result.
constexpr int32_t kFullScoreMax = 8;
constexpr int32_t kFullScoreSpeculate = 4;

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// A window (cached range) is searched instead of the whole shard when it holds at most this many
// sample strides' worth of suffixes (a window search reads the suffix array and stream at every step;
// the index search reads in-memory keys first and the mapped file only for log2(stride) steps).
constexpr uint64_t kWindowStrides = 2;

class ContextSearch {
 public:
  ContextSearch(const std::vector<DatastoreView>& views, const std::vector<const SearchIndex*>& indexes,
                const SearchParams& p, uint64_t vocab, int32_t max_len, Scratch& sc, const SearchCache* prev,
                int64_t grown)
      : views_(views), indexes_(indexes), p_(p), vocab_(vocab), max_len_(max_len), sc_(sc), prev_(prev),
        grown_(grown) {
    const size_t n = static_cast<size_t>(max_len) + 1;
    sc.known.assign(n, 0);
    sc.totals.assign(n, 0);
    sc.ranges.resize(n * views.size());
    sc.insert.index.clear();
    if (prev_ == nullptr) return;
    // Lengths known without a search: no occurrence (empty window), or the same query (nothing grown).
    for (int32_t len = 1; len <= max_len; ++len) {
      const int32_t l0 = prev_len(len);
      if (l0 < 0) continue;
      const uint64_t t0 = prev_->totals[static_cast<size_t>(l0)];
      if (t0 != 0 && grown_ != 0) continue;
      sc.known[static_cast<size_t>(len)] = 1;
      sc.totals[static_cast<size_t>(len)] = t0;
      for (size_t s = 0; s < views.size(); ++s) sc.ranges[static_cast<size_t>(len) * views.size() + s] = prev_window(l0, s);
    }
  }

  uint64_t total(int32_t len) const { return sc_.totals[static_cast<size_t>(len)]; }
  bool known(int32_t len) const { return sc_.known[static_cast<size_t>(len)] != 0; }

  // Searches the ranges of sc_.lengths in every shard: inside the cached window where there is a small
  // one, else from scratch.
  void compute_round() {
    const uint32_t* query_end = sc_.query.data() + max_len_;
    for (size_t s = 0; s < views_.size(); ++s) {
      sc_.full_lengths.clear();
      sc_.win_lengths.clear();
      sc_.win_slots.clear();
      sc_.win_lcps.clear();
      sc_.windows.clear();
      const uint64_t limit = indexes_[s] != nullptr ? kWindowStrides * indexes_[s]->stride() : UINT64_MAX;
      for (int32_t len : sc_.lengths) {
        const int32_t l0 = prev_len(len);
        const Range w = l0 >= 0 ? prev_window(l0, s) : Range{};
        if (l0 >= 0 && w.count() <= limit) {
          sc_.win_lengths.push_back(len);
          sc_.windows.push_back(w);
          sc_.win_lcps.push_back(l0);
        } else {
          sc_.full_lengths.push_back(len);
        }
      }
      sc_.full_out.resize(sc_.full_lengths.size());
      sc_.win_out.resize(sc_.win_lengths.size());
      search_detail::with_typed_shard(views_[s], [&](const auto& sh) {
        if (!sc_.full_lengths.empty()) {
          search_detail::find_ranges(sh, indexes_[s], query_end, sc_.full_lengths.data(),
                                     static_cast<int32_t>(sc_.full_lengths.size()), sc_.full_out.data(),
                                     sc_.cursors, sc_.next_cursors);
        }
        if (!sc_.win_lengths.empty()) {
          search_detail::find_ranges_within(sh, query_end, sc_.win_lengths.data(),
                                            static_cast<int32_t>(sc_.win_lengths.size()), sc_.windows.data(),
                                            sc_.win_lcps.data(), sc_.win_out.data(), sc_.cursors);
        }
      });
      store(sc_.full_lengths, sc_.full_out, s);
      store(sc_.win_lengths, sc_.win_out, s);
    }
    for (int32_t len : sc_.lengths) sc_.known[static_cast<size_t>(len)] = 1;
  }

  // The longest suffix length with an occurrence (0 when even min_query_len has none). Occurrence is
  // monotone in the length, so this is a search over lengths; each round probes up to
  // kLengthsPerRound lengths spread over the open interval (all of them when it is short enough).
  int32_t longest_match() {
    const int32_t min_len = p_.min_query_len;
    int32_t lo = min_len - 1, hi = max_len_;  // total(lo) > 0 once lo >= min_len; total(hi + 1) == 0
    for (bool first = true;; first = false) {
      for (int32_t len = std::max(lo + 1, min_len); len <= hi; ++len) {  // narrow by the known lengths
        if (!known(len)) continue;
        if (total(len) > 0) {
          lo = len;
        } else {
          hi = len - 1;
          break;
        }
      }
      if (hi < min_len) return 0;
      if (lo == hi) return lo;
      sc_.lengths.clear();
      if (first && prev_len(hi) >= 0) {
        // The previous match extended by the new tokens, when it still occurs, is the answer: one
        // search inside its (small) cached window.
        sc_.lengths.push_back(hi);
      } else if (lo < min_len && prev_ == nullptr && sc_.full_score >= kFullScoreSpeculate) {
        // Nothing known yet, and this thread's recent contexts matched in full: probe every length
        // (or kLengthsPerRound spread up to hi) in this one round.
        pick_lengths(min_len - 1, hi, kLengthsPerRound);
      } else if (lo < min_len) {
        // Nothing known to occur yet. The shortest lengths (live contexts mostly match only a few
        // tokens) and the longest (a context copied from the corpus matches in full); later rounds
        // fill in between. Every length in [min_len, hi] is unknown here.
        for (int32_t len = min_len; len <= hi && len < min_len + kShortLengthsFirst; ++len) sc_.lengths.push_back(len);
        if (sc_.lengths.back() != hi) sc_.lengths.push_back(hi);
      } else {
        pick_lengths(lo, hi, kLengthsPerRound);
      }
      compute_round();
    }
  }

  // Samples the occurrences of suffix length len and inserts their continuations. Returns the number
  // of occurrences.
  uint64_t sample(int32_t len, CandidateTrie& out) {
    search_detail::MemoKey key;
    const bool memo = len <= 2 && out.size() == 1 && out.counts[0] == 0 &&
                      search_detail::TrieMemo::enabled().load(std::memory_order_relaxed);
    if (memo) {
      key = search_detail::MemoKey{generation_, &views_, len, p_.max_depth, p_.max_samples,
                                   sc_.query[static_cast<size_t>(max_len_ - len)],
                                   len == 2 ? sc_.query[static_cast<size_t>(max_len_ - 1)] : 0};
      uint64_t total = 0;
      if (const CandidateTrie* t = search_detail::TrieMemo::for_this_thread().find(key, &total)) {
        out = *t;
        return total;
      }
    }
    const uint64_t n = sample_datastore(len, out);
    if (memo) search_detail::TrieMemo::for_this_thread().store(key, out, n);
    return n;
  }

  uint64_t sample_datastore(int32_t len, CandidateTrie& out) {
    if (!known(len)) {  // search a round of shorter lengths as well: they may be needed next
      // (fewer with a cache: its window searches are cheap one at a time)
      const int32_t span = prev_ != nullptr ? kShortLengthsFirst : kLengthsPerRound;
      sc_.lengths.clear();
      for (int32_t l = len; l >= p_.min_query_len && l > len - span; --l) {
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

  // Stores the ranges found so far in `cache` (for the context's next search).
  void save(SearchCache& cache) const {
    const size_t n = static_cast<size_t>(max_len_) + 1, m = views_.size();
    cache.max_len = max_len_;
    cache.query.assign(sc_.query.begin(), sc_.query.begin() + max_len_);
    cache.known.assign(sc_.known.begin(), sc_.known.begin() + static_cast<std::ptrdiff_t>(n));
    cache.totals.assign(sc_.totals.begin(), sc_.totals.begin() + static_cast<std::ptrdiff_t>(n));
    cache.bounds.resize(2 * n * m);
    for (size_t i = 0; i < n * m; ++i) {
      cache.bounds[2 * i] = sc_.ranges[i].lo;
      cache.bounds[2 * i + 1] = sc_.ranges[i].hi;
    }
  }

 private:
  // The cached length whose range contains that of suffix length len (same symbols minus the grown
  // tail), or -1 when there is none.
  int32_t prev_len(int32_t len) const {
    if (prev_ == nullptr) return -1;
    const int64_t l0 = static_cast<int64_t>(len) - grown_;
    if (l0 < 1 || l0 > prev_->max_len || prev_->known[static_cast<size_t>(l0)] == 0) return -1;
    return static_cast<int32_t>(l0);
  }
  Range prev_window(int32_t l0, size_t s) const {
    const size_t i = static_cast<size_t>(l0) * views_.size() + s;
    return Range{prev_->bounds[2 * i], prev_->bounds[2 * i + 1]};
  }

  void store(const std::vector<int32_t>& lengths, const std::vector<Range>& found, size_t s) {
    for (size_t j = 0; j < lengths.size(); ++j) {
      const auto len = static_cast<size_t>(lengths[j]);
      sc_.ranges[len * views_.size() + s] = found[j];
      sc_.totals[len] += found[j].count();
    }
  }

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
  const SearchCache* prev_;  // a cache that fits this context, or null
  int64_t grown_;            // tokens appended since the cached search
  uint64_t generation_ = mapping_generation();
};

// Whether `cache` holds a search of a prefix of this context in these shards: its query symbols are
// the context's symbols just before the cached length.
bool cache_fits(const SearchCache& cache, const std::vector<DatastoreView>& views, const std::vector<uint32_t>& query,
                int32_t max_len, TokenSpan context) {
  if (cache.context_len < 0 || cache.context_len > context.size || !search_detail::same_shards(cache.shards, views) ||
      cache.generation != mapping_generation()) {
    return false;
  }
  const int64_t grown = context.size - cache.context_len;
  for (int32_t j = 0; j < cache.max_len; ++j) {
    // Context position cache.context_len - cache.max_len + j; it is inside the current query when
    // grown + cache.max_len - j <= max_len, else read (and convert) from the context.
    const int64_t back = grown + cache.max_len - j;  // distance from the context's end
    const uint32_t sym = back <= max_len ? query[static_cast<size_t>(max_len - back)]
                                         : static_cast<uint32_t>(context.data[context.size - back]) + 1;
    if (sym != cache.query[static_cast<size_t>(j)]) return false;
  }
  return true;
}

// indexes[s]: the SearchIndex of views[s], or nullptr.
// The number of context tokens a query may use (at most max_query_len), after checking them: with
// kNoMatch, a token past the vocabulary ends the usable suffix (it occurs nowhere in the datastore).
int32_t usable_suffix(TokenSpan context, int32_t max_query_len, uint64_t vocab, OutOfVocab oov) {
  const int32_t max_len = static_cast<int32_t>(std::min<int64_t>(max_query_len, context.size));
  for (int32_t k = 1; k <= max_len; ++k) {  // k-th token from the end
    const int32_t t = context.data[context.size - k];
    if (t >= 0 && static_cast<uint64_t>(t) < vocab) continue;
    if (t < 0 || oov == OutOfVocab::kError) {
      throw std::invalid_argument("context token id " + std::to_string(t) +
                                  " is outside the datastore vocabulary [0, " + std::to_string(vocab) + ")");
    }
    return k - 1;
  }
  return max_len;
}

void search_one(const std::vector<DatastoreView>& views, const std::vector<const SearchIndex*>& indexes,
                TokenSpan context, const SearchParams& p, CandidateTrie& out, SearchCache* cache,
                OutOfVocab oov) {
  out.reset(context.size > 0 ? context.data[context.size - 1] : -1);
  if (views.empty()) return;
  const uint64_t vocab = views[0].header->vocab_size;
  Scratch& sc = scratch();

  const int32_t max_len = usable_suffix(context, p.max_query_len, vocab, oov);
  sc.query.resize(static_cast<size_t>(std::max(max_len, 0)));
  for (int32_t j = 0; j < max_len; ++j) {
    sc.query[static_cast<size_t>(j)] = static_cast<uint32_t>(context.data[context.size - max_len + j]) + 1;
  }
  if (max_len < p.min_query_len || p.max_samples == 0) return;

  const bool fits = cache != nullptr && cache_fits(*cache, views, sc.query, max_len, context);
  ContextSearch search(views, indexes, p, vocab, max_len, sc, fits ? cache : nullptr,
                       fits ? context.size - cache->context_len : 0);
  const int32_t longest = search.longest_match();
  if (!fits) {
    const bool full = longest == max_len && max_len > p.min_query_len + kShortLengthsFirst;
    sc.full_score = std::clamp(sc.full_score + (full ? 1 : -1), 0, kFullScoreMax);
  }
  for (int32_t len = longest; len >= p.min_query_len && longest > 0; --len) {
    const uint64_t n = search.sample(len, out);
    if (static_cast<int64_t>(n) >= p.min_occurrences) break;
  }
  if (cache != nullptr) {
    search.save(*cache);
    cache->context_len = context.size;
    cache->shards.resize(views.size());
    for (size_t i = 0; i < views.size(); ++i) cache->shards[i] = views[i].header;
    cache->generation = mapping_generation();
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

void set_search_memo(bool on) { search_detail::TrieMemo::enabled().store(on, std::memory_order_relaxed); }

void search_context(const std::vector<DatastoreView>& views, TokenSpan context, const SearchParams& p,
                    CandidateTrie& out, SearchCache* cache, OutOfVocab oov) {
  const Indexes indexes(views);
  search_one(views, indexes.raw, context, p, out, cache, oov);
}

void search_batch(const std::vector<DatastoreView>& shards, const std::vector<TokenSpan>& contexts,
                  const SearchParams& p, std::vector<CandidateTrie>& out) {
  validate_search_params(p);
  check_shards(shards);
  out.resize(contexts.size());
  if (contexts.empty()) return;
  const Indexes indexes(shards);
  parallel_for(static_cast<int64_t>(contexts.size()), [&](int64_t i) {
    search_one(shards, indexes.raw, contexts[static_cast<size_t>(i)], p, out[static_cast<size_t>(i)], nullptr,
               OutOfVocab::kError);
  });
}

}  // namespace sssd
