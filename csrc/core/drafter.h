// The drafter: per-request contexts with their input index, the datastore, the recent-outputs pool,
// fusion + calibration, and batch-wide budgeted selection. One propose() call serves the whole batch
// (requests in parallel, then a serial allocation over the batch). All methods are serialized by an
// internal mutex, so the Python side may release the GIL around every call.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/calibration.h"
#include "core/datastore.h"
#include "core/draft_tree.h"
#include "core/ngram_index.h"
#include "core/recent_pool.h"
#include "core/recycled.h"
#include "core/search.h"

namespace sssd {

// A request id the drafter does not know (UnknownRequestError in Python: a KeyError and a ValueError).
class UnknownRequest : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

struct DrafterParams {
  bool use_input = true, use_datastore = true, use_pool = true;
  // The recycled candidates (core/recycled.h): recycle_k candidates per token, from every node of the
  // fused tree (or below the root only, a subtree of their own).
  bool use_recycled = false;
  int32_t recycle_k = 8;
  bool recycle_from_every_node = true;
  // A node with a retrieval child continuing a match this long does not consult its row (0: always does).
  int32_t recycle_trust_match = kRescoreMaxMatch;
  // Rows kept per (previous token, token) pair besides the per-token rows: a direct-mapped table of this
  // many slots (a power of two; 0: none).
  int32_t recycle_pair_slots = 1 << 16;
  // Rows older than the request (recorded before it was added) calibrated in groups of their own
  // (RecycleParams::fresh_since).
  bool recycle_split_stale = true;
  int32_t index_max_n = 4;   // n-gram lengths indexed for the input source and the pool
  MatchParams input, pool;
  SearchParams search;
  FusionParams fusion;
  bool calibrated = true;    // false: p = raw estimates
  bool online = true;        // observe() updates the calibration
  int32_t max_depth = 8, max_width = 0, max_tree_nodes = 127;
  int32_t ds_max_depth = 0;  // continuation tokens read per datastore occurrence (0: max_depth)
  int64_t pool_max_tokens = 1 << 20;
  // Threads of propose's parallel region over requests (0: the OpenMP default; 1: no region at all).
  int32_t threads = 0;
  // Token ids must be < vocab_size when > 0 (the model's vocabulary). A datastore may have a smaller
  // vocabulary: tokens past it never match there (OutOfVocab::kNoMatch); the other sources draft them.
  uint64_t vocab_size = 0;
};
constexpr int32_t kMaxThreads = 1024;  // DrafterParams::threads above this is a mistake, not a machine
void validate_drafter_params(const DrafterParams& p);  // throws std::invalid_argument

// Flat output of propose(): N nodes (roots included), B trees. Shapes in comments.
struct ProposeOutput {
  std::vector<int32_t> tokens, parents, depth, match_len, rank;  // [N]
  std::vector<float> probs, raw, acc;                           // [N] p(v|parent), raw score, f(v)
  std::vector<int8_t> source;                                   // [N] winner source, -1 for roots
  std::vector<uint8_t> source_mask;                             // [N]
  std::vector<int64_t> offsets;                                 // [B + 1]
  std::vector<int64_t> context_len;                             // [B] context length at propose time
  std::vector<double> gain;                                     // [M + 1]
};

// One verified tree as observe() reads it (views into the batch arrays): the nodes the engine scored and
// which of them lie on the accepted path (on_path: 0 or not; the root is on it, and the nodes on it form
// one path from the root).
struct TreeView {
  const int32_t* parents;
  const int8_t* source;
  const int32_t* depth;
  const int32_t* match_len;
  const float* raw;
  const uint8_t* on_path;
  int32_t size;
};

// Throws std::invalid_argument unless t's parents point to earlier nodes and on_path marks one path
// from its root. `what` names the tree in the message.
void check_observed_tree(const TreeView& t, const std::string& what);

class Drafter {
 public:
  // owners: whatever keeps the shards' mappings alive (the opened Datastore objects); held until the
  // drafter is destroyed, so no view outlives its file. Shards must share the vocabulary size.
  Drafter(const DrafterParams& params, std::vector<DatastoreView> shards,
          std::vector<std::shared_ptr<const void>> owners = {});

