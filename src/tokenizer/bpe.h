// The BPE model of HF tokenizers: initial symbols from the vocab (with byte_fallback / unk), then
// merges applied lowest rank first (leftmost on ties), with ignore_merges and a word cache.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kestrel::tokenizer {

// string -> T map that can be probed with a string_view without building a std::string.
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class T>
using StrMap = std::unordered_map<std::string, T, StrHash, std::equal_to<>>;

struct BpeOptions {
  // Input words are raw bytes that a ByteLevel pre-tokenizer would have mapped through
  // bytes_to_unicode; the model looks them up through that mapping without materializing it.
  bool byte_level = false;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;      // -1: no unk token (unknown characters are dropped, as in HF)
  size_t cache_capacity = 1 << 18;  // words; 0 disables the cache
};

class BpeModel {
 public:
  // vocab: token string -> id; merges: pairs of token strings, in rank order.
  // Throws kestrel::Error naming the bad entry when a merge refers to tokens not in vocab.
  BpeModel(StrMap<int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions opts);
  ~BpeModel();

  // Appends the ids of one pre-tokenized word. Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  const StrMap<int32_t>& vocab() const { return vocab_; }
  const BpeOptions& options() const { return opts_; }
  // Words longer than this many symbols use a heap instead of the linear scan for the lowest-rank pair.
  void set_linear_merge_limit(size_t n) { linear_limit_ = n; }
  void set_cache_enabled(bool on) { cache_enabled_ = on; }

 private:
  struct MergeTable;
  struct Cache;
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;
  void merge_linear(std::vector<int32_t>& syms) const;
  void merge_heap(std::vector<int32_t>& syms) const;

  BpeOptions opts_;
  StrMap<int32_t> vocab_;
  // byte_level: what each raw byte starts as (its mapped char's id, that char's byte-fallback
  // tokens, or unknown); whole-word lookups use byte_vocab_, keyed by raw bytes.
  struct ByteInit {
    enum Kind : uint8_t { kKnown, kFallback, kUnknown } kind = kUnknown;
    std::vector<int32_t> ids;
  };
  ByteInit byte_init_[256];
  StrMap<int32_t> byte_vocab_;
  int32_t byte_fallback_ids_[256];
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
  size_t linear_limit_ = 48;
  bool cache_enabled_ = true;
};

}  // namespace kestrel::tokenizer
