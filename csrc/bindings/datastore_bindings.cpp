// Bindings of the datastore builder, the mapped datastore and batched search. Validation and conversion
// only; the algorithms are in csrc/core.
#include <cstring>

#include "bindings/common.h"
#include "core/search_index.h"

namespace sssd_py {

namespace {

// A path for the C library: an embedded NUL would silently name another file.
void check_path(const std::string& path) {
  if (path.find('\0') != std::string::npos) throw py::value_error("path contains a NUL character");
  if (path.empty()) throw py::value_error("path is empty");
}

template <class T>
void add_typed(sssd::DatastoreBuilder& b, const py::array& tokens, const int64_t* offsets, int64_t docs) {
  const T* data = static_cast<const T*>(tokens.data());
  const auto n = static_cast<int64_t>(tokens.shape(0));
  py::gil_scoped_release release;
  b.add_documents(data, n, offsets, docs);
}

void builder_add(sssd::DatastoreBuilder& b, py::handle tokens_h, py::handle offsets_h) {
  const py::array tokens = array_arg(tokens_h, "tokens");
  if (tokens.ndim() != 1 || !(tokens.flags() & py::array::c_style)) {
    throw py::value_error("tokens must be a 1-D C-contiguous array");
  }
  const int64_t* off = typed<int64_t>(offsets_h, "offsets");
  if (length(offsets_h) < 1) throw py::value_error("offsets must have num_documents + 1 >= 1 entries");
  const auto docs = static_cast<int64_t>(length(offsets_h)) - 1;
  const py::dtype dt = tokens.dtype();
  if (dt.is(py::dtype::of<int32_t>())) return add_typed<int32_t>(b, tokens, off, docs);
  if (dt.is(py::dtype::of<int64_t>())) return add_typed<int64_t>(b, tokens, off, docs);
  if (dt.is(py::dtype::of<uint16_t>())) return add_typed<uint16_t>(b, tokens, off, docs);
  if (dt.is(py::dtype::of<uint32_t>())) return add_typed<uint32_t>(b, tokens, off, docs);
  throw py::type_error("tokens must have an integer dtype (int32, int64, uint16 or uint32), got " +
                       std::string(py::str(dt)));
}

template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

// Flattens per-context tries into (tokens, parents, counts, depth, match_len, offsets).
py::tuple flatten(const std::vector<sssd::CandidateTrie>& tries) {
  py::array_t<int64_t> offsets(static_cast<py::ssize_t>(tries.size() + 1));
  auto* off = offsets.mutable_data();
  off[0] = 0;
  for (size_t i = 0; i < tries.size(); ++i) off[i + 1] = off[i] + tries[i].size();
  const auto total = static_cast<py::ssize_t>(off[tries.size()]);
  py::array_t<int32_t> tokens(total), parents(total), counts(total), depth(total), match_len(total);
  auto copy = [&](py::array_t<int32_t>& dst, auto field) {
    int32_t* d = dst.mutable_data();
    for (size_t i = 0; i < tries.size(); ++i) {
      const std::vector<int32_t>& src = tries[i].*field;
      std::memcpy(d + off[i], src.data(), src.size() * sizeof(int32_t));
    }
  };
  copy(tokens, &sssd::CandidateTrie::tokens);
  copy(parents, &sssd::CandidateTrie::parents);
  copy(counts, &sssd::CandidateTrie::counts);
  copy(depth, &sssd::CandidateTrie::depth);
  copy(match_len, &sssd::CandidateTrie::match_len);
  return py::make_tuple(tokens, parents, counts, depth, match_len, offsets);
}

// The shards of a search: `shards` is held (shared) for the call, so that no other thread dropping the
// Python objects meanwhile can unmap a file under the search.
std::vector<sssd::DatastoreView> views_of(const std::vector<std::shared_ptr<sssd::Datastore>>& shards) {
  std::vector<sssd::DatastoreView> views;
  for (const auto& s : shards) {
    if (s == nullptr) throw py::type_error("shards must be Datastore objects, not None");
    views.push_back(s->view());
  }
  return views;
}

py::tuple search(const std::vector<std::shared_ptr<sssd::Datastore>>& shards, py::handle contexts_h,
                 const sssd::SearchParams& params) {
  sssd::validate_search_params(params);
  const std::vector<sssd::DatastoreView> views = views_of(shards);
  if (!PySequence_Check(contexts_h.ptr()) || PyUnicode_Check(contexts_h.ptr()) || PyBytes_Check(contexts_h.ptr())) {
    throw py::type_error("contexts must be a sequence of int32 arrays, got " + type_name(contexts_h));
  }
  // Held in a list: the spans point into these arrays while the GIL is released.
  const py::list contexts(py::reinterpret_borrow<py::object>(contexts_h));
  std::vector<sssd::TokenSpan> spans;
  spans.reserve(contexts.size());
  for (size_t i = 0; i < contexts.size(); ++i) {
    spans.push_back(int32_span(contexts[i], "contexts[" + std::to_string(i) + "]"));
  }
  std::vector<sssd::CandidateTrie> tries;
  {
    py::gil_scoped_release release;
    sssd::search_batch(views, spans, params, tries);
  }
  return flatten(tries);
}

}  // namespace

void bind_datastore(py::module_& m) {
  py::class_<sssd::SearchParams>(m, "SearchParams")
      .def(py::init([](py::handle max_query_len, py::handle min_query_len, py::handle min_occurrences,
                       py::handle max_samples, py::handle max_depth) {
             sssd::SearchParams p{int32_arg(max_query_len, "max_query_len"), int32_arg(min_query_len, "min_query_len"),
                                  int_arg(min_occurrences, "min_occurrences"), int32_arg(max_samples, "max_samples"),
                                  int32_arg(max_depth, "max_depth")};
             sssd::validate_search_params(p);
             return p;
           }),
           py::arg("max_query_len"), py::arg("min_query_len"), py::arg("min_occurrences"),
           py::arg("max_samples"), py::arg("max_depth"));

  py::class_<sssd::DatastoreBuilder>(m, "Builder")
      .def(py::init([](py::handle vocab_size, const std::string& fingerprint, py::handle force_sa64) {
             return new sssd::DatastoreBuilder(static_cast<uint64_t>(int_arg(vocab_size, "vocab_size", 1, sssd::kMaxVocab)),
                                               fingerprint, bool_arg(force_sa64, "force_sa64"));
           }),
           py::arg("vocab_size"), py::arg("fingerprint"), py::arg("force_sa64") = false)
      .def("add", &builder_add, py::arg("tokens"), py::arg("offsets"),
           "Append documents tokens[offsets[k]:offsets[k+1]].")
      .def(
          "set_search_index",
          [](sssd::DatastoreBuilder& b, py::handle stride, py::handle min_tokens) {
            b.set_search_index(static_cast<uint64_t>(int_arg(stride, "stride", 0)),
                               static_cast<uint64_t>(int_arg(min_tokens, "min_tokens", 0)));
          },
          py::arg("stride"), py::arg("min_tokens"),
          "Store a search index of this stride (0: none) when the corpus has at least min_tokens tokens.")
      .def_property_readonly("num_tokens", &sssd::DatastoreBuilder::num_tokens)
      .def_property_readonly("num_documents", &sssd::DatastoreBuilder::num_documents)
      .def(
          "finish",
          [](sssd::DatastoreBuilder& b, const std::string& path, py::object progress) {
            check_path(path);
            auto fn = progress_fn(progress_arg(std::move(progress)));
            py::gil_scoped_release release;
            b.finish(path, fn);
          },
          py::arg("path"), py::arg("progress") = py::none());

  // Held by shared_ptr: a drafter keeps the files it searches mapped (Drafter's owners).
  py::class_<sssd::Datastore, std::shared_ptr<sssd::Datastore>>(m, "Datastore")
      .def(py::init([](const std::string& path) {
             check_path(path);
             py::gil_scoped_release release;
             return std::make_shared<sssd::Datastore>(path);
           }),
           py::arg("path"))
      .def_property_readonly("path", &sssd::Datastore::path)
      .def_property_readonly("fingerprint", &sssd::Datastore::fingerprint)
      .def_property_readonly("version", [](const sssd::Datastore& d) { return d.header().version; })
      .def_property_readonly("vocab_size", [](const sssd::Datastore& d) { return d.header().vocab_size; })
      .def_property_readonly("num_tokens", [](const sssd::Datastore& d) { return d.header().num_tokens; })
      .def_property_readonly("num_documents",
                             [](const sssd::Datastore& d) { return d.header().num_documents; })
      .def_property_readonly("token_width", [](const sssd::Datastore& d) { return d.header().token_width; })
      .def_property_readonly("sa_width", [](const sssd::Datastore& d) { return d.header().sa_width; })
      .def_property_readonly("file_size", [](const sssd::Datastore& d) { return d.header().file_size; })
      .def_property_readonly("search_index_stride",
                             [](const sssd::Datastore& d) { return sssd::stored_index_stride(d.view()); })
      .def_property_readonly("search_index_bytes",
                             [](const sssd::Datastore& d) {
                               const auto& h = d.header();
                               return (h.flags & sssd::kFlagSearchIndex) ? h.index_bytes : uint64_t{0};
                             })
      .def(
          "document",
          [](const sssd::Datastore& d, py::handle k) {
            const int64_t i = int_arg(k, "k");
            if (i < 0 || static_cast<uint64_t>(i) >= d.header().num_documents) {
              throw py::index_error("document " + std::to_string(i) + " out of range [0, " +
                                    std::to_string(d.header().num_documents) + ")");
            }
            std::vector<int32_t> out;
            d.document(static_cast<uint64_t>(i), out);
            return to_numpy(out);
          },
          py::arg("k"))
      .def(
          "verify",
          [](const sssd::Datastore& d, py::object progress) {
            auto fn = progress_fn(progress_arg(std::move(progress)));
            py::gil_scoped_release release;
            d.verify(fn);
          },
          py::arg("progress") = py::none());

  m.def("search", &search, py::arg("shards"), py::arg("contexts"), py::arg("params"),
        "Batched continuation search; returns (tokens, parents, counts, depth, match_len, offsets).");
}

}  // namespace sssd_py