  void add_request(int64_t rid, const int32_t* tokens, int64_t n);
  void extend(int64_t rid, const int32_t* tokens, int64_t n);
  void remove_request(int64_t rid, bool add_output_to_pool);
  void add_to_pool(const int32_t* tokens, int64_t n);
  bool has_request(int64_t rid);
  int64_t num_requests();
  int64_t context_length(int64_t rid);
  int64_t pool_tokens();
  // The model's top-k after each of n tokens (ids, probs: [n, width] row-major, best first; probs in
  // [0, 1]) become those tokens' recycled candidates. Checked; a no-op when the source is off.
  // prev (null: none): the token before each of them (< 0: unknown), for the pair rows.
  void recycle(const int32_t* tokens, int64_t n, const int32_t* ids, const float* probs, int32_t width,
               const int32_t* prev = nullptr);
  int64_t recycled_rows();  // tokens with recycled candidates

  // budgets: [b] per-request caps when per_request, else budgets[0] is the global budget. tpot: [b]
  // targets (seconds per token, <= 0 / NaN: none) or null.
  void propose(const int64_t* rids, int64_t b, const int64_t* budgets, bool per_request, const double* tpot,
               double step_time, double slack, ProposeOutput& out);

  // Calibration from verified trees: each node whose parent lies on the accepted path is a trial of
  // its (source, depth, match length, raw score) group, accepted when the node lies on the path too.
  // Every tree is checked first (nothing is recorded from a batch with a bad tree); the requests need
  // not exist any more. Returns the number of trees recorded (0 when online calibration is off).
  int64_t observe(const std::vector<TreeView>& trees);

  Calibration calibration();
  void set_calibration(const Calibration& c);

 private:
  struct Request {
    NgramIndex index;
    std::vector<int32_t> plain;  // the context when the input source is off
    int64_t prompt_len = 0;
    uint32_t recycle_since = 0;  // the first recycle call after the request was added (its rows are fresh)
    // The datastore search of the last propose (its ranges speed up the next one). Mutable: propose
    // (under the mutex) drafts each request on exactly one thread.
    mutable SearchCache ds_cache;
    explicit Request(int32_t max_n) : index(max_n) {}
    const std::vector<int32_t>& context(bool indexed) const { return indexed ? index.tokens() : plain; }
  };
  // Working buffers of one thread (tries, fused tree): reused request after request, so they stay in
  // the cache whatever the batch size.
  struct Work {
    CandidateTrie tries[kNumTrieSources];
    RecycleScratch recycle;
    std::vector<Occurrence> occ;
    CandidateTree tree;
    SelectScratch select;
    std::vector<int32_t> seq, pos;
  };
  // What propose keeps of one request's tree: the root, then the selected sequence in best-first
  // order, with each node's fields and the position of its parent in this list. [size()] each.
  struct Draft {
    std::vector<int32_t> tokens, parent_pos, depth, match_len;
    std::vector<float> p, raw;
    std::vector<double> f;
    std::vector<int8_t> source;
    std::vector<uint8_t> source_mask;
    std::vector<int32_t> docs_used;  // pool documents the request's tree used
    int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  };

  void check_tokens(const int32_t* tokens, int64_t n) const;
  void append(Request& r, const int32_t* tokens, int64_t n);
  void draft_one(const Request& r, int32_t cap, Work& w, Draft& d) const;
  // The steps of propose: the batch's requests (each once), every tree drafted (in parallel), the
  // batch-wide allocation of the budget (order[rank] = the tree of each rank), the flat output.
  std::vector<const Request*> batch_requests(const int64_t* rids, int64_t b);
  void draft_all(const std::vector<const Request*>& reqs, const int64_t* budgets, bool per_request);
  void allocate(int64_t b, int64_t global, bool per_request, const double* tpot, double step_time, double slack,
                std::vector<int32_t>& order) const;
  void write_output(const std::vector<const Request*>& reqs, const std::vector<int32_t>& order,
                    ProposeOutput& out) const;
  void record(const TreeView& t);
  Request& get(int64_t rid);

  DrafterParams params_;
  std::vector<DatastoreView> shards_;
  std::vector<std::shared_ptr<const void>> owners_;
  std::unordered_map<int64_t, Request> requests_;
  RecentPool pool_;
  RecycledTable recycled_;
  Calibration cal_;
  std::vector<Work> work_;    // [threads]
  std::vector<Draft> drafts_;  // [batch]
  int64_t stamp_ = 0;
  // Recycle calls so far: the stamp of the rows the last one wrote. Past 2^32 calls it wraps, and rows
  // count as stale or fresh wrongly until the requests then running end (a calibration group, never the
  // output).
  uint32_t recycle_calls_ = 0;
  std::mutex mutex_;
};

}  // namespace sssd
