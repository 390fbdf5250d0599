// A model directory's tokenizer files as a careless or hostile writer leaves them: a directory or a
// named pipe where tokenizer.json should be, a chat template list whose entries have fields of
// the wrong JSON type, a path the file system refuses, token ids far beyond the vocabulary. Each
// is an Error naming the file; before the hardening of model loading these read as "not valid
// JSON", blocked forever, escaped as nlohmann's or the standard library's own exceptions, or read
// a token out of bounds.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "flashserve/error.h"
#include "support/temp_dirs.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace flashserve::tokenizer {
namespace {

namespace fsys = std::filesystem;

std::string fresh_dir(const std::string& tag) {
  return flashserve::testing::temp_dir("fs_tok_" + tag + "_" + std::to_string(::getpid()));
}

void expect_error(const std::function<void()>& load, const std::string& mention) {
  try {
    load();
    ADD_FAILURE() << "accepted; expected an error mentioning " << mention;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a flashserve::Error: " << e.what();
  }
}

TEST(ModelDirFiles, TokenizerJsonThatIsNotAFileIsRefusedNamingIt) {
  const std::string dir = fresh_dir("dir");
  fsys::create_directory(dir + "/tokenizer.json");
  expect_error([&] { Tokenizer::load(dir); }, "is a directory");
  fsys::remove(dir + "/tokenizer.json");
  ASSERT_EQ(mkfifo((dir + "/tokenizer.json").c_str(), 0600), 0);
  auto loaded = std::async(std::launch::async, [&] {
    expect_error([&] { Tokenizer::load(dir); }, "not a regular file");
  });
  if (loaded.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "opening a named pipe blocked";
    std::ofstream(dir + "/tokenizer.json") << "{}";  // a writer lets the blocked open return
  }
  loaded.get();
  expect_error([&] { Tokenizer::load(std::string(5000, 'x')); }, "does not exist");
}

TEST(ModelDirFiles, ChatTemplateListWithFieldsOfTheWrongTypeIsAnError) {
  const std::string dir = fresh_dir("tmpl");
  for (const char* list :
       {R"([{"name": 1, "template": "x"}])", R"([{"name": "default", "template": 7}])"}) {
    std::ofstream(dir + "/tokenizer_config.json") << R"({"chat_template": )" << list << "}";
    expect_error([&] { ChatTemplate::load(dir); }, "chat_template");
  }
}

// The byte-level fixture (1528 BPE tokens, added tokens 1528..1535, a TemplateProcessing that
// prepends <|begin_of_text|> = 1528) edited by `edit`.
std::string fixture_with(const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(fixture_dir("byte_level") + "/tokenizer.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  return j.dump();
}

TEST(ModelDirFiles, TokenIdsBeyondTheVocabularyAreRefusedBeforeUse) {
  // Sized its tables by the id first: 2^31 - 1 overflowed id + 1 (std::length_error), 2^30 asked
  // for 32 GB.
  expect_error(
      [] {
        Tokenizer::from_json(fixture_with([](auto& j) { j["model"]["vocab"]["zz"] = 2147483647; }));
      },
      "model.vocab");
  expect_error(
      [] {
        Tokenizer::from_json(
            fixture_with([](auto& j) { j["added_tokens"][0]["id"] = 2147483647; }));
      },
      "added_tokens");
  // The template's ids: out of the vocabulary it read id_to_token_[id] out of bounds for the BOS
  // text; 2^32 + 1528 was truncated to 1528 and accepted.
  for (const int64_t id : {int64_t{99999}, int64_t{-1}, (int64_t{1} << 32) + 1528}) {
    expect_error(
        [&] {
          Tokenizer::from_json(fixture_with([&](auto& j) {
            j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"][0] =
                id;
          }));
        },
        "post_processor");
  }
  EXPECT_EQ(Tokenizer::from_json(fixture_with([](auto&) {})).bos_token_id(), 1528);
}

}  // namespace
}  // namespace flashserve::tokenizer
