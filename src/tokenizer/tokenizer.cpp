#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "tokenizer/tokenizer_impl.h"

namespace kestrel::tokenizer {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// HF's extract_and_normalize: split on non-normalized added tokens in the raw text, normalize each
// remaining piece, split that on the normalized added tokens, and pre-tokenize + BPE the rest.
void Tokenizer::Impl::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  if (raw_matcher->empty()) {
    encode_plain(text, out);
    return;
  }
  std::vector<AddedSplit> splits;
  raw_matcher->split(text, splits);
  for (const auto& s : splits) {
    if (s.token >= 0) out.push_back(added[s.token].id);
    else encode_plain(text.substr(s.begin, s.end - s.begin), out);
  }
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (normalizer && normalizer->normalize(text, normalized)) text = normalized;
  auto model_pieces = [&](std::string_view t) {
    pre_tokenizer.run(t, [&](std::string_view piece) { model->tokenize(piece, out); });
  };
  if (norm_matcher->empty()) {
    model_pieces(text);
    return;
  }
  std::vector<AddedSplit> splits;
  norm_matcher->split(text, splits);
  for (const auto& s : splits) {
    if (s.token >= 0) out.push_back(added[s.token].id);
    else model_pieces(text.substr(s.begin, s.end - s.begin));
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  const auto& tpl = impl_->single_template;
  if (!add_special_tokens || tpl.empty()) {
    impl_->encode_into(text, ids);
    return ids;
  }
  for (const auto& piece : tpl) {
    if (piece.is_sequence) impl_->encode_into(text, ids);
    else ids.insert(ids.end(), piece.ids.begin(), piece.ids.end());
  }
  return ids;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens, int threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(threads, texts.size()));
  if (threads <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) out[i] = encode(texts[i], add_special_tokens);
    return out;
  }
  // Texts differ in length, so threads take the next text as they finish (dynamic scheduling).
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < texts.size() && !failed.load();)
        out[i] = encode(texts[i], add_special_tokens);
    } catch (...) {
      if (!failed.exchange(true)) err = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = m.added_by_id.find(id);
    if (it != m.added_by_id.end()) {
      const AddedToken& t = m.added[it->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(t.decoded);
      continue;
    }
    if (id < 0 || static_cast<size_t>(id) >= m.id_to_model_token.size() || m.id_to_model_token[id].empty()) continue;
    const std::string& tok = m.id_to_model_token[id];
    if (skip_special_tokens && m.special_contents.count(tok)) continue;
    tokens.push_back(tok);
  }
  if (!m.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  m.decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(token);
  if (it != impl_->added_by_content.end()) return it->second;
  auto jt = impl_->model->vocab().find(token);
  return jt == impl_->model->vocab().end() ? -1 : jt->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].decoded;
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_model_token.size()) return {};
  return impl_->id_to_model_token[id];
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

}  // namespace kestrel::tokenizer
