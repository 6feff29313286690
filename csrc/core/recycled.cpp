#include "core/recycled.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/heap.h"

namespace sssd {

RecycledTable::RecycledTable(int32_t k, uint64_t vocab, int32_t pair_slots)
    : k_(k), max_rows_(vocab > 0 ? vocab : kMaxUnsizedRows) {
  if (k < 1 || k > kMaxRecycledK) {
    throw std::invalid_argument("recycled k must be in [1, " + std::to_string(kMaxRecycledK) + "]");
  }
  if (pair_slots < 0 || pair_slots > (1 << 24) || (pair_slots & (pair_slots - 1)) != 0) {
    throw std::invalid_argument("recycled pair slots must be 0 or a power of two <= 2^24");
  }
  if (pair_slots > 0) {
    int32_t bits = 0;
    while ((1 << bits) < pair_slots) ++bits;
    pair_shift_ = 64 - bits;
    pair_keys_.assign(static_cast<size_t>(pair_slots), ~uint64_t{0});
    pair_rows_.assign(static_cast<size_t>(pair_slots) * static_cast<size_t>(k), RecycledCandidate{-1, 0.0f});
    pair_stamps_.assign(static_cast<size_t>(pair_slots), 0);
  }
}

// A token repeated in a row is kept once (its first, best rank): then the tokens of a row are distinct
// and a rank names one candidate, which the expansion relies on.
int32_t RecycledTable::keep_row(const int32_t* ids, const float* probs, int32_t w, RecycledCandidate* out) const {
  int32_t kept = 0;
  for (int32_t j = 0; j < w; ++j) {
    bool seen = false;
    for (int32_t i = 0; i < kept; ++i) seen |= out[i].id == ids[j];
    if (!seen) out[kept++] = {ids[j], probs[j]};
  }
  for (int32_t j = kept; j < k_; ++j) out[j] = {-1, 0.0f};
  return kept;
}

void RecycledTable::update(const int32_t* tokens, int64_t n, const int32_t* ids, const float* probs, int32_t width,
                           const int32_t* prev, uint32_t stamp) {
  const int32_t w = std::min(width, k_);
  if (w <= 0) return;
  const auto k = static_cast<uint64_t>(k_);
  int64_t top = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint64_t>(tokens[i]) < max_rows_) top = std::max<int64_t>(top, tokens[i]);
  }
  uint64_t rows = num_rows_;
  if (top >= static_cast<int64_t>(rows)) {
    // Doubling keeps growth amortized; never past the bound.
    rows = std::min<uint64_t>(max_rows_, std::max<uint64_t>(static_cast<uint64_t>(top) + 1, 2 * rows));
    rows_.resize(rows * k, RecycledCandidate{-1, 0.0f});
    stamps_.resize(rows, 0);
    num_rows_ = rows;
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto row = static_cast<uint64_t>(tokens[i]);
    if (tokens[i] < 0 || row >= rows) continue;
    RecycledCandidate* out = rows_.data() + row * k;
    recorded_ += out[0].id < 0;
    const int32_t* in_ids = ids + i * width;
    const float* in_probs = probs + i * width;
    keep_row(in_ids, in_probs, w, out);
    stamps_[row] = stamp;
    if (prev != nullptr && prev[i] >= 0 && !pair_keys_.empty()) {
      const uint64_t key = pair_key(prev[i], tokens[i]);
      const uint64_t slot = pair_slot(key);  // direct-mapped: a newer pair takes the slot
      pair_keys_[slot] = key;
      pair_stamps_[slot] = stamp;
      keep_row(in_ids, in_probs, w, pair_rows_.data() + slot * k);
    }
  }
}

void RecycledTable::clear() {
  Rows().swap(rows_);
  std::vector<uint32_t>().swap(stamps_);
  num_rows_ = 0;
  std::fill(pair_stamps_.begin(), pair_stamps_.end(), 0);
  std::fill(pair_keys_.begin(), pair_keys_.end(), ~uint64_t{0});
  std::fill(pair_rows_.begin(), pair_rows_.end(), RecycledCandidate{-1, 0.0f});
  recorded_ = 0;
}

