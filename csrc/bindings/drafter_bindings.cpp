// Bindings of the drafter, calibration tables, selection/allocation functions and tree buffers.
// Validation and conversion only; the algorithms are in csrc/core.
#include <cmath>
#include <cstring>

#include <set>
#include <string>

#include "bindings/common.h"
#include "core/drafter.h"

namespace sssd_py {

// recycled_bindings.cpp: Drafter.recycle(tokens [n] int32, top_ids [n, k] int32, top_probs [n, k] float32).
void drafter_recycle(sssd::Drafter& d, py::handle tokens, py::handle ids, py::handle probs, py::handle prev);

namespace {

template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

// Strict reads of the params dict (DrafterConfig.native()): every key must be known, ints are ints
// (not bools or floats), flags are bools, reals are finite. A missing key keeps the default.
class ParamReader {
 public:
  explicit ParamReader(const py::dict& d) : d_(d) {}
  int32_t i32(const char* key, int32_t fallback) { return has(key) ? int32_arg(d_[key], key) : fallback; }
  int64_t i64(const char* key, int64_t fallback) { return has(key) ? int_arg(d_[key], key) : fallback; }
  bool flag(const char* key, bool fallback) { return has(key) ? bool_arg(d_[key], key) : fallback; }
  double real(const char* key, double fallback) { return has(key) ? real_arg(d_[key], key) : fallback; }
  // Raises for keys no read asked for (a typo would otherwise be ignored).
  void check_all_used() const {
    for (const auto& item : d_) {
      if (!py::isinstance<py::str>(item.first)) throw py::type_error("drafter params keys must be str");
      const std::string k = py::str(item.first);
      if (!used_.count(k)) throw py::value_error("unknown drafter parameter " + k);
    }
  }

