// Bindings of the drafter, calibration tables, selection/allocation functions and tree buffers.
// Validation and conversion only; the algorithms are in csrc/core.
#include <cmath>
#include <cstring>

#include "bindings/common.h"
#include "core/drafter.h"

namespace sssd_py {

namespace {

template <class T>
const T* typed(const py::array& a, const std::string& what, py::ssize_t n = -1) {
  if (!a.dtype().is(py::dtype::of<T>())) {
    throw py::type_error(what + " must have dtype " + std::string(py::str(py::dtype::of<T>())) + ", got " +
                         std::string(py::str(a.dtype())));
  }
  if (a.ndim() != 1 || !(a.flags() & py::array::c_style)) throw py::value_error(what + " must be a 1-D C-contiguous array");
  if (n >= 0 && a.shape(0) != n) {
    throw py::value_error(what + " has " + std::to_string(a.shape(0)) + " entries, expected " + std::to_string(n));
  }
  return static_cast<const T*>(a.data());
}

template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

template <class T>
T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

sssd::MatchParams match_params(const py::dict& d, const std::string& prefix) {
  sssd::MatchParams m;
  m.max_match = get<int32_t>(d, (prefix + "max_match").c_str(), m.max_match);
  m.min_n = get<int32_t>(d, (prefix + "min_n").c_str(), m.min_n);
  m.min_occurrences = get<int32_t>(d, (prefix + "min_occurrences").c_str(), m.min_occurrences);
  m.max_samples = get<int32_t>(d, (prefix + "max_samples").c_str(), m.max_samples);
  m.max_chain = get<int32_t>(d, (prefix + "max_chain").c_str(), m.max_chain);
  return m;
}

sssd::DrafterParams drafter_params(const py::dict& d) {
  sssd::DrafterParams p;
  p.use_input = get<bool>(d, "use_input", p.use_input);
  p.use_datastore = get<bool>(d, "use_datastore", p.use_datastore);
  p.use_pool = get<bool>(d, "use_pool", p.use_pool);
  p.index_max_n = get<int32_t>(d, "index_max_n", p.index_max_n);
  p.input = match_params(d, "input_");
  p.pool = match_params(d, "pool_");
  p.search.max_query_len = get<int32_t>(d, "ds_max_query_len", p.search.max_query_len);
  p.search.min_query_len = get<int32_t>(d, "ds_min_query_len", p.search.min_query_len);
  p.search.min_occurrences = get<int64_t>(d, "ds_min_occurrences", p.search.min_occurrences);
  p.search.max_samples = get<int32_t>(d, "ds_max_samples", p.search.max_samples);
  p.fusion.alpha = get<float>(d, "alpha", p.fusion.alpha);
  p.fusion.noisy_or = get<bool>(d, "noisy_or", p.fusion.noisy_or);
  p.calibrated = get<bool>(d, "calibrated", p.calibrated);
  p.online = get<bool>(d, "online", p.online);
  p.max_depth = get<int32_t>(d, "max_depth", p.max_depth);
  p.max_width = get<int32_t>(d, "max_width", p.max_width);
  p.max_tree_nodes = get<int32_t>(d, "max_tree_nodes", p.max_tree_nodes);
  p.ds_max_depth = get<int32_t>(d, "ds_max_depth", p.ds_max_depth);
  p.fusion.min_f = get<double>(d, "min_f", p.fusion.min_f);
  p.pool_max_tokens = get<int64_t>(d, "pool_max_tokens", p.pool_max_tokens);
  p.vocab_size = get<uint64_t>(d, "vocab_size", p.vocab_size);
  return p;
}

py::dict propose(sssd::Drafter& dr, const py::array& rids, const py::array& budgets, bool per_request,
                 const py::object& tpot, double step_time, double slack) {
  const auto b = rids.shape(0);
  const int64_t* r = typed<int64_t>(rids, "rids");
  const int64_t* bud = typed<int64_t>(budgets, "budgets", per_request ? b : 1);
  const double* t = nullptr;
  py::array tp;
  if (!tpot.is_none()) {
    tp = tpot.cast<py::array>();
    t = typed<double>(tp, "slo", b);
  }
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

int64_t observe(sssd::Drafter& dr, const py::array& rids, const py::dict& a, const py::array& accepted) {
  const auto b = rids.shape(0);
  const int64_t* r = typed<int64_t>(rids, "rids");
  const int64_t* off = typed<int64_t>(a["offsets"].cast<py::array>(), "offsets", b + 1);
  const auto n = off[b];
  const int32_t* tok = typed<int32_t>(a["tokens"].cast<py::array>(), "tokens", n);
  const int32_t* par = typed<int32_t>(a["parents"].cast<py::array>(), "parents", n);
  const int8_t* src = typed<int8_t>(a["source"].cast<py::array>(), "source", n);
  const int32_t* dep = typed<int32_t>(a["depth"].cast<py::array>(), "depth", n);
  const int32_t* ml = typed<int32_t>(a["match_len"].cast<py::array>(), "match_len", n);
  const float* raw = typed<float>(a["raw_score"].cast<py::array>(), "raw_score", n);
  const int64_t* ctx = typed<int64_t>(a["context_len"].cast<py::array>(), "context_len", b);
  const int64_t* acc = typed<int64_t>(accepted, "accepted_counts", b);
  std::vector<sssd::TreeView> trees;
  for (py::ssize_t i = 0; i < b; ++i) {
    const int64_t s = off[i], e = off[i + 1];
    if (s < 0 || e <= s || e > n) throw py::value_error("offsets must be increasing, each tree holding its root");
    for (int64_t v = s + 1; v < e; ++v) {
      if (par[v] < 0 || par[v] >= v - s) throw py::value_error("parents must point to earlier nodes of the same tree");
    }
    trees.push_back({tok + s, par + s, src + s, dep + s, ml + s, raw + s, static_cast<int32_t>(e - s)});
  }
  py::gil_scoped_release release;
  return dr.observe(r, b, trees, ctx, acc);
}

sssd::Calibration make_calibration(const std::vector<int32_t>& de, const std::vector<int32_t>& me, int32_t k,
                                   const py::object& values, const py::object& weights) {
  sssd::Calibration c(de, me, k);
  if (!values.is_none()) {
    const auto v = values.cast<py::array>(), w = weights.cast<py::array>();
    const float* vp = typed<float>(v, "values", c.table_size());
    const double* wp = typed<double>(w, "weights", c.table_size());
    c.set(std::vector<float>(vp, vp + c.table_size()), std::vector<double>(wp, wp + c.table_size()));
  }
  return c;
}

}  // namespace

void bind_drafter(py::module_& m) {
  static py::exception<std::out_of_range> unknown(m, "UnknownRequestError",
                                                  py::make_tuple(py::handle(PyExc_KeyError), py::handle(PyExc_ValueError)));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::out_of_range& e) {
      py::set_error(unknown, e.what());
    }
  });

  py::class_<sssd::Calibration>(m, "Calibration")
      .def(py::init(&make_calibration), py::arg("depth_edges"), py::arg("match_edges"), py::arg("num_knots"),
           py::arg("values") = py::none(), py::arg("weights") = py::none())
      .def_property_readonly("depth_edges", &sssd::Calibration::depth_edges)
      .def_property_readonly("match_edges", &sssd::Calibration::match_edges)
      .def_property_readonly("num_knots", &sssd::Calibration::num_knots)
      .def_property_readonly("values", [](const sssd::Calibration& c) { return to_numpy(c.values()); })
      .def_property_readonly("weights", [](const sssd::Calibration& c) { return to_numpy(c.weights()); })
      .def("apply", [](const sssd::Calibration& c, const py::array& s, const py::array& d, const py::array& ml,
                       const py::array& raw) {
        const auto n = raw.shape(0);
        const int8_t* sp = typed<int8_t>(s, "source", n);
        const int32_t* dp = typed<int32_t>(d, "depth", n);
        const int32_t* mp = typed<int32_t>(ml, "match_len", n);
        const float* rp = typed<float>(raw, "raw", n);
        py::array_t<float> out(n);
        for (py::ssize_t i = 0; i < n; ++i) {
          if (sp[i] < 0 || sp[i] >= sssd::kNumSources) throw py::value_error("source must be 0, 1 or 2");
          out.mutable_data()[i] = c.apply(sp[i], dp[i], mp[i], rp[i]);
        }
        return out;
      });

  py::class_<sssd::Drafter>(m, "Drafter")
      .def(py::init([](const std::vector<const sssd::Datastore*>& shards, const py::dict& params) {
             std::vector<sssd::DatastoreView> views;
             for (const auto* s : shards) views.push_back(s->view());
             return new sssd::Drafter(drafter_params(params), std::move(views));
           }),
           py::arg("shards"), py::arg("params"))
      .def("add_request", [](sssd::Drafter& d, int64_t rid, const py::array& t) {
        const auto s = int32_span(t, "prompt_ids");
        py::gil_scoped_release release;
        d.add_request(rid, s.data, s.size);
      })
      .def("extend", [](sssd::Drafter& d, int64_t rid, const py::array& t) {
        const auto s = int32_span(t, "new_ids");
        py::gil_scoped_release release;
        d.extend(rid, s.data, s.size);
      })
      .def("remove_request", &sssd::Drafter::remove_request, py::arg("rid"), py::arg("add_output_to_pool"),
           py::call_guard<py::gil_scoped_release>())
      .def("add_to_pool", [](sssd::Drafter& d, const py::array& t) {
        const auto s = int32_span(t, "tokens");
        py::gil_scoped_release release;
        d.add_to_pool(s.data, s.size);
      })
      .def("has_request", &sssd::Drafter::has_request, py::call_guard<py::gil_scoped_release>())
      .def("num_requests", &sssd::Drafter::num_requests, py::call_guard<py::gil_scoped_release>())
      .def("context_length", &sssd::Drafter::context_length, py::call_guard<py::gil_scoped_release>())
      .def("pool_tokens", &sssd::Drafter::pool_tokens, py::call_guard<py::gil_scoped_release>())
      .def("propose", &propose)
      .def("observe", &observe)
      .def("calibration", &sssd::Drafter::calibration, py::call_guard<py::gil_scoped_release>())
      .def("set_calibration", &sssd::Drafter::set_calibration, py::call_guard<py::gil_scoped_release>());

  m.def("tree_buffers", [](const py::array& parents, const py::array& depth, const py::array& offsets) {
    const auto n = parents.shape(0);
    const int32_t* par = typed<int32_t>(parents, "parents");
    const int32_t* dep = typed<int32_t>(depth, "depth", n);
    if (offsets.ndim() != 1 || offsets.shape(0) < 1) throw py::value_error("offsets must have B + 1 >= 1 entries");
    const int64_t* off = typed<int64_t>(offsets, "offsets");
    const auto b = offsets.shape(0) - 1;
    int32_t width = 1;
    for (py::ssize_t i = 0; i < n; ++i) width = std::max(width, std::min(dep[i], 127) + 1);
    py::array_t<int32_t> pos(n), paths({n, static_cast<py::ssize_t>(width)}), tree(n);
    py::array_t<uint64_t> masks({n, static_cast<py::ssize_t>(2)});
    {
      py::gil_scoped_release release;
      sssd::build_tree_buffers(par, dep, n, off, b, pos.mutable_data(), masks.mutable_data(), width,
                               paths.mutable_data(), tree.mutable_data());
    }
    return py::make_tuple(pos, masks, paths, tree);
  });
  m.def("select_sequence", [](const py::array& parents, const py::array& f, const py::array& depth, int32_t cap,
                              int32_t max_depth, int32_t max_width) {
    const auto n = parents.shape(0);
    const int32_t* par = typed<int32_t>(parents, "parents");
    const double* fp = typed<double>(f, "f", n);
    const int32_t* dep = typed<int32_t>(depth, "depth", n);
    if (n < 1 || par[0] != -1) throw py::value_error("node 0 must be the root (parent -1)");
    for (py::ssize_t i = 1; i < n; ++i) {
      if (par[i] < 0 || par[i] >= i) throw py::value_error("parents[i] must lie in [0, i)");
    }
    std::vector<int32_t> seq;
    sssd::select_sequence(par, fp, dep, static_cast<int32_t>(n), cap, max_depth, max_width, seq);
    return to_numpy(seq);
  });
  m.def("allocate_budget", [](const std::vector<py::array>& seq_f, int64_t budget, const py::object& tpot,
                              double step_time, double slack) {
    std::vector<const double*> fs;
    std::vector<int32_t> lens;
    for (size_t i = 0; i < seq_f.size(); ++i) {
      fs.push_back(typed<double>(seq_f[i], "seq_f[" + std::to_string(i) + "]"));
      lens.push_back(static_cast<int32_t>(seq_f[i].shape(0)));
    }
    const double* t = nullptr;
    py::array tp;
    if (!tpot.is_none()) {
      tp = tpot.cast<py::array>();
      t = typed<double>(tp, "tpot", static_cast<py::ssize_t>(seq_f.size()));
    }
    std::vector<int32_t> order;
    sssd::allocate_budget(fs, lens, budget, t, step_time, slack, order);
    return to_numpy(order);
  });
  m.def("isotonic_fit", [](const py::array& y, const py::array& w) {
    const auto n = y.shape(0);
    py::array_t<double> out(n);
    sssd::isotonic_fit(typed<double>(y, "y"), typed<double>(w, "w", n), static_cast<int32_t>(n), out.mutable_data());
    return out;
  });
}

}  // namespace sssd_py