namespace {
using Key = RecycleScratch::Key;
using Opened = RecycleScratch::Opened;

// A frontier item as one integer that orders like the heap must: the larger f first; ties to the lower
// node, a tree node before a candidate, then the lower rank (a strict total order, so the selection does
// not depend on how the heap is built). The low 64 bits are ~code, code = node << 32 | candidate << 31 |
// rank. f >= 0 (a product of probabilities; a NaN counts as 0 and + 0.0 makes -0.0 +0.0), so its bits
// order as the value does. One integer comparison, no branches.
constexpr uint64_t kCandidate = uint64_t{1} << 31;
inline Key item_key(double f, uint64_t code) {
  const double g = f > 0.0 ? f : 0.0;
  uint64_t bits;
  std::memcpy(&bits, &g, sizeof bits);
  return (static_cast<Key>(bits) << 64) | ~code;
}
inline uint64_t node_code(int32_t v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)) << 32; }
inline uint64_t candidate_code(int32_t v, int32_t rank) {
  return node_code(v) | kCandidate | static_cast<uint32_t>(rank);
}
inline double key_f(Key k) {
  const auto hi = static_cast<uint64_t>(k >> 64);
  double f;
  std::memcpy(&f, &hi, sizeof f);
  return f;
}

// The largest p a new candidate can have at each depth: the maps are monotone in the raw score, so raw = 1
// gives each (source, depth, rank bucket) group's largest p.
void depth_bounds(const Calibration* cal, int32_t max_depth, std::vector<float>& bound) {
  bound.assign(static_cast<size_t>(max_depth) + 1, 1.0f);
  if (cal == nullptr) return;
  for (int32_t d = 1; d <= max_depth; ++d) {
    float b = 0.0f;
    for (int32_t m : cal->match_edges()) b = std::max(b, cal->apply(kRecycledSource, d, std::max(m, 1), 1.0f));
    bound[static_cast<size_t>(d)] = b;
  }
}

// Bit j set: row[j].id == token (j < count <= kMaxRecycledK). No early exit: rows are short, and the
// comparisons of a row run side by side.
template <int32_t K>
inline uint64_t rank_mask_of(const RecycledCandidate* row, int32_t count, int32_t token) {
  uint64_t m = 0;
  for (int32_t j = 0; j < (K > 0 ? K : count); ++j) m |= static_cast<uint64_t>(row[j].id == token) << j;
  return m;
}
// The whole row when it is 8 long (the default k; a fixed trip count the compiler unrolls): its entries
// past count are ids -1, which no token matches.
inline uint64_t rank_mask(const RecycledCandidate* row, int32_t count, int32_t k, int32_t token) {
#if defined(__SSE2__)
  if (k == 8) return RowIds8(row).equal(token);
#endif
  return k == 8 ? rank_mask_of<8>(row, count, token) : rank_mask_of<0>(row, count, token);
}

constexpr int32_t kMatches = kStaleRowMatch + 1;  // recycled_match's values are below this

// One selection: the tree, the table, the frontier heap.
class Selector {
 public:
  Selector(const RecycledTable& table, const Calibration* cal, const RecycleParams& params, CandidateTree& t,
           std::vector<int32_t>& seq, RecycleScratch& s)
      : table_(table), cal_(cal), params_(params), t_(t), seq_(seq), s_(s) {
    // The bounds change only with the calibration's values: computed again when they did (a request's
    // call reuses the last call's).
    const uint64_t version = cal != nullptr ? cal->version() : 0;
    if (s.bound_version != version || s.bound_depth != params.max_depth) {
      depth_bounds(cal, params.max_depth, s.bound);
      s.groups.assign(static_cast<size_t>(2 * (params.max_depth + 1) * kMatches), 0);
      for (int32_t src = 0; cal != nullptr && src < 2; ++src) {
        for (int32_t d = 0; d <= params.max_depth; ++d) {
          for (int32_t m = 0; m < kMatches; ++m) {
            s.groups[static_cast<size_t>((src * (params.max_depth + 1) + d) * kMatches + m)] =
                cal->group(kRecycledSource + src, d, m);
          }
        }
      }
      s.bound_version = version;
      s.bound_depth = params.max_depth;
    }
    s.heap.clear();
    // Opened entries: the root and each taken node but the last (at most cap + 1); sized, not cleared.
    if (s.opened.size() < static_cast<size_t>(params.cap) + 1) s.opened.resize(static_cast<size_t>(params.cap) + 1);
    s.width.assign(static_cast<size_t>(params.max_depth) + 2, 0);
    // Sized, not cleared: a node's slot is written when it is opened, and only opened nodes' are read;
    // the children of the opened nodes are at most every node but the root.
    if (s.slot.size() < static_cast<size_t>(t.size() + params.cap)) {
      s.slot.resize(static_cast<size_t>(t.size() + params.cap));
    }
    if (s.kids.size() < static_cast<size_t>(t.size() + params.cap)) {
      s.kids.resize(static_cast<size_t>(t.size() + params.cap));
    }
  }

