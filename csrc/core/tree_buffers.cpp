#include <stdexcept>
#include <string>

#include "core/drafter.h"

namespace sssd {

void build_tree_buffers(const int32_t* parents, const int32_t* depth, int64_t n, const int64_t* offsets, int64_t b,
                        int32_t* positions, uint64_t* masks, int32_t path_width, int32_t* paths, int32_t* tree_index) {
  if (b < 0 || offsets[0] != 0 || offsets[b] != n) throw std::invalid_argument("offsets must start at 0 and end at N");
  for (int64_t i = 0; i < b; ++i) {
    const int64_t s = offsets[i], e = offsets[i + 1];
    if (e <= s) throw std::invalid_argument("tree " + std::to_string(i) + " is empty (every tree has a root)");
    if (e - s > 128) {
      throw std::invalid_argument("tree " + std::to_string(i) + " has " + std::to_string(e - s) +
                                  " nodes; tree buffers support at most 128");
    }
    for (int64_t v = s; v < e; ++v) {
      const int64_t local = v - s;
      const int32_t p = parents[v];
      if (local == 0 ? p != -1 : (p < 0 || p >= local)) {
        throw std::invalid_argument("parents[" + std::to_string(v) + "] = " + std::to_string(p) +
                                    ": roots need -1, other nodes a parent index below their own (within the tree)");
      }
      const int32_t d = local == 0 ? 0 : depth[s + p] + 1;
      if (depth[v] != d) throw std::invalid_argument("depth[" + std::to_string(v) + "] is inconsistent with parents");
      if (d + 1 > path_width) throw std::invalid_argument("path_width is smaller than max depth + 1");
      positions[v] = d;
      tree_index[v] = static_cast<int32_t>(i);
      uint64_t* m = masks + 2 * v;
      int32_t* path = paths + static_cast<int64_t>(path_width) * v;
      if (local == 0) {
        m[0] = 1;
        m[1] = 0;
        path[0] = static_cast<int32_t>(v);
        for (int32_t k = 1; k < path_width; ++k) path[k] = -1;
      } else {
        const uint64_t* pm = masks + 2 * (s + p);
        m[0] = pm[0];
        m[1] = pm[1];
        m[local >> 6] |= uint64_t{1} << (local & 63);
        const int32_t* pp = paths + static_cast<int64_t>(path_width) * (s + p);
        for (int32_t k = 0; k < path_width; ++k) path[k] = pp[k];
        path[d] = static_cast<int32_t>(v);
      }
    }
  }
}

}  // namespace sssd
