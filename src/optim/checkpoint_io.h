// Saving and loading AdamW state as a .safetensors file through io.
// Header-only (inline) because kestrel_optim does not link kestrel_io yet:
// any target that links both (train, rl, cli) can use it. Once CMake gives
// optim the io edge, these move into a .cpp unchanged.
#pragma once
#include <map>
#include <string>

#include "io/safetensors.h"
#include "optim/adamw.h"

namespace kestrel::optim {

// One file per data-parallel rank when the state is sharded (the owned range
// is recorded in the metadata and checked on load).
inline Status save_optimizer_state(const std::string& path, const AdamW& opt) {
  OptimizerState st = opt.state();
  std::vector<io::NamedTensor> ts;
  for (auto& [name, t] : st.tensors) ts.push_back({name, t});
  st.metadata["format"] = "kestrel";
  st.metadata["step_count"] = std::to_string(opt.step_count());
  return io::save_safetensors(path, ts, st.metadata);
}

inline Status load_optimizer_state(const std::string& path, AdamW& opt) {
  KS_ASSIGN(auto file, io::SafetensorsFile::open(path));
  std::map<std::string, Tensor> tensors;
  for (const auto& info : file->tensors()) {
    KS_ASSIGN(Tensor t, file->get(info.name));
    tensors[info.name] = t;  // borrowed; load_state copies out of the mapping
  }
  return opt.load_state(tensors, file->metadata(), path);
}

}  // namespace kestrel::optim
