#include "tokenizer/pretokenizer.h"

#include <algorithm>

namespace kestrel::tokenizer {

Result<SplitBehavior> parse_split_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  return KS_ERR("unknown Split behavior \"", name,
                "\" (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

Status PreTokenizer::add_split(std::unique_ptr<RegexSplitter> splitter, SplitBehavior behavior, bool invert) {
  // Any step after ByteLevel would see byte-mapped text, which the BPE model never materializes.
  if (has_byte_level_) return KS_ERR("not supported yet: a Split pre-tokenizer after ByteLevel");
  Step st;
  st.splitter = std::move(splitter);
  st.behavior = behavior;
  st.invert = invert;
  steps_.push_back(std::move(st));
  return Status::ok();
}

Status PreTokenizer::add_byte_level(bool add_prefix_space, bool use_regex) {
  if (has_byte_level_) return KS_ERR("not supported yet: two ByteLevel pre-tokenizers in one Sequence");
  Step st;
  st.byte_level = true;
  st.add_prefix_space = add_prefix_space;
  if (use_regex) st.splitter = std::move(make_regex_splitter(std::string(kGpt2Pattern)).value());
  steps_.push_back(std::move(st));
  has_byte_level_ = true;
  return Status::ok();
}

void PreTokenizer::run(std::string_view text, FunctionRef<void(std::string_view)> emit) const {
  run_step(0, text, emit);
}

void PreTokenizer::run_step(size_t k, std::string_view piece, FunctionRef<void(std::string_view)> emit) const {
  if (piece.empty()) return;
  if (k == steps_.size()) {
    emit(piece);
    return;
  }
  const Step& st = steps_[k];
  auto next = [&](std::string_view p) { run_step(k + 1, p, emit); };
  if (st.byte_level) {
    std::string prefixed;
    if (st.add_prefix_space && piece.front() != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (st.splitter) split(st, piece, next);
    else next(piece);
    return;
  }
  split(st, piece, next);
}

// HF's NormalizedString::split over the (offsets, is_match) list of Pattern::find_matches, which
// alternates gaps and matches and covers the whole piece.
void PreTokenizer::split(const Step& st, std::string_view s, FunctionRef<void(std::string_view)> next) const {
  if (st.behavior == SplitBehavior::Isolated) {  // the common case streams
    size_t prev = 0;
    st.splitter->for_each_match(s, [&](size_t b, size_t e) {
      if (b > prev) next(s.substr(prev, b - prev));
      if (e > b) next(s.substr(b, e - b));
      prev = e;
    });
    if (prev < s.size()) next(s.substr(prev));
    return;
  }
  struct Part { size_t b, e; bool match; };
  std::vector<Part> parts;
  size_t prev = 0;
  st.splitter->for_each_match(s, [&](size_t b, size_t e) {
    if (b != prev) parts.push_back({prev, b, false});
    parts.push_back({b, e, true});
    prev = e;
  });
  if (prev != s.size()) parts.push_back({prev, s.size(), false});
  if (st.invert)
    for (auto& p : parts) p.match = !p.match;

  std::vector<Part> out;  // match = "remove" from here on
  bool prev_match = false;
  switch (st.behavior) {
    case SplitBehavior::Removed:
      out = parts;
      break;
    case SplitBehavior::Contiguous:
      for (const auto& p : parts) {
        if (p.match == prev_match && !out.empty()) out.back().e = p.e;
        else out.push_back({p.b, p.e, false});
        prev_match = p.match;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const auto& p : parts) {
        if (p.match && !prev_match && !out.empty()) out.back().e = p.e;
        else out.push_back({p.b, p.e, false});
        prev_match = p.match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !prev_match && !out.empty()) out.back().b = it->b;
        else out.push_back({it->b, it->e, false});
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::Isolated:
      break;
  }
  for (const auto& p : out)
    if (!p.match && p.e > p.b) next(s.substr(p.b, p.e - p.b));
}

}  // namespace kestrel::tokenizer