 private:
  bool has(const char* key) {
    used_.insert(key);
    return d_.contains(key);
  }
  const py::dict& d_;
  std::set<std::string> used_;
};

sssd::MatchParams match_params(ParamReader& r, const std::string& prefix) {
  sssd::MatchParams m;
  m.max_match = r.i32((prefix + "max_match").c_str(), m.max_match);
  m.min_n = r.i32((prefix + "min_n").c_str(), m.min_n);
  m.min_occurrences = r.i32((prefix + "min_occurrences").c_str(), m.min_occurrences);
  m.max_samples = r.i32((prefix + "max_samples").c_str(), m.max_samples);
  m.max_chain = r.i32((prefix + "max_chain").c_str(), m.max_chain);
  return m;
}

sssd::DrafterParams drafter_params(const py::dict& d) {
  ParamReader r(d);
  sssd::DrafterParams p;
  p.use_input = r.flag("use_input", p.use_input);
  p.use_datastore = r.flag("use_datastore", p.use_datastore);
  p.use_pool = r.flag("use_pool", p.use_pool);
  p.use_recycled = r.flag("use_recycled", p.use_recycled);
  p.recycle_k = r.i32("recycle_k", p.recycle_k);
  p.recycle_from_every_node = r.flag("recycle_from_every_node", p.recycle_from_every_node);
  p.recycle_pair_slots = r.i32("recycle_pair_slots", p.recycle_pair_slots);
  p.recycle_trust_match = r.i32("recycle_trust_match", p.recycle_trust_match);
  p.recycle_split_stale = r.flag("recycle_split_stale", p.recycle_split_stale);
  p.index_max_n = r.i32("index_max_n", p.index_max_n);
  p.input = match_params(r, "input_");
  p.pool = match_params(r, "pool_");
  p.search.max_query_len = r.i32("ds_max_query_len", p.search.max_query_len);
  p.search.min_query_len = r.i32("ds_min_query_len", p.search.min_query_len);
  p.search.min_occurrences = r.i64("ds_min_occurrences", p.search.min_occurrences);
  p.search.max_samples = r.i32("ds_max_samples", p.search.max_samples);
  p.fusion.alpha = static_cast<float>(r.real("alpha", p.fusion.alpha));
  p.fusion.noisy_or = r.flag("noisy_or", p.fusion.noisy_or);
  p.calibrated = r.flag("calibrated", p.calibrated);
  p.online = r.flag("online", p.online);
  p.max_depth = r.i32("max_depth", p.max_depth);
  p.max_width = r.i32("max_width", p.max_width);
  p.max_tree_nodes = r.i32("max_tree_nodes", p.max_tree_nodes);
  p.ds_max_depth = r.i32("ds_max_depth", p.ds_max_depth);
  p.fusion.min_f = r.real("min_f", p.fusion.min_f);
  p.pool_max_tokens = r.i64("pool_max_tokens", p.pool_max_tokens);
  p.threads = r.i32("threads", p.threads);
  const int64_t vocab = r.i64("vocab_size", static_cast<int64_t>(p.vocab_size));
  if (vocab < 0 || static_cast<uint64_t>(vocab) > sssd::kMaxVocab) {
    throw py::value_error("vocab_size must be in [0, 2^31], got " + std::to_string(vocab));
  }
  p.vocab_size = static_cast<uint64_t>(vocab);
  r.check_all_used();
  return p;
}

py::dict propose(sssd::Drafter& dr, py::handle rids, py::handle budgets, py::handle per_request_h, py::handle tpot,
                 py::handle step_time_h, py::handle slack_h) {
  const int64_t* r = typed<int64_t>(rids, "rids");
  const auto b = length(rids);
  const bool per_request = bool_arg(per_request_h, "per_request");
  const int64_t* bud = typed<int64_t>(budgets, "budgets", per_request ? b : 1);
  const double step_time = real_arg(step_time_h, "step_time"), slack = real_arg(slack_h, "slack");
  const double* t = tpot.is_none() ? nullptr : typed<double>(tpot, "slo", b);  // NaN / <= 0: no target
  sssd::ProposeOutput o;
  {
    py::gil_scoped_release release;
    dr.propose(r, b, bud, per_request, t, step_time, slack, o);
  }
  py::dict out;
  out["tokens"] = to_numpy(o.tokens);
  out["parents"] = to_numpy(o.parents);
  out["probs"] = to_numpy(o.probs);
  out["depth"] = to_numpy(o.depth);
  out["offsets"] = to_numpy(o.offsets);
  out["rank"] = to_numpy(o.rank);
  out["gain"] = to_numpy(o.gain);
  out["acc_prob"] = to_numpy(o.acc);
  out["source"] = to_numpy(o.source);
  out["source_mask"] = to_numpy(o.source_mask);
  out["match_len"] = to_numpy(o.match_len);
  out["raw_score"] = to_numpy(o.raw);
  out["context_len"] = to_numpy(o.context_len);
  return out;
}

// observe(batch, on_path): the batch's arrays (a dict of DraftBatch fields) and on_path, bool [N]: the
// nodes of each tree's accepted path. Shapes and dtypes here; the trees and paths in core.
int64_t observe(sssd::Drafter& dr, const py::dict& a, py::handle on_path) {
  auto field = [&](const char* key) {
    if (!a.contains(key)) throw py::value_error(std::string("the batch has no '") + key + "' array");
    return py::handle(a[key]);
  };
  const int64_t* off = typed<int64_t>(field("offsets"), "offsets");
  const auto b = length(field("offsets")) - 1;
  if (b < 0) throw py::value_error("offsets must hold B + 1 entries (0 first), got none");
  const int64_t n = off[b];
  if (n < 0) throw py::value_error("offsets must end at the number of nodes, got " + std::to_string(n));
  const int32_t* par = typed<int32_t>(field("parents"), "parents", n);
  const int8_t* src = typed<int8_t>(field("source"), "source", n);
  const int32_t* dep = typed<int32_t>(field("depth"), "depth", n);
  const int32_t* ml = typed<int32_t>(field("match_len"), "match_len", n);
  const float* raw = typed<float>(field("raw_score"), "raw_score", n);
  // numpy bools are bytes; read as bytes, so no value of one is an invalid C++ bool
  const auto* path = reinterpret_cast<const uint8_t*>(typed<bool>(on_path, "on_path", n));
  check_finite(raw, n, "raw_score");
  std::vector<sssd::TreeView> trees;
  trees.reserve(static_cast<size_t>(b));
  for (py::ssize_t i = 0; i < b; ++i) {
    const int64_t s = off[i], e = off[i + 1];
    if (s < 0 || e <= s || e > n || e - s > INT32_MAX) {
      throw py::value_error("offsets must be increasing, each tree holding its root");
    }
    trees.push_back({par + s, src + s, dep + s, ml + s, raw + s, path + s, static_cast<int32_t>(e - s)});
  }
  py::gil_scoped_release release;
  return dr.observe(trees);
}

sssd::Calibration make_calibration(const std::vector<int32_t>& de, const std::vector<int32_t>& me, py::handle k,
                                   py::handle values, py::handle weights) {
  sssd::Calibration c(de, me, int32_arg(k, "num_knots"));
  if (values.is_none() != weights.is_none()) throw py::type_error("give both values and weights, or neither");
  if (!values.is_none()) {
    const float* vp = typed<float>(values, "values", c.table_size());
    const double* wp = typed<double>(weights, "weights", c.table_size());
    c.set(std::vector<float>(vp, vp + c.table_size()), std::vector<double>(wp, wp + c.table_size()));
  }
  return c;
}

// Tree i is parents[offsets[i] .. offsets[i+1]) etc.; shared checks of the flat-tree entries.
void check_tree(const int32_t* par, py::ssize_t n, const std::string& what) {
  if (n < 1 || par[0] != -1) throw py::value_error(what + ": node 0 must be the root (parent -1)");
  for (py::ssize_t i = 1; i < n; ++i) {
    if (par[i] < 0 || par[i] >= i) throw py::value_error(what + ": parents[i] must lie in [0, i)");
  }
}

void bind_unknown_request(py::module_& m) {
  static py::exception<sssd::UnknownRequest> unknown(
      m, "UnknownRequestError", py::make_tuple(py::handle(PyExc_KeyError), py::handle(PyExc_ValueError)));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sssd::UnknownRequest& e) {
      py::set_error(unknown, e.what());
    }
  });
}