  void run() {
    open(0);
    const auto cap = static_cast<size_t>(params_.cap);
    while (seq_.size() < cap) {
      // The frontier's first item: the hand's or the heap's top. A top taken stays in place while it
      // is taken: the first item pushed after replaces it (one sift down instead of a removal and an
      // insertion), else it is removed at the end.
      Key key;
      if (hand_ != 0 && (s_.heap.empty() || hand_ > s_.heap[0])) {
        key = hand_;
        hand_ = 0;
      } else if (!s_.heap.empty()) {
        key = s_.heap[0];
        top_free_ = true;
      } else {
        break;
      }
      const uint64_t code = ~static_cast<uint64_t>(key);
      int32_t v = static_cast<int32_t>(code >> 32);
      int32_t& w = s_.width[static_cast<size_t>(t_.depth[v] + ((code & kCandidate) != 0))];
      if (params_.max_width <= 0 || w < params_.max_width) {
        ++w;
        if ((code & kCandidate) != 0) {
          v = take(v, static_cast<int32_t>(code & (kCandidate - 1)), key_f(key));
        } else {
          Opened& o = opened(t_.parents[v]);
          --o.kid_end;  // v was its parent's best child left
          push_best(o);
        }  // (an item skipped for width leaves its node's other children and candidates off: same depth)
        seq_.push_back(v);
        if (seq_.size() < cap) open(v);  // the last node's children could not be taken
      }
      if (top_free_) {
        top_free_ = false;
        remove_top();
      }
    }
  }

 private:
  int32_t prev_of(int32_t v) const { return v == 0 ? params_.root_prev : t_.tokens[t_.parents[v]]; }
  // The calibrated p of a recycled (source kRecycledSource) or rescored (kRescoredSource) node at a depth
  // in [1, max_depth] with a match feature from recycled_match.
  float p_of(int32_t source, int32_t depth, int32_t match, float raw) const {
    if (cal_ == nullptr) return raw;
    const int32_t g = ((source - kRecycledSource) * (params_.max_depth + 1) + depth) * kMatches + match;
    return cal_->apply_group(s_.groups[static_cast<size_t>(g)], raw);
  }
  // f > 0 and f >= min_f, as one comparison (a NaN fails it).
  bool good(double f) const { return f >= min_good_; }
  // A retrieval child whose match is long enough to trust its source over the rows (trust_match).
  bool trusts(int32_t c) const {
    return params_.trust_match > 0 && t_.source[c] >= 0 && t_.source[c] < kNumTrieSources &&
           t_.match_len[c] >= params_.trust_match;
  }
  bool rescorable(int32_t c) const {
    return t_.source[c] >= 0 && t_.source[c] < kNumTrieSources && t_.match_len[c] < kRescoreMaxMatch;
  }
  // The frontier: a max-heap of keys (core/heap.h). While top_free_, the top is the item being taken: a
  // push takes its place.
  struct Order {
    using Item = Key;
    static bool first(Key a, Key b) { return a > b; }
  };
  // The frontier is the heap and the hand (one item out of the heap, or 0): an item better than the
  // hand's takes its place (the hand's goes to the heap), so an item taken right after it was pushed
  // (a chain of nodes, each its parent's best) never enters the heap.
  void push(Key k) {
    if (k > hand_) std::swap(k, hand_);
    if (k == 0) return;
    if (top_free_) {
      top_free_ = false;
      heap::heap_replace_top<Order>(s_.heap, &k);
    } else {
      heap::heap_push<Order>(s_.heap, k);
    }
  }
  void remove_top() { heap::heap_replace_top<Order>(s_.heap, nullptr); }

  Opened& opened(int32_t v) { return s_.opened[static_cast<size_t>(s_.slot[static_cast<size_t>(v)])]; }
  // Puts o's best item on the frontier: its best child not taken yet or its candidate, the first in the
  // frontier's order (one item per node: the other waits for it to be taken).
  void push_best(const Opened& o) {
    const Key kid = o.kid_end > o.kid_next ? s_.kids[static_cast<size_t>(o.kid_end - 1)] : Key{0};
    const Key best = std::max(kid, o.candidate);
    if (best == 0) return;
    prefetch_rows(best);
    push(best);
  }
  // The rows the item's node will read when opened, asked for now (it may be taken soon).
  void prefetch_rows(Key k) const {
    const uint64_t code = ~static_cast<uint64_t>(k);
    const auto v = static_cast<int32_t>(code >> 32);
    if ((code & kCandidate) != 0) {
      const Opened& o = s_.opened[static_cast<size_t>(s_.slot[static_cast<size_t>(v)])];
      table_.prefetch(t_.tokens[v], o.row[code & (kCandidate - 1)].id);
    } else {
      table_.prefetch(t_.tokens[t_.parents[v]], t_.tokens[v]);
    }
  }

