#include "core/drafter.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "core/parallel.h"

namespace sssd {

namespace {
void check_match(const MatchParams& m, const char* what) {
  const std::string w(what);
  if (m.max_match < 1) throw std::invalid_argument(w + " max_match must be >= 1");
  if (m.min_n < 1) throw std::invalid_argument(w + " min_n must be >= 1");
  if (m.min_occurrences < 0) throw std::invalid_argument(w + " min_occurrences must be >= 0");
  if (m.max_samples < 0) throw std::invalid_argument(w + " max_samples must be >= 0");
  if (m.max_chain < 1) throw std::invalid_argument(w + " max_chain must be >= 1");
}
}  // namespace

void validate_drafter_params(const DrafterParams& p) {
  if (p.index_max_n < 1 || p.index_max_n > 16) throw std::invalid_argument("index_max_n must be in [1, 16]");
  check_match(p.input, "input");
  check_match(p.pool, "pool");
  validate_search_params(p.search);
  if (!(p.fusion.alpha >= 0.0f) || !std::isfinite(p.fusion.alpha)) throw std::invalid_argument("alpha must be finite and >= 0");
  if (!(p.fusion.min_f >= 0.0) || !std::isfinite(p.fusion.min_f)) throw std::invalid_argument("min_f must be finite and >= 0");
  if (p.max_depth < 1 || p.max_depth > 64) throw std::invalid_argument("max_depth must be in [1, 64]");
  if (p.ds_max_depth < 0) throw std::invalid_argument("ds_max_depth must be >= 0");
  if (p.max_tree_nodes < 0) throw std::invalid_argument("max_tree_nodes must be >= 0");
  if (p.pool_max_tokens < 0) throw std::invalid_argument("pool_max_tokens must be >= 0");
  if (p.recycle_k < 1 || p.recycle_k > kMaxRecycledK) {
    throw std::invalid_argument("recycle_k must be in [1, " + std::to_string(kMaxRecycledK) + "]");
  }
  if (p.threads < 0 || p.threads > kMaxThreads) {
    throw std::invalid_argument("threads must be in [0, " + std::to_string(kMaxThreads) + "]");
  }
}

Drafter::Drafter(const DrafterParams& params, std::vector<DatastoreView> shards,
                 std::vector<std::shared_ptr<const void>> owners)
    : params_(params), shards_(std::move(shards)), owners_(std::move(owners)),
      pool_(params.index_max_n, params.pool_max_tokens), recycled_(params.recycle_k, params.vocab_size, params.use_recycled ? params.recycle_pair_slots : 0) {
  validate_drafter_params(params_);
  check_shards(shards_);
  params_.fusion.max_depth = params_.max_depth;
  params_.input.max_depth = params_.pool.max_depth = params_.max_depth;
  params_.search.max_depth = params_.ds_max_depth > 0 ? std::min(params_.ds_max_depth, params_.max_depth) : params_.max_depth;
}

void Drafter::check_tokens(const int32_t* tokens, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || (params_.vocab_size > 0 && static_cast<uint64_t>(t) >= params_.vocab_size)) {
      throw std::invalid_argument("token id " + std::to_string(t) + " at index " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(params_.vocab_size) + ")");
    }
  }
}

Drafter::Request& Drafter::get(int64_t rid) {
  auto it = requests_.find(rid);
  if (it == requests_.end()) throw UnknownRequest("unknown request id " + std::to_string(rid));
  return it->second;
}

void Drafter::append(Request& r, const int32_t* tokens, int64_t n) {
  if (params_.use_input) r.index.append(tokens, n); else r.plain.insert(r.plain.end(), tokens, tokens + n);
}