py::array_t<float> calibration_apply(const sssd::Calibration& c, py::handle s, py::handle d, py::handle ml,
                                     py::handle raw) {
  const float* rp = typed<float>(raw, "raw");
  const auto n = length(raw);
  const int8_t* sp = typed<int8_t>(s, "source", n);
  const int32_t* dp = typed<int32_t>(d, "depth", n);
  const int32_t* mp = typed<int32_t>(ml, "match_len", n);
  check_finite(rp, n, "raw");
  py::array_t<float> out(n);
  for (py::ssize_t i = 0; i < n; ++i) {
    if (sp[i] < 0 || sp[i] >= sssd::kNumSources) throw py::value_error("source must be in [0, 5)");
    out.mutable_data()[i] = c.apply(sp[i], dp[i], mp[i], rp[i]);
  }
  return out;
}

void bind_calibration(py::module_& m) {
  py::class_<sssd::Calibration>(m, "Calibration")
      .def(py::init(&make_calibration), py::arg("depth_edges"), py::arg("match_edges"), py::arg("num_knots"),
           py::arg("values") = py::none(), py::arg("weights") = py::none())
      .def_property_readonly("depth_edges", &sssd::Calibration::depth_edges)
      .def_property_readonly("match_edges", &sssd::Calibration::match_edges)
      .def_property_readonly("num_knots", &sssd::Calibration::num_knots)
      .def_property_readonly("values", [](const sssd::Calibration& c) { return to_numpy(c.values()); })
      .def_property_readonly("weights", [](const sssd::Calibration& c) { return to_numpy(c.weights()); })
      .def("apply", &calibration_apply);
}

sssd::Drafter* make_drafter(const std::vector<std::shared_ptr<sssd::Datastore>>& shards, const py::dict& params) {
  std::vector<sssd::DatastoreView> views;
  std::vector<std::shared_ptr<const void>> owners;
  for (const auto& s : shards) {
    if (s == nullptr) throw py::type_error("shards must be Datastore objects, not None");
    views.push_back(s->view());
    owners.push_back(s);  // the drafter keeps the files mapped, whatever Python drops
  }
  return new sssd::Drafter(drafter_params(params), std::move(views), std::move(owners));
}

// The request methods: arguments checked with the GIL held, the work done without it.
void add_request(sssd::Drafter& d, py::handle rid, py::handle t) {
  const int64_t id = int_arg(rid, "rid");
  const auto s = int32_span(t, "prompt_ids");
  py::gil_scoped_release release;
  d.add_request(id, s.data, s.size);
}
void extend(sssd::Drafter& d, py::handle rid, py::handle t) {
  const int64_t id = int_arg(rid, "rid");
  const auto s = int32_span(t, "new_ids");
  py::gil_scoped_release release;
  d.extend(id, s.data, s.size);
}
void remove_request(sssd::Drafter& d, py::handle rid, py::handle add_output_to_pool) {
  const int64_t id = int_arg(rid, "rid");
  const bool pool = bool_arg(add_output_to_pool, "add_output_to_pool");
  py::gil_scoped_release release;
  d.remove_request(id, pool);
}
void add_to_pool(sssd::Drafter& d, py::handle t) {
  const auto s = int32_span(t, "tokens");
  py::gil_scoped_release release;
  d.add_to_pool(s.data, s.size);
}
bool has_request(sssd::Drafter& d, py::handle rid) {
  const int64_t id = int_arg(rid, "rid");
  py::gil_scoped_release release;
  return d.has_request(id);
}
int64_t context_length(sssd::Drafter& d, py::handle rid) {
  const int64_t id = int_arg(rid, "rid");
  py::gil_scoped_release release;
  return d.context_length(id);
}