  // Node v's entry in s_.opened, its row looked up when `read` (else none).
  Opened& make_opened(int32_t v, bool read) {
    s_.slot[static_cast<size_t>(v)] = num_opened_;
    Opened& o = s_.opened[static_cast<size_t>(num_opened_++)];
    o.row = nullptr;
    o.count = 0;
    o.pair = false;
    o.stale = false;
    o.room = 0.0f;
    o.taken = 0;
    if (read) {
      uint32_t stamp = 0;
      uint32_t* want = params_.fresh_since > 0 ? &stamp : nullptr;
      const int32_t c = table_.lookup_pair(prev_of(v), t_.tokens[v], &o.row, want);
      o.pair = c > 0;
      o.count = c > 0 ? c : table_.lookup(t_.tokens[v], &o.row, want);
      o.stale = o.count > 0 && stamp < params_.fresh_since;
    }
    return o;
  }

  // Child c (at depth d) of the node o is, with in its rank mask in o's row (!= 0), scored again.
  void rescore_child(int32_t c, int32_t d, const Opened& o, uint64_t in) {
    const int32_t match = recycled_match(__builtin_ctzll(in), o.pair, o.stale);
    t_.raw[c] = t_.p[c];
    t_.p[c] = p_of(kRescoredSource, d, match, t_.p[c]);
    t_.source[c] = static_cast<int8_t>(kRescoredSource);
    t_.match_len[c] = match;
    t_.source_mask[c] |= static_cast<uint8_t>(1u << kRecycledSource);
  }

  // Rescoring, normalization and f of v's children (pushed), then v's first recycled candidate.
  void open(int32_t v) {
    const int32_t d = t_.depth[v] + 1;
    if (d > params_.max_depth) return;  // no child or candidate is eligible
    bool candidates = (params_.from_every_node || v == 0 || t_.source[v] == kRecycledSource) &&
                      good(t_.f[v] * static_cast<double>(s_.bound[static_cast<size_t>(d)]));
    const int32_t first = t_.first_child[v];
    if (first < 0 || t_.next_sibling[first] < 0) {  // most nodes: no list to walk, nothing to sort
      open_leaf_or_chain(v, d, first, candidates);
      return;
    }
    bool rescore = false, trusted = false;
    for (int32_t c = first; c >= 0; c = t_.next_sibling[c]) {
      rescore |= rescorable(c);
      trusted |= trusts(c);
    }
    if (trusted) candidates = rescore = false;
    Opened& o = make_opened(v, candidates || rescore);
    // The sum in child-list order (decreasing index), as fuse_finish rounds it.
    float sum = 0.0f;
    for (int32_t c = t_.first_child[v]; c >= 0; c = t_.next_sibling[c]) {
      const uint64_t in = o.count > 0 ? rank_mask(o.row, o.count, table_.k(), t_.tokens[c]) : 0;
      o.taken |= in;
      if (in != 0 && rescorable(c)) rescore_child(c, d, o, in);
      sum += t_.p[c];
    }
    // The children's keys in s_.kids, best last: only the first of the best child not taken yet and the
    // node's candidate is on the frontier (taking it puts the next there), which orders the selection as
    // pushing them all would, with fewer and cheaper heap operations. Insertion sort: a node has a few
    // children (best last: in the drafter's trees a child list, in decreasing index, arrives worse first
    // more often than not, so fewer keys move).
    Key* kids = s_.kids.data();
    const int32_t begin = num_kids_;
    for (int32_t c = t_.first_child[v]; c >= 0; c = t_.next_sibling[c]) {
      if (sum > 1.0f) t_.p[c] /= sum;
      t_.f[c] = t_.f[v] * static_cast<double>(t_.p[c]);
      const Key key = item_key(t_.f[c], node_code(c));
      int32_t i = num_kids_++;
      for (; i > begin && kids[i - 1] > key; --i) kids[i] = kids[i - 1];
      kids[i] = key;
    }
    finish_open(v, o, begin, sum, candidates);
  }

