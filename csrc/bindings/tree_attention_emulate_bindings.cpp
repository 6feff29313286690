// Binding of the host emulation of the CUDA tree attention kernel (csrc/cuda/tree_attention_emulate.h) into
// sssd._core, so that CPU-only test runs check the kernel's tiling, splits and merge against the torch
// float64 reference (tests/kernels/test_cuda_ops.py). Dense float32 numpy arrays only; the layout is the kernel's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda/tree_attention_emulate.h"

namespace sssd_py {
namespace py = pybind11;

namespace {

template <typename T>
py::array_t<T> dense(py::handle h, const char* name, int ndim) {
  if (!py::isinstance<py::array>(h)) throw py::type_error(std::string(name) + " must be a numpy array");
  auto a = py::reinterpret_borrow<py::array>(h);
  if (!a.dtype().is(py::dtype::of<T>())) {
    throw py::type_error(std::string(name) + " has dtype " + std::string(py::str(a.dtype())) + ", expected " +
                         std::string(py::str(py::dtype::of<T>())));
  }
  if (a.ndim() != ndim) throw py::value_error(std::string(name) + " must be " + std::to_string(ndim) + "-D");
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + " must be C-contiguous");
  return py::reinterpret_borrow<py::array_t<T>>(a);
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("tree_attention_emulate: " + what);
}

py::array_t<float> emulate(py::handle q_h, py::handle kc_h, py::handle vc_h, py::handle kt_h, py::handle vt_h,
                           py::handle off_h, py::handle ctx_h, py::handle slot_h, py::handle mask_h, float scale,
                           int splits, int64_t chunk, bool round_p_to_bf16) {
  auto q = dense<float>(q_h, "q", 3), kc = dense<float>(kc_h, "k_cache", 4), vc = dense<float>(vc_h, "v_cache", 4);
  auto kt = dense<float>(kt_h, "k_tree", 3), vt = dense<float>(vt_h, "v_tree", 3);
  auto off = dense<int64_t>(off_h, "offsets", 1);
  auto ctx = dense<int32_t>(ctx_h, "ctx_lens", 1), slot = dense<int32_t>(slot_h, "slots", 1);
  auto masks = dense<uint64_t>(mask_h, "masks", 2);
  expect(splits >= 1 && splits <= 4096, "splits must be in [1, 4096]");
  expect(chunk >= 1 && chunk <= (int64_t{1} << 31), "chunk must be in [1, 2^31]");
  expect(std::isfinite(scale) && scale > 0.0f, "scale must be finite and > 0");
  const int64_t N = q.shape(0), Hq = q.shape(1), D = q.shape(2), B = ctx.shape(0);
  const int64_t S = kc.shape(0), R = kc.shape(1), Hkv = kc.shape(2);
  expect(B >= 1 && off.shape(0) == B + 1 && slot.shape(0) == B, "offsets must be [B+1], ctx_lens/slots [B]");
  for (int i = 0; i < 4; ++i) expect(vc.shape(i) == kc.shape(i), "v_cache must have the shape of k_cache");
  expect(kc.shape(3) == D && kt.shape(0) == N && kt.shape(1) == Hkv && kt.shape(2) == D, "K/V shapes disagree with q");
  for (int i = 0; i < 3; ++i) expect(vt.shape(i) == kt.shape(i), "v_tree must have the shape of k_tree");
  expect(masks.shape(0) == N && masks.shape(1) == 2, "masks must be [N, 2] uint64");
  expect(Hkv >= 1 && Hq % Hkv == 0, "q heads must be a multiple of KV heads");
  const int64_t* o = off.data();
  expect(o[0] == 0 && o[B] == N, "offsets must start at 0 and end at N");
  expect(Hq <= 4096 && D <= 4096 && (splits == 1 || N * Hq * D <= (int64_t{1} << 32) / splits),
         "q is too large for the emulation's split workspace");
  int max_nodes = 0;
  int64_t max_ctx = 0;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t n = o[i + 1] - o[i];
    expect(n >= 1 && n <= 128, "every tree needs 1..128 nodes");
    expect(ctx.data()[i] >= 0 && ctx.data()[i] <= R, "ctx_lens must lie in 0..cache rows");
    expect(ctx.data()[i] == 0 || (slot.data()[i] >= 0 && slot.data()[i] < S), "slots out of range");
    max_nodes = std::max<int>(max_nodes, static_cast<int>(n));
    max_ctx = std::max<int64_t>(max_ctx, ctx.data()[i]);
  }
  py::array_t<float> out({N, Hq, D});
  py::array_t<float> pout(splits > 1 ? std::vector<int64_t>{splits, N, Hq, D} : std::vector<int64_t>{0});
  py::array_t<float> plse(splits > 1 ? std::vector<int64_t>{splits, N, Hq} : std::vector<int64_t>{0});
  sssd_cuda::TreeAttentionArgs a;
  a.batch = static_cast<int>(B);
  a.total_nodes = N;
  a.q_heads = static_cast<int>(Hq);
  a.kv_heads = static_cast<int>(Hkv);
  a.head_dim = static_cast<int>(D);
  a.max_nodes = max_nodes;
  a.max_ctx = max_ctx;
  a.scale = scale;
  a.dtype = sssd_cuda::DType::kFloat32;
  a.q = q.data();
  a.q_stride_token = Hq * D;
  a.q_stride_head = D;
  a.out = out.mutable_data();
  a.out_stride_token = Hq * D;
  a.out_stride_head = D;
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.cache_stride_slot = R * Hkv * D;
  a.cache_stride_row = Hkv * D;
  a.cache_stride_head = D;
  a.k_tree = kt.data();
  a.v_tree = vt.data();
  a.tree_stride_token = Hkv * D;
  a.tree_stride_head = D;
  a.v_tree_stride_token = Hkv * D;
  a.v_tree_stride_head = D;
  a.offsets = o;
  a.ctx_lens = ctx.data();
  a.slots = slot.data();
  a.masks = masks.data();
  a.splits = splits;
  a.chunk = chunk;
  a.partial_out = splits > 1 ? pout.mutable_data() : nullptr;
  a.partial_lse = splits > 1 ? plse.mutable_data() : nullptr;
  {
    py::gil_scoped_release nogil;
    sssd_cuda::tree_attention_emulate(a, round_p_to_bf16);
  }
  return out;
}

}  // namespace

void bind_tree_attention_emulation(py::module_& m) {
  m.def("tree_attention_emulate", &emulate, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("k_tree"),
        py::arg("v_tree"), py::arg("offsets"), py::arg("ctx_lens"), py::arg("slots"), py::arg("masks"),
        py::arg("scale"), py::arg("splits"), py::arg("chunk"), py::arg("round_p_to_bf16") = false,
        "Host emulation of the CUDA tree attention kernel (float32 numpy arrays; see sssd.cuda_ops).");
}

}  // namespace sssd_py
