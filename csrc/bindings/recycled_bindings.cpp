// Bindings of the recycled-candidates source: the drafter's top-k intake and, for the tests' oracle, the
// expansion of a given tree. Validation and conversion only; the algorithms are in csrc/core/recycled.
#include <algorithm>
#include <string>
#include <vector>

#include "bindings/common.h"
#include "core/drafter.h"

namespace sssd_py {

namespace {

template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v, size_t m) {
  py::array_t<T> a(static_cast<py::ssize_t>(m));
  std::copy_n(v.data(), m, a.mutable_data());
  return a;
}

// A 2-D C-contiguous array of dtype T with `rows` rows (rows < 0: any); its column count in *cols.
template <class T>
const T* typed_2d(py::handle h, const std::string& what, py::ssize_t rows, py::ssize_t* cols) {
  const py::array a = array_arg(h, what);
  check_dtype<T>(a, what);
  if (a.ndim() != 2) throw py::value_error(what + " must be 2-D [rows, k], got " + std::to_string(a.ndim()) + "-D");
  if (!(a.flags() & py::array::c_style)) throw py::value_error(what + " must be C-contiguous");
  if (rows >= 0 && a.shape(0) != rows) {
    throw py::value_error(what + " has " + std::to_string(a.shape(0)) + " rows, expected " + std::to_string(rows));
  }
  *cols = a.shape(1);
  return static_cast<const T*>(a.data());
}

struct TopK {
  const int32_t* tokens;
  const int32_t* ids;
  const float* probs;
  int64_t n;
  int32_t width;
};

// tokens [n] int32, ids [n, k] int32, probs [n, k] float32 (k >= 1; probabilities in [0, 1]).
TopK top_k_args(py::handle tokens, py::handle ids, py::handle probs) {
  TopK t{};
  t.tokens = typed<int32_t>(tokens, "tokens");
  t.n = length(tokens);
  py::ssize_t k = 0, kp = 0;
  t.ids = typed_2d<int32_t>(ids, "top_ids", t.n, &k);
  t.probs = typed_2d<float>(probs, "top_probs", t.n, &kp);
  if (k != kp) throw py::value_error("top_ids and top_probs must have the same shape");
  if (k < 1 || k > (1 << 16)) throw py::value_error("top_ids must have between 1 and 65536 columns (k)");
  t.width = static_cast<int32_t>(k);
  for (int64_t i = 0; i < t.n * k; ++i) {
    if (!(t.probs[i] >= 0.0f && t.probs[i] <= 1.0f)) {
      throw py::value_error("top_probs must lie in [0, 1] (probabilities), got " + std::to_string(t.probs[i]));
    }
  }
  return t;
}

// The oracle entry: a merged tree from flat arrays (node 0 the root, parents[i] < i), the selection in it
// with the recycled candidates; returns the tree (new nodes appended) and the selected nodes ("seq").
py::dict select_tree(py::dict tree, py::handle tokens, py::handle ids, py::handle probs, py::dict opts,
                     const sssd::Calibration* cal) {
  const int32_t* par = typed<int32_t>(tree["parents"], "parents");
  const auto n = length(tree["parents"]);
  if (n < 1 || n > (1 << 20)) throw py::value_error("the tree must have between 1 and 2^20 nodes");
  const int32_t* tok = typed<int32_t>(tree["tokens"], "tokens", n);
  const float* p = typed<float>(tree["p"], "p", n);
  const double* f = typed<double>(tree["f"], "f", n);
  const int8_t* src = typed<int8_t>(tree["source"], "source", n);
  // Optional: the retrieval match length of each node (default 0).
  const int32_t* mlen = tree.contains("match_len") ? typed<int32_t>(tree["match_len"], "match_len", n) : nullptr;
  check_finite(f, n, "f");
  if (par[0] != -1) throw py::value_error("node 0 must be the root (parent -1)");
  for (py::ssize_t i = 0; i < n; ++i) {
    if (i > 0 && (par[i] < 0 || par[i] >= i)) throw py::value_error("parents[i] must lie in [0, i)");
    if (!(p[i] >= 0.0f && p[i] <= 1.0f) || f[i] < 0) throw py::value_error("p must lie in [0, 1] and f be >= 0");
    if (src[i] < -1 || src[i] >= sssd::kNumSources) throw py::value_error("source must lie in [-1, 5)");
  }
  sssd::RecycleParams rp;
  rp.max_depth = int32_arg(opts["max_depth"], "max_depth", 1, 64);
  rp.min_f = real_arg(opts["min_f"], "min_f");
  rp.cap = int32_arg(opts["cap"], "cap", 0, 1 << 16);
  if (opts.contains("max_width")) rp.max_width = int32_arg(opts["max_width"], "max_width", 0, 1 << 16);
  rp.from_every_node = bool_arg(opts["from_every_node"], "from_every_node");
  // Optional: prev [n] int32 (the token before each row's, -1: none) for the pair rows, in a table of
  // pair_slots slots (default 2^16), and root_prev (the token before the root).
  const TopK t = top_k_args(tokens, ids, probs);
  const int32_t* prev = opts.contains("prev") ? typed<int32_t>(opts["prev"], "prev", t.n) : nullptr;
  const int32_t slots = opts.contains("pair_slots") ? int32_arg(opts["pair_slots"], "pair_slots", 0, 1 << 24)
                                                    : (prev != nullptr ? 1 << 16 : 0);
  if (opts.contains("root_prev")) rp.root_prev = int32_arg(opts["root_prev"], "root_prev", -1, 1 << 30);
  if (opts.contains("trust_match")) rp.trust_match = int32_arg(opts["trust_match"], "trust_match", 0, 1 << 30);
  // Optional: stamps [n] int32 >= 0 (each row's; rows recorded one by one) and fresh_since (rows stamped
  // before it are stale).
  const int32_t* stamps = opts.contains("stamps") ? typed<int32_t>(opts["stamps"], "stamps", t.n) : nullptr;
  if (opts.contains("fresh_since")) {
    rp.fresh_since = static_cast<uint32_t>(int32_arg(opts["fresh_since"], "fresh_since", 0, 1 << 30));
  }
  for (int64_t i = 0; stamps != nullptr && i < t.n; ++i) {
    if (stamps[i] < 0) throw py::value_error("stamps must be >= 0");
  }
  for (int64_t i = 0; i < t.n; ++i) {
    if (t.tokens[i] < 0) throw py::value_error("tokens must be >= 0");
  }
  for (int64_t i = 0; i < t.n * t.width; ++i) {
    if (t.ids[i] < 0) throw py::value_error("top_ids must be >= 0");
  }
  sssd::RecycledTable table(std::min<int32_t>(t.width, sssd::kMaxRecycledK), 0, slots);
  if (stamps == nullptr) {
    table.update(t.tokens, t.n, t.ids, t.probs, t.width, prev);
  } else {  // one row at a time, each with its stamp
    for (int64_t i = 0; i < t.n; ++i) {
      table.update(t.tokens + i, 1, t.ids + i * t.width, t.probs + i * t.width, t.width,
                   prev != nullptr ? prev + i : nullptr, static_cast<uint32_t>(stamps[i]));
    }
  }
  sssd::CandidateTree ct;
  ct.reset(tok[0], static_cast<int32_t>(n) + rp.cap);
  for (py::ssize_t i = 1; i < n; ++i) ct.new_child(par[i], tok[i]);
  for (py::ssize_t i = 0; i < n; ++i) {
    ct.p[i] = p[i];
    ct.f[i] = f[i];
    ct.source[i] = src[i];
    ct.match_len[i] = mlen != nullptr ? mlen[i] : 0;
  }
  sssd::RecycleScratch scratch;
  std::vector<int32_t> seq;
  sssd::select_recycled(table, cal, rp, ct, seq, scratch);
  const auto m = static_cast<size_t>(ct.size());
  auto out_vec = [&](const auto& v) { return to_numpy(v, m); };
  py::dict out;
  out["tokens"] = out_vec(ct.tokens);
  out["parents"] = out_vec(ct.parents);
  out["depth"] = out_vec(ct.depth);
  out["p"] = out_vec(ct.p);
  out["f"] = out_vec(ct.f);
  out["source"] = out_vec(ct.source);
  out["raw"] = out_vec(ct.raw);
  out["match_len"] = out_vec(ct.match_len);
  out["source_mask"] = out_vec(ct.source_mask);
  out["seq"] = to_numpy(seq, seq.size());
  return out;
}

}  // namespace

void drafter_recycle(sssd::Drafter& d, py::handle tokens, py::handle ids, py::handle probs, py::handle prev) {
  const TopK t = top_k_args(tokens, ids, probs);
  const int32_t* before = prev.is_none() ? nullptr : typed<int32_t>(prev, "prev", t.n);
  py::gil_scoped_release release;
  d.recycle(t.tokens, t.n, t.ids, t.probs, t.width, before);
}

void bind_recycled(py::module_& m) {
  m.def("select_recycled",
        [](py::dict tree, py::handle tokens, py::handle ids, py::handle probs, py::dict opts, py::handle cal) {
          if (cal.is_none()) return select_tree(tree, tokens, ids, probs, opts, nullptr);
          const auto& c = cal.cast<const sssd::Calibration&>();
          return select_tree(tree, tokens, ids, probs, opts, &c);
        });
}

}  // namespace sssd_py
