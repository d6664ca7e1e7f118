// Dataset and loader settings from a verl-style run configuration (data.*).
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"

namespace kestrel::data {

// data.prompt_key, max_prompt_length, filter_overlong_prompts, truncation,
// skip_malformed (when the schema declares it), train_max_samples,
// apply_chat_template_kwargs.
Result<RlDatasetOptions> rl_dataset_options(const config::Config& cfg, bool validation = false);
// data.seed (null: 1, verl's default generator seed) and data.shuffle.
uint64_t data_seed(const config::Config& cfg);
// Expands '~/' in data.train_files / data.val_files entries.
std::vector<std::string> expand_paths(const std::vector<std::string>& paths);

}  // namespace kestrel::data
