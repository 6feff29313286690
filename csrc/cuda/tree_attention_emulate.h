// Host emulation of the tree attention kernel (float32 data, same layout and arguments as the launcher).
#pragma once
#include "cuda/tree_attention.h"

namespace sssd_cuda {

// Runs the kernel's decomposition on the CPU. Data pointers in `a` point to float32 host arrays, a.dtype
// must be DType::kFloat32; partial_out/partial_lse are host workspaces when a.splits > 1. With
// round_p_to_bf16 the probabilities are rounded as the bf16 kernel rounds them before the P.V product.
void tree_attention_emulate(const TreeAttentionArgs& a, bool round_p_to_bf16);

// Round-to-nearest-even float -> bfloat16 -> float.
float round_to_bf16(float x);

}  // namespace sssd_cuda
