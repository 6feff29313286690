// Binding of tree_attention_cpu (csrc/core/tree_attention_cpu.h) on float32 numpy arrays of any
// non-negative strides with a contiguous last dimension (zero-copy views of torch tensors). Every shape,
// stride, index and overlap is checked here, so no arrays can make the kernel read or write out of bounds.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "bindings/common.h"
#include "core/tree_attention_cpu.h"

namespace sssd_py {
namespace py = pybind11;

namespace {

constexpr int64_t kMaxTreeNodes = 128;  // two 64-bit mask words per node

// A float32 array of `ndim` dimensions whose last dimension is contiguous and whose strides are
// non-negative multiples of 4 bytes. Returns its strides in elements.
std::vector<int64_t> float_view(const py::array& a, const char* name, int ndim) {
  if (!a.dtype().is(py::dtype::of<float>())) {
    throw py::type_error(std::string(name) + " must have dtype float32, got " + std::string(py::str(a.dtype())));
  }
  if (a.ndim() != ndim) throw py::value_error(std::string(name) + " must be " + std::to_string(ndim) + "-D");
  std::vector<int64_t> strides(ndim);
  for (int i = 0; i < ndim; ++i) {
    const py::ssize_t s = a.strides(i);
    if (s < 0 || s % 4 != 0) throw py::value_error(std::string(name) + " needs non-negative float strides");
    strides[i] = s / 4;
  }
  if (a.shape(ndim - 1) > 1 && strides[ndim - 1] != 1) {
    throw py::value_error(std::string(name) + "'s last dimension must be contiguous");
  }
  return strides;
}

template <class T>
const T* exact(py::handle h, const char* name, py::ssize_t n, int ndim = 1) {
  const py::array a = array_arg(h, name);
  if (!a.dtype().is(py::dtype::of<T>())) {
    throw py::type_error(std::string(name) + " must have dtype " + std::string(py::str(py::dtype::of<T>())) +
                         ", got " + std::string(py::str(a.dtype())));
  }
  if (a.ndim() != ndim || a.shape(0) != n || !(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string(name) + " must be C-contiguous with " + std::to_string(n) + " rows");
  }
  return static_cast<const T*>(a.data());
}

bool overlap(const py::array& a, const py::array& b) {
  // conservative: the spans from the first to one past the last element
  auto span = [](const py::array& x) {
    const auto* p = static_cast<const char*>(x.data());
    py::ssize_t last = 0;
    for (py::ssize_t i = 0; i < x.ndim(); ++i) last += (x.shape(i) - 1) * x.strides(i);
    return std::make_pair(p, p + last + x.itemsize());
  };
  if (a.size() == 0 || b.size() == 0) return false;
  const auto sa = span(a), sb = span(b);
  return sa.first < sb.second && sb.first < sa.second;
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("tree_attention_cpu: " + what);
}

void tree_attention_cpu(py::handle q_h, py::handle kt_h, py::handle vt_h, py::handle kc_h, py::handle vc_h,
                        py::handle off_h, py::handle ctx_h, py::handle slot_h, py::handle mask_h, py::handle out_h,
                        py::handle scale_h, py::handle threads_h, py::handle isa_h) {
  const py::array q = array_arg(q_h, "q"), kt = array_arg(kt_h, "k_tree"), vt = array_arg(vt_h, "v_tree");
  const py::array kc = array_arg(kc_h, "k_cache"), vc = array_arg(vc_h, "v_cache");
  py::array out = array_arg(out_h, "out");
  const auto qs = float_view(q, "q", 3), ks = float_view(kt, "k_tree", 3), vs = float_view(vt, "v_tree", 3);
  const auto kcs = float_view(kc, "k_cache", 4), vcs = float_view(vc, "v_cache", 4);
  const auto os = float_view(out, "out", 3);
  const int64_t n = q.shape(0), heads = q.shape(1), dim = q.shape(2), kv_heads = kt.shape(1);
  expect(out.writeable(), "out must be writeable");
  expect(out.shape(0) == n && out.shape(1) == heads && out.shape(2) == dim, "out must have q's shape");
  expect(kt.shape(0) == n && kt.shape(2) == dim && kv_heads >= 1, "k_tree must be [N, Hkv, D] with q's N and D");
  expect(vt.shape(0) == n && vt.shape(1) == kv_heads && vt.shape(2) == dim, "v_tree must have k_tree's shape");
  expect(heads >= 1 && heads % kv_heads == 0, "the query heads must be a multiple of the KV heads");
  expect(kc.shape(1) == kv_heads && kc.shape(3) == dim, "k_cache must be [slots, Hkv, rows, D]");
  for (int i = 0; i < 4; ++i) expect(vc.shape(i) == kc.shape(i), "v_cache must have k_cache's shape");
  expect(vcs == kcs, "v_cache must have k_cache's strides");
  for (const py::array* in : {&q, &kt, &vt, &kc, &vc}) expect(!overlap(out, *in), "out must not share memory");
  const int64_t slots = kc.shape(0), rows = kc.shape(2);
  const py::array offsets_a = array_arg(off_h, "offsets");
  const int64_t batch = offsets_a.ndim() == 1 ? offsets_a.shape(0) - 1 : -1;
  expect(batch >= 1, "offsets must be [B + 1] with B >= 1");
  const auto* offsets = exact<int64_t>(off_h, "offsets", batch + 1);
  const auto* ctx = exact<int32_t>(ctx_h, "ctx_lens", batch);
  const auto* slot = exact<int32_t>(slot_h, "slots", batch);
  const auto* masks = exact<uint64_t>(mask_h, "masks", n, 2);
  expect(py::reinterpret_borrow<py::array>(mask_h).shape(1) == 2, "masks must be [N, 2]");
  expect(offsets[0] == 0 && offsets[batch] == n, "offsets must run from 0 to N");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t size = offsets[b + 1] - offsets[b];
    expect(size >= 1 && size <= kMaxTreeNodes, "every tree needs 1.." + std::to_string(kMaxTreeNodes) + " nodes");
    expect(ctx[b] >= 0 && ctx[b] <= rows, "ctx_lens must be in [0, cache rows]");
    expect(slot[b] >= 0 && slot[b] < slots, "slots must index the cache");
  }
  const double scale = py::cast<double>(scale_h);
  expect(std::isfinite(scale), "scale must be finite");
  const int threads = int32_arg(threads_h, "threads", 0, 4096);
  const auto isa = static_cast<sssd::Isa>(int32_arg(isa_h, "isa", 0, 3));
  expect(sssd::isa_supported(isa), "this CPU does not run isa " + std::to_string(int(isa)));
  const sssd::TreeAttentionCpu args{
      static_cast<const float*>(q.data()), qs[0], qs[1], static_cast<float*>(out.mutable_data()), os[0], os[1],
      static_cast<const float*>(kt.data()), ks[0], ks[1], static_cast<const float*>(vt.data()), vs[0], vs[1],
      static_cast<const float*>(kc.data()), static_cast<const float*>(vc.data()), kcs[0], kcs[1], kcs[2],
      offsets, ctx, slot, masks, batch, heads, kv_heads, dim, static_cast<float>(scale)};
  py::gil_scoped_release release;
  sssd::tree_attention_cpu(args, threads, isa);
}

}  // namespace

void bind_tree_attention_cpu(py::module_& m) {
  m.def("tree_attention_cpu", &tree_attention_cpu, py::arg("q"), py::arg("k_tree"), py::arg("v_tree"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("offsets"), py::arg("ctx_lens"), py::arg("slots"),
        py::arg("masks"), py::arg("out"), py::arg("scale"), py::arg("threads") = 0, py::arg("isa") = 0,
        "Tree attention of packed trees on the CPU, float32, into out [N, H, D]: q [N, H, D], k_tree/v_tree "
        "[N, Hkv, D], k_cache/v_cache [slots, Hkv, rows, D] (any non-negative strides, last dimension "
        "contiguous), offsets int64 [B+1], ctx_lens int32 [B], slots int32 [B], masks uint64 [N, 2] (bit a: "
        "node a of the tree is visible). threads: OpenMP threads (0: the default); isa as for linear_rows.");
}

}  // namespace sssd_py