void Drafter::add_request(int64_t rid, const int32_t* tokens, int64_t n) {
  if (n <= 0) throw std::invalid_argument("prompt of request " + std::to_string(rid) + " is empty");
  check_tokens(tokens, n);
  std::lock_guard<std::mutex> lock(mutex_);
  if (requests_.count(rid)) throw std::invalid_argument("request id " + std::to_string(rid) + " already exists");
  Request r(params_.index_max_n);
  append(r, tokens, n);
  r.prompt_len = n;
  r.recycle_since = recycle_calls_ + 1;
  requests_.emplace(rid, std::move(r));
}

void Drafter::extend(int64_t rid, const int32_t* tokens, int64_t n) {
  check_tokens(tokens, n);
  std::lock_guard<std::mutex> lock(mutex_);
  append(get(rid), tokens, n);
}

void Drafter::remove_request(int64_t rid, bool add_output_to_pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  Request& r = get(rid);
  if (add_output_to_pool && params_.use_pool) {
    const auto& c = r.context(params_.use_input);
    pool_.add(c.data() + r.prompt_len, static_cast<int64_t>(c.size()) - r.prompt_len, ++stamp_);
  }
  requests_.erase(rid);
}

void Drafter::add_to_pool(const int32_t* tokens, int64_t n) {
  check_tokens(tokens, n);
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.add(tokens, n, ++stamp_);
}

