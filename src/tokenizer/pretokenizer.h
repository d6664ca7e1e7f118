// Pre-tokenizer pipeline of tokenizer.json: Split (regex or literal, all five delimiter behaviors,
// invert), ByteLevel (add_prefix_space, use_regex) and Sequence of those, run as nested loops that
// hand each final piece to a callback without materializing the intermediate lists.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/regex_split.h"

namespace kestrel::tokenizer {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
Result<SplitBehavior> parse_split_behavior(const std::string& name);

class PreTokenizer {
 public:
  // Fails when a ByteLevel step came before (it would see byte-mapped text).
  Status add_split(std::unique_ptr<RegexSplitter> splitter, SplitBehavior behavior, bool invert);
  // The byte-to-unicode mapping of ByteLevel is not applied here: the BPE model reads raw bytes
  // through it (BpeOptions::byte_level). Hence nothing may split after a ByteLevel step.
  Status add_byte_level(bool add_prefix_space, bool use_regex);
  bool has_byte_level() const { return has_byte_level_; }

  // Calls emit for each non-empty piece, in order. Pieces may point into `text` or into buffers
  // that live only during the call. Thread-safe.
  void run(std::string_view text, FunctionRef<void(std::string_view)> emit) const;

 private:
  struct Step {
    std::unique_ptr<RegexSplitter> splitter;  // null for a ByteLevel step without regex
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool byte_level = false;
    bool add_prefix_space = false;
  };
  void run_step(size_t k, std::string_view piece, FunctionRef<void(std::string_view)> emit) const;
  void split(const Step& st, std::string_view piece, FunctionRef<void(std::string_view)> next) const;

  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

}  // namespace kestrel::tokenizer
