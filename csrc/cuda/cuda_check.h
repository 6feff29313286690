// CUDA error checks of the launchers: every failure becomes a std::runtime_error naming the operation.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace sssd_cuda {

inline void check_cuda(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(op) + ": " + what + " failed: " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}

// After a launch: launch-configuration errors and errors of earlier asynchronous work show up here.
inline void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

}  // namespace sssd_cuda