bool Drafter::has_request(int64_t rid) {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_.count(rid) != 0;
}
int64_t Drafter::num_requests() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(requests_.size());
}
int64_t Drafter::context_length(int64_t rid) {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(get(rid).context(params_.use_input).size());
}
int64_t Drafter::pool_tokens() {
  std::lock_guard<std::mutex> lock(mutex_);
  return pool_.live_tokens();
}
void Drafter::recycle(const int32_t* tokens, int64_t n, const int32_t* ids, const float* probs, int32_t width,
                      const int32_t* prev) {
  if (n < 0 || width < 1) throw std::invalid_argument("recycle: n must be >= 0 and width >= 1");
  check_tokens(tokens, n);
  for (int64_t i = 0; prev != nullptr && i < n; ++i) {
    if (prev[i] >= 0 && params_.vocab_size > 0 && static_cast<uint64_t>(prev[i]) >= params_.vocab_size) {
      throw std::invalid_argument("recycle: previous token id " + std::to_string(prev[i]) + " at index " +
                                  std::to_string(i) + " is outside the vocabulary");
    }
  }
  check_tokens(ids, n * width);
  for (int64_t i = 0; i < n * width; ++i) {
    if (!(probs[i] >= 0.0f && probs[i] <= 1.0f)) {
      throw std::invalid_argument("recycle: probabilities must lie in [0, 1], got " + std::to_string(probs[i]) +
                                  " at index " + std::to_string(i));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (params_.use_recycled) recycled_.update(tokens, n, ids, probs, width, prev, ++recycle_calls_);
}
int64_t Drafter::recycled_rows() {
  std::lock_guard<std::mutex> lock(mutex_);
  return recycled_.rows_recorded();
}
Calibration Drafter::calibration() {
  std::lock_guard<std::mutex> lock(mutex_);
  return cal_;
}
void Drafter::set_calibration(const Calibration& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  cal_ = c;
}

void Drafter::draft_one(const Request& r, int32_t cap, Work& s, Draft& d) const {
  const std::vector<int32_t>& ctx = r.context(params_.use_input);
  const auto len = static_cast<int64_t>(ctx.size());
  const CandidateTrie* tries[kNumTrieSources] = {nullptr, nullptr, nullptr};
  d.docs_used.clear();
  if (params_.use_input) {
    s.tries[0].reset(ctx.back());
    r.index.find(ctx.data(), len, len - 1, params_.input, s.occ);
    r.index.add_continuations(s.occ, params_.input, s.tries[0], nullptr);
    tries[0] = &s.tries[0];
  }
  if (params_.use_datastore && !shards_.empty()) {
    search_context(shards_, TokenSpan{ctx.data(), len}, params_.search, s.tries[1], &r.ds_cache,
                   OutOfVocab::kNoMatch);
    tries[1] = &s.tries[1];
  }
  if (params_.use_pool && pool_.live_tokens() > 0) {
    s.tries[2].reset(ctx.back());
    pool_.index().find(ctx.data(), len, pool_.index().size(), params_.pool, s.occ);
    pool_.index().add_continuations(s.occ, params_.pool, s.tries[2], &d.docs_used);
    tries[2] = &s.tries[2];
  }
  if (tries[0] == nullptr && tries[1] == nullptr && tries[2] == nullptr) {
    s.tries[0].reset(ctx.back());
    tries[0] = &s.tries[0];
  }
  const Calibration* cal = params_.calibrated ? &cal_ : nullptr;
  const bool recycle = params_.use_recycled && recycled_.rows_recorded() > 0;
  fuse_merge(tries, cal, params_.fusion, s.tree, recycle ? cap : 0);
  if (recycle) {  // normalization and selection in one pass, the candidates added as it reaches them
    const RecycleParams rp{params_.max_depth, params_.fusion.min_f, cap, params_.max_width,
                           params_.recycle_from_every_node, len >= 2 ? ctx[static_cast<size_t>(len - 2)] : -1,
                           params_.recycle_trust_match, params_.recycle_split_stale ? r.recycle_since : 0u};
    select_recycled(recycled_, cal, rp, s.tree, s.seq, s.recycle);
  } else {
    fuse_finish(s.tree);
    select_sequence(s.tree, cap, params_.max_depth, params_.max_width, s.seq, s.select);
  }
  // Keep the root and the selected nodes (parents come first in the sequence).
  const CandidateTree& t = s.tree;
  const size_t m = s.seq.size() + 1;
  s.pos.resize(static_cast<size_t>(t.size()));
  for (auto* v : {&d.tokens, &d.parent_pos, &d.depth, &d.match_len}) v->resize(m);
  d.p.resize(m);
  d.raw.resize(m);
  d.f.resize(m);
  d.source.resize(m);
  d.source_mask.resize(m);
  for (size_t k = 0; k < m; ++k) {
    const int32_t v = k == 0 ? 0 : s.seq[k - 1];
    s.pos[static_cast<size_t>(v)] = static_cast<int32_t>(k);
    d.parent_pos[k] = k == 0 ? -1 : s.pos[static_cast<size_t>(t.parents[v])];
    d.tokens[k] = t.tokens[v];
    d.depth[k] = t.depth[v];
    d.match_len[k] = t.match_len[v];
    d.p[k] = t.p[v];
    d.raw[k] = t.raw[v];
    d.f[k] = t.f[v];
    d.source[k] = t.source[v];
    d.source_mask[k] = t.source_mask[v];
  }
}

namespace {
// The ranks each tree took, as flat buckets: tree i took ranks list[start[i] .. start[i + 1]),
// increasing (a bucket sort of `order`, which holds the tree of each rank).
struct RankBuckets {
  std::vector<int32_t> start, list;
  RankBuckets(const std::vector<int32_t>& order, int64_t b)
      : start(static_cast<size_t>(b) + 1, 0), list(order.size()) {
    for (int32_t t : order) ++start[static_cast<size_t>(t) + 1];
    for (int64_t i = 0; i < b; ++i) start[static_cast<size_t>(i) + 1] += start[static_cast<size_t>(i)];
    std::vector<int32_t> fill(start.begin(), start.end() - 1);
    for (size_t r = 0; r < order.size(); ++r) {
      list[static_cast<size_t>(fill[static_cast<size_t>(order[r])]++)] = static_cast<int32_t>(r);
    }
  }
  size_t taken(int64_t i) const {
    return static_cast<size_t>(start[static_cast<size_t>(i) + 1] - start[static_cast<size_t>(i)]);
  }
};
}  // namespace

std::vector<const Drafter::Request*> Drafter::batch_requests(const int64_t* rids, int64_t b) {
  std::vector<const Request*> reqs(static_cast<size_t>(b));
  std::unordered_set<int64_t> seen;
  for (int64_t i = 0; i < b; ++i) {
    if (!seen.insert(rids[i]).second) throw std::invalid_argument("request id " + std::to_string(rids[i]) + " appears twice in the batch");
    reqs[static_cast<size_t>(i)] = &get(rids[i]);
  }
  return reqs;
}

void Drafter::draft_all(const std::vector<const Request*>& reqs, const int64_t* budgets, bool per_request) {
  const auto b = static_cast<int64_t>(reqs.size());
  const int64_t global = per_request ? 0 : budgets[0];
  if (static_cast<int64_t>(drafts_.size()) < b) drafts_.resize(static_cast<size_t>(b));
  const int team = team_size(params_.threads);
  if (work_.size() < static_cast<size_t>(team)) work_.resize(static_cast<size_t>(team));
  parallel_for(
      b,
      [&](int64_t i) {
        const int64_t want = per_request ? budgets[i] : global;
        const auto cap = static_cast<int32_t>(std::min<int64_t>(want, params_.max_tree_nodes));
        draft_one(*reqs[static_cast<size_t>(i)], cap, work_[static_cast<size_t>(thread_index())],
                  drafts_[static_cast<size_t>(i)]);
      },
      2, team);
}

void Drafter::allocate(int64_t b, int64_t global, bool per_request, const double* tpot, double step_time,
                       double slack, std::vector<int32_t>& order) const {
  std::vector<const double*> seq_f(static_cast<size_t>(b));
  std::vector<int32_t> lens(static_cast<size_t>(b));
  int64_t total = 0;
  for (int64_t i = 0; i < b; ++i) {
    seq_f[static_cast<size_t>(i)] = drafts_[static_cast<size_t>(i)].f.data() + 1;
    lens[static_cast<size_t>(i)] = drafts_[static_cast<size_t>(i)].size() - 1;
    total += lens[static_cast<size_t>(i)];
  }
  allocate_budget(seq_f, lens, per_request ? total : global, tpot, step_time, slack, order);
}

// Tree i is the root and the first `taken` nodes of its draft's sequence (connected, parents first): a
// prefix of each of the draft's arrays, copied as a block into out's arrays at offsets[i].
void Drafter::write_output(const std::vector<const Request*>& reqs, const std::vector<int32_t>& order,
                           ProposeOutput& out) const {
  const auto b = static_cast<int64_t>(reqs.size());
  const RankBuckets ranks(order, b);
  out = ProposeOutput();
  out.offsets.resize(static_cast<size_t>(b) + 1);
  out.offsets[0] = 0;
  for (int64_t i = 0; i < b; ++i) {
    out.offsets[static_cast<size_t>(i) + 1] = out.offsets[static_cast<size_t>(i)] + 1 + static_cast<int64_t>(ranks.taken(i));
  }
  const auto n_total = static_cast<size_t>(out.offsets.back());
  for (auto* v : {&out.tokens, &out.parents, &out.depth, &out.match_len, &out.rank}) v->resize(n_total);
  for (auto* v : {&out.probs, &out.raw, &out.acc}) v->resize(n_total);
  out.source.resize(n_total);
  out.source_mask.resize(n_total);
  out.context_len.resize(static_cast<size_t>(b));
  std::vector<double> f_of_rank(order.size());
  for (int64_t i = 0; i < b; ++i) {
    const Draft& d = drafts_[static_cast<size_t>(i)];
    const int32_t* rk = ranks.list.data() + ranks.start[static_cast<size_t>(i)];
    const auto at = static_cast<size_t>(out.offsets[static_cast<size_t>(i)]);
    const size_t taken = ranks.taken(i), m = taken + 1;
    std::copy_n(d.tokens.data(), m, out.tokens.data() + at);
    std::copy_n(d.parent_pos.data(), m, out.parents.data() + at);
    std::copy_n(d.depth.data(), m, out.depth.data() + at);
    std::copy_n(d.match_len.data(), m, out.match_len.data() + at);
    std::copy_n(d.p.data(), m, out.probs.data() + at);
    std::copy_n(d.raw.data(), m, out.raw.data() + at);
    std::copy_n(d.source.data(), m, out.source.data() + at);
    std::copy_n(d.source_mask.data(), m, out.source_mask.data() + at);
    out.rank[at] = -1;
    for (size_t k = 0; k < taken; ++k) {
      out.rank[at + 1 + k] = rk[k];
      f_of_rank[static_cast<size_t>(rk[k])] = d.f[k + 1];
    }
    for (size_t k = 0; k < m; ++k) out.acc[at + k] = static_cast<float>(d.f[k]);
    out.context_len[static_cast<size_t>(i)] =
        static_cast<int64_t>(reqs[static_cast<size_t>(i)]->context(params_.use_input).size());
  }
  out.gain.reserve(order.size() + 1);
  out.gain.assign(1, 0.0);
  for (double f : f_of_rank) out.gain.push_back(out.gain.back() + f);
}

void Drafter::propose(const int64_t* rids, int64_t b, const int64_t* budgets, bool per_request, const double* tpot,
                      double step_time, double slack, ProposeOutput& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<const Request*> reqs = batch_requests(rids, b);
  if (params_.use_datastore) check_shards(shards_);  // truncated files: an error here, not SIGBUS later
  draft_all(reqs, budgets, per_request);
  std::vector<int32_t> order;
  allocate(b, per_request ? 0 : budgets[0], per_request, tpot, step_time, slack, order);
  write_output(reqs, order, out);
  ++stamp_;  // the pool documents the trees used are the most recently used ones now
  for (int64_t i = 0; i < b; ++i) {
    for (int32_t d : drafts_[static_cast<size_t>(i)].docs_used) pool_.touch(d, stamp_);
  }
}

void check_observed_tree(const TreeView& t, const std::string& what) {
  if (t.size < 1 || t.parents[0] != -1) throw std::invalid_argument(what + ": node 0 must be the root (parent -1)");
  if (!t.on_path[0]) throw std::invalid_argument(what + ": on_path must mark the root (the path starts there)");
  // A node's parent comes first, so one pass sees every parent's mark and on-path child count before
  // its children: the marks form one path from the root iff each marked node's parent is marked and
  // no node has two marked children.
  std::vector<uint8_t> marked_child(static_cast<size_t>(t.size), 0);
  for (int32_t v = 1; v < t.size; ++v) {
    const int32_t p = t.parents[v];
    if (p < 0 || p >= v) throw std::invalid_argument(what + ": parents must point to earlier nodes of the same tree");
    if (!t.on_path[v]) continue;
    if (!t.on_path[p]) throw std::invalid_argument(what + ": on_path marks a node whose parent it does not mark");
    if (marked_child[static_cast<size_t>(p)]++) throw std::invalid_argument(what + ": on_path marks two children of one node");
  }
}

void Drafter::record(const TreeView& t) {
  for (int32_t v = 1; v < t.size; ++v) {
    if (t.source[v] < 0 || t.source[v] >= kNumSources || !t.on_path[t.parents[v]]) continue;
    cal_.observe(t.source[v], t.depth[v], t.match_len[v], t.raw[v], t.on_path[v] ? 1.0f : 0.0f);
  }
}

int64_t Drafter::observe(const std::vector<TreeView>& trees) {
  for (size_t i = 0; i < trees.size(); ++i) check_observed_tree(trees[i], "tree " + std::to_string(i));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!params_.online) return 0;
  for (const TreeView& t : trees) record(t);
  cal_.refit_dirty();
  return static_cast<int64_t>(trees.size());
}

}  // namespace sssd
