// A JSONL dataset file through the checks and loaders `kestrel train` / `sft`
// run: check_rl_files / check_sft_files, then load_rl_dataset and
// load_sft_dataset (prompt rendering with Qwen2.5's chat template, tokenizing,
// truncation), strict and with skip_malformed.
#include <filesystem>
#include <cstring>
#include <fstream>

#include "data/chat_tokenizer.h"
#include "data/dataset.h"
#include "fuzz_common.h"

namespace {
const kestrel::data::ChatTokenizer& chat_tokenizer() {
  static const kestrel::data::ChatTokenizer tok = [] {
    namespace fs = std::filesystem;
    const std::string src = KESTREL_SOURCE_DIR, dir = kestrel::fuzz::scratch_path("tok");
    fs::create_directories(dir);
    fs::copy_file(src + "/tests/golden/tokenizer/qwen2/tokenizer.json", dir + "/tokenizer.json",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(src + "/tests/golden/tokenizer/qwen2/tokenizer_config.json", dir + "/tokenizer_config.json",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(src + "/tests/golden/chat/templates/qwen2_5.jinja", dir + "/chat_template.jinja",
                  fs::copy_options::overwrite_existing);
    auto r = kestrel::data::ChatTokenizer::from_dir(dir);
    if (!r) {
      std::fprintf(stderr, "fuzz_jsonl_dataset: %s\n", r.status().message().c_str());
      std::abort();
    }
    return std::move(r).value();
  }();
  return tok;
}
}  // namespace

void run(const std::string& path, const kestrel::data::ChatTokenizer& tok);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel::data;
  static const std::string path = kestrel::fuzz::scratch_path("train.jsonl");
  kestrel::fuzz::write_file(path, data, size);
  const ChatTokenizer& tok = chat_tokenizer();
  // A row longer than the length limit under truncation=error is thrown as
  // kestrel::Error on purpose (a configuration mismatch is never skipped as a
  // malformed row; the CLI reports it); any other exception is a finding.
  try {
    run(path, tok);
  } catch (const kestrel::Error& e) {
    if (!std::strstr(e.what(), " tokens, longer than data.max")) throw;
  }
  return 0;
}

void run(const std::string& path, const kestrel::data::ChatTokenizer& tok) {
  using namespace kestrel::data;
  for (bool skip : {false, true}) {
    RlDatasetOptions ro;
    ro.skip_malformed = skip;
    ro.max_prompt_length = 64;
    ro.truncation = skip ? Truncation::Left : Truncation::Error;
    if (check_rl_files({path}, ro)) (void)load_rl_dataset({path}, tok, ro);
    SftDatasetOptions so;
    so.skip_malformed = skip;
    so.max_length = 64;
    so.truncation = skip ? Truncation::Right : Truncation::Error;
    if (check_sft_files({path}, so)) (void)load_sft_dataset({path}, tok, so);
  }
}