void bind_drafter_class(py::module_& m) {
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<sssd::Drafter>(m, "Drafter")
      .def(py::init(&make_drafter), py::arg("shards"), py::arg("params"))
      .def("add_request", &add_request)
      .def("extend", &extend)
      .def("remove_request", &remove_request, py::arg("rid"), py::arg("add_output_to_pool"))
      .def("add_to_pool", &add_to_pool)
      .def("has_request", &has_request)
      .def("num_requests", &sssd::Drafter::num_requests, release())
      .def("context_length", &context_length)
      .def("pool_tokens", &sssd::Drafter::pool_tokens, release())
      .def("recycle", &drafter_recycle, py::arg("tokens"), py::arg("top_ids"), py::arg("top_probs"),
           py::arg("prev") = py::none())
      .def("recycled_rows", &sssd::Drafter::recycled_rows, release())
      .def("propose", &propose)
      .def("observe", &observe, py::arg("batch"), py::arg("on_path"))
      .def("calibration", &sssd::Drafter::calibration, release())
      .def("set_calibration", &sssd::Drafter::set_calibration, release());
}

py::array_t<int32_t> select_sequence_py(py::handle parents, py::handle f, py::handle depth, py::handle cap,
                                        py::handle max_depth, py::handle max_width) {
  const int32_t* par = typed<int32_t>(parents, "parents");
  const auto n = length(parents);
  if (n > INT32_MAX) throw py::value_error("select_sequence: at most 2^31 - 1 nodes");
  const double* fp = typed<double>(f, "f", n);  // NaN is allowed: it orders after every number
  const int32_t* dep = typed<int32_t>(depth, "depth", n);
  check_tree(par, n, "select_sequence");
  for (py::ssize_t i = 0; i < n; ++i) {
    if (dep[i] < 0) throw py::value_error("select_sequence: depth[" + std::to_string(i) + "] is negative");
  }
  const int32_t c = int32_arg(cap, "cap"), md = int32_arg(max_depth, "max_depth"), mw = int32_arg(max_width, "max_width");
  std::vector<int32_t> seq;
  sssd::select_sequence(par, fp, dep, static_cast<int32_t>(n), c, md, mw, seq);
  return to_numpy(seq);
}

py::array_t<int32_t> allocate_budget_py(py::handle seq_f_h, py::handle budget_h, py::handle tpot,
                                        py::handle step_time_h, py::handle slack_h) {
  if (!PyList_Check(seq_f_h.ptr()) && !PyTuple_Check(seq_f_h.ptr())) {
    throw py::type_error("seq_f must be a list of float64 arrays, got " + type_name(seq_f_h));
  }
  const py::list seq_f(py::reinterpret_borrow<py::object>(seq_f_h));  // holds the arrays for the call
  const int64_t budget = int_arg(budget_h, "budget", 0);
  const double step_time = real_arg(step_time_h, "step_time"), slack = real_arg(slack_h, "slack");
  std::vector<const double*> fs;
  std::vector<int32_t> lens;
  for (size_t i = 0; i < seq_f.size(); ++i) {
    const std::string what = "seq_f[" + std::to_string(i) + "]";
    fs.push_back(typed<double>(seq_f[i], what));
    if (length(seq_f[i]) > INT32_MAX) throw py::value_error(what + " is too long");
    lens.push_back(static_cast<int32_t>(length(seq_f[i])));
  }
  // NaN or <= 0: no target for that tree.
  const double* t = tpot.is_none() ? nullptr : typed<double>(tpot, "tpot", static_cast<py::ssize_t>(seq_f.size()));
  std::vector<int32_t> order;
  sssd::allocate_budget(fs, lens, budget, t, step_time, slack, order);
  return to_numpy(order);
}

py::array_t<double> isotonic_fit_py(py::handle y, py::handle w) {
  const double* yp = typed<double>(y, "y");
  const auto n = length(y);
  const double* wp = typed<double>(w, "w", n);
  if (n > INT32_MAX) throw py::value_error("isotonic_fit: at most 2^31 - 1 values");
  check_finite(yp, n, "y");
  check_finite(wp, n, "w");
  for (py::ssize_t i = 0; i < n; ++i) {
    if (wp[i] < 0) throw py::value_error("isotonic_fit: weights must be >= 0");
  }
  py::array_t<double> out(n);
  sssd::isotonic_fit(yp, wp, static_cast<int32_t>(n), out.mutable_data());
  return out;
}

}  // namespace

void bind_drafter(py::module_& m) {
  bind_unknown_request(m);
  bind_calibration(m);
  bind_drafter_class(m);
  m.def("select_sequence", &select_sequence_py);
  m.def("allocate_budget", &allocate_budget_py);
  m.def("isotonic_fit", &isotonic_fit_py);
}

}  // namespace sssd_py
