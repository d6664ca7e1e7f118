// Runs a test body once per GEMM library installed here (OpenBLAS, BLIS,
// oneDNN), with every sgemm routed to it: the auto choice may take any of
// them, and old BLAS kernels have computed wrong results on some CPUs.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/gemm.h"

namespace kestrel::testing {

template <class F>
void for_each_gemm_provider(F&& f) {
  for (cpu::GemmProvider p : cpu::available_gemm_providers()) {
    cpu::ScopedGemmProvider scope(p);
    SCOPED_TRACE(std::string("GEMM library ") + cpu::provider_key(p));
    f();
  }
}

}  // namespace kestrel::testing
