#include "tokenizer/checkpoint_tokenizer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "flashserve/error.h"

namespace flashserve::tokenizer {

// Generated at configure time from the fixture's two files (src/CMakeLists.txt).
extern const char* const kCheckpointTokenizerJson;
extern const char* const kCheckpointTokenizerConfigJson;

void write_checkpoint_tokenizer(const std::string& dir, int32_t vocab_size) {
  nlohmann::json tj = nlohmann::json::parse(kCheckpointTokenizerJson);
  auto& vocab = tj["model"]["vocab"];
  const auto base = static_cast<int32_t>(vocab.size());
  if (vocab_size < base)
    throw Error(ErrorKind::kInvalidArgument, "vocab_size",
                std::to_string(vocab_size) + " is below the " + std::to_string(base) +
                    " tokens of the checkpoint tokenizer");
  for (int32_t id = base; id < vocab_size; ++id)
    vocab["<|unused_" + std::to_string(id - base) + "|>"] = id;
  const auto write = [&](const char* name, const std::string& text) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out) throw Error(ErrorKind::kInvalidArgument, "out", "cannot write '" + path + "'");
  };
  write("tokenizer.json",
        vocab_size == base ? std::string(kCheckpointTokenizerJson) : tj.dump(1) + "\n");
  write("tokenizer_config.json", kCheckpointTokenizerConfigJson);
}

}  // namespace flashserve::tokenizer