  // open(v) when v has one child (c) or none (c < 0), as open does it without the walks and the sort.
  void open_leaf_or_chain(int32_t v, int32_t d, int32_t c, bool candidates) {
    const bool trusted = c >= 0 && trusts(c);
    const bool rescore = c >= 0 && !trusted && rescorable(c);
    candidates = candidates && !trusted;
    Opened& o = make_opened(v, candidates || rescore);
    const int32_t begin = num_kids_;
    float sum = 0.0f;
    if (c >= 0) {
      const uint64_t in = o.count > 0 ? rank_mask(o.row, o.count, table_.k(), t_.tokens[c]) : 0;
      o.taken = in;
      if (in != 0 && rescore) rescore_child(c, d, o, in);
      sum += t_.p[c];
      if (sum > 1.0f) t_.p[c] /= sum;
      t_.f[c] = t_.f[v] * static_cast<double>(t_.p[c]);
      s_.kids[static_cast<size_t>(num_kids_++)] = item_key(t_.f[c], node_code(c));
    }
    finish_open(v, o, begin, sum, candidates);
  }

  // The end of opening v (o): its children's keys are s_.kids[begin .. num_kids_), their p sum `sum`;
  // its first candidate when it gets them, and its first item on the frontier.
  void finish_open(int32_t v, Opened& o, int32_t begin, float sum, bool candidates) {
    o.kid_next = begin;
    o.kid_end = num_kids_;
    o.candidate = 0;
    if (candidates) {
      o.room = std::max(0.0f, 1.0f - std::min(sum, 1.0f));
      next_candidate(v, o, 0);
    }
    push_best(o);
  }

  // The p of v's rank-j candidate: its calibrated p, at most the room v's children leave.
  float candidate_p(const Opened& o, int32_t depth, int32_t j) const {
    return std::min(p_of(kRecycledSource, depth, recycled_match(j, o.pair, o.stale), o.row[j].prob), o.room);
  }
  // o.candidate: node v's (o's) first candidate from rank j on whose token is not a child of v yet, when
  // its f is good (else 0). Ranks come one at a time: the next is found when this one is taken.
  void next_candidate(int32_t v, Opened& o, int32_t j) {
    o.candidate = 0;
    // Ranks j .. count - 1 whose token is not a child yet (count <= kMaxRecycledK < 64, j <= count).
    const uint64_t free = ~o.taken & ((uint64_t{1} << o.count) - 1) & (~uint64_t{0} << j);
    if (free == 0) return;
    j = __builtin_ctzll(free);
    o.pending_p = candidate_p(o, t_.depth[v] + 1, j);
    const double f = t_.f[v] * static_cast<double>(o.pending_p);
    if (good(f)) o.candidate = item_key(f, candidate_code(v, j));
  }

  // Creates the node of u's rank-j candidate (f: its key's) and puts u's next item on the frontier.
  int32_t take(int32_t u, int32_t j, double f) {
    Opened& o = opened(u);
    const float p = o.pending_p;  // the candidate is u's one on the frontier
    const RecycledCandidate c = o.row[j];
    const int32_t match = recycled_match(j, o.pair, o.stale);
    o.room = std::max(0.0f, o.room - p);
    o.taken |= uint64_t{1} << j;
    next_candidate(u, o, j + 1);
    push_best(o);
    const int32_t v = t_.new_child(u, c.id);
    t_.source[v] = static_cast<int8_t>(kRecycledSource);
    t_.raw[v] = c.prob;
    t_.match_len[v] = match;
    t_.p[v] = p;
    t_.source_mask[v] = static_cast<uint8_t>(1u << kRecycledSource);
    t_.f[v] = f;
    return v;
  }

  const RecycledTable& table_;
  const Calibration* cal_;
  const RecycleParams& params_;
  CandidateTree& t_;
  std::vector<int32_t>& seq_;
  RecycleScratch& s_;
  bool top_free_ = false;
  Key hand_ = 0;
  int32_t num_opened_ = 0;  // entries of s_.opened in use
  int32_t num_kids_ = 0;    // of s_.kids
  // The least good f: min_f, or the least positive double when min_f <= 0 (a NaN min_f stays: none is).
  const double min_good_ = params_.min_f > 0.0 || std::isnan(params_.min_f) ? params_.min_f
                                                                           : std::numeric_limits<double>::denorm_min();
};
}  // namespace

void select_recycled(const RecycledTable& table, const Calibration* cal, const RecycleParams& params,
                     CandidateTree& tree, std::vector<int32_t>& seq, RecycleScratch& s) {
  seq.clear();
  if (params.cap <= 0 || params.max_depth < 0 || tree.size() < 1) return;
  Selector(table, cal, params, tree, seq, s).run();
}

}  // namespace sssd
