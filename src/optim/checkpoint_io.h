// Saving and loading AdamW state as a .safetensors file through io.
// Header-only (inline) so any target that links optim and io can use it.
//
// File contents: "exp_avg", "exp_avg_sq" (f32 over the owned range), "step",
// and the f32 masters of mixed-precision runs in one of two forms:
//   - full masters (ParamSlot::master with a model copy): one "master.<name>"
//     tensor per parameter, as the SFT/RL trainers write them;
//   - held masters (the distributed optimizer's owned slice): one "master"
//     tensor, f32 [owned elements], with metadata master=held.
// The metadata records the parameter layout and the owned range, so loading a
// file into another data-parallel size (or with/without the distributed
// optimizer) fails with a message naming the file.
#pragma once
#include <map>
#include <string>

#include "io/safetensors.h"
#include "optim/adamw.h"

namespace kestrel::optim {

inline constexpr const char* kFullMasterPrefix = "master.";

// One file per data-parallel rank when the state is sharded (the owned range
// is recorded in the metadata and checked on load). `extra` adds metadata
// entries of the caller (the training engine's skip counts).
inline Status save_optimizer_state(const std::string& path, const AdamW& opt,
                                   const std::map<std::string, std::string>& extra = {}) {
  OptimizerState st = opt.state();
  for (const auto& [k, v] : extra) st.metadata[k] = v;
  std::vector<io::NamedTensor> ts;
  for (auto& [name, t] : st.tensors) ts.push_back({name, t});
  for (const auto& s : opt.params())
    if (s.master.defined() && s.model_copy.defined()) ts.push_back({kFullMasterPrefix + s.name, s.master});
  st.metadata["format"] = "kestrel";
  st.metadata["step_count"] = std::to_string(opt.step_count());
  return io::save_safetensors(path, ts, st.metadata);
}

// metadata (optional) receives the file's metadata.
inline Status load_optimizer_state(const std::string& path, AdamW& opt,
                                   std::map<std::string, std::string>* metadata = nullptr) {
  KS_ASSIGN(auto file, io::SafetensorsFile::open(path));
  if (metadata) *metadata = file->metadata();
  std::map<std::string, Tensor> tensors;
  std::vector<std::pair<size_t, Tensor>> masters;
  for (const auto& info : file->tensors()) {
    KS_ASSIGN(Tensor t, file->get(info.name));  // borrowed; the loads copy out of the mapping
    if (info.name.rfind(kFullMasterPrefix, 0) != 0) {
      tensors[info.name] = t;
      continue;
    }
    const std::string pname = info.name.substr(std::string(kFullMasterPrefix).size());
    size_t i = 0;
    while (i < opt.params().size() && opt.params()[i].name != pname) ++i;
    if (i == opt.params().size() || !opt.params()[i].master.defined() || !opt.params()[i].model_copy.defined())
      return KS_ERR(path, ": full master '", info.name, "' matches no parameter of this optimizer that keeps a full "
                    "f32 master; resume with the same model, dtype and use_distributed_optimizer setting");
    if (t.dtype() != DType::F32 || t.numel() != opt.params()[i].master.numel())
      return KS_ERR(path, ": full master '", info.name, "' is ", t.describe(), ", expected f32 with ",
                    opt.params()[i].master.numel(), " elements");
    masters.push_back({i, t});
  }
  KS_TRY(opt.load_state(tensors, file->metadata(), path));
  for (auto& [i, t] : masters) opt.set_master(i, t);
  return Status::ok();
}

}  // namespace kestrel::optim
