// serve's reading of vLLM's command line (cli/vllm_flags.h): each value form vLLM takes reads as
// vLLM reads it, and what flashserve cannot do is a UsageError naming the flag.
#include "cli/vllm_flags.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/usage_error_of.h"

namespace flashserve::cli {
namespace {

TEST(VllmFlags, RefusedFlagsNameThemselvesWithWhy) {
  for (const char* name : {"--quantization", "--seed", "--enable-lora", "--pipeline-parallel-size",
                           "--tokenizer", "--swap-space", "--ssl-keyfile"}) {
    ASSERT_TRUE(refused_vllm_flag(name).has_value()) << name;
    std::vector<std::string> args = {"serve", "/m", std::string(name) + "=x"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    const std::string e = error_of([&] { refuse_vllm_flags(3, argv.data()); });
    EXPECT_EQ(
        e.rfind(std::string(name) + ": vLLM's flag is not supported by flashserve serve: ", 0), 0u)
        << e;
    EXPECT_GT(e.size(), std::string(name).size() + 50) << "no reason given: " << e;
  }
  // Flags serve implements, and after "--" nothing is a flag.
  for (const char* name :
       {"--dtype", "--max-num-batched-tokens", "--api-key", "--model", "--kv-cache-dtype"})
    EXPECT_FALSE(refused_vllm_flag(name).has_value()) << name;
  std::vector<std::string> args = {"serve", "--", "--quantization"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  EXPECT_EQ(error_of([&] { refuse_vllm_flags(3, argv.data()); }), "accepted");
}

TEST(VllmFlags, ChatTemplateIsAFileOrTheTemplateItself) {
  char path[] = "/tmp/flashserve-chat-template-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = "{{ messages[0]['content'] }}";
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  EXPECT_EQ(chat_template_source(path), text);
  std::remove(path);
  // No such file: a template when it has a template's characters, else a path that failed.
  EXPECT_EQ(chat_template_source("{% for m in messages %}{{ m.content }}{% endfor %}"),
            "{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(chat_template_source("line one\nline two"), "line one\nline two");
  EXPECT_EQ(error_of([&] { chat_template_source(path); }),
            std::string("--chat-template: cannot read '") + path +
                "' (a file path; an inline template has '{', '}' or a newline)");
}

TEST(VllmFlags, AllowedOriginsAreJsonListsOrSingleOrigins) {
  EXPECT_EQ(allowed_origins({R"(["https://a.example", "http://b.example:8080"])", "*"}),
            (std::vector<std::string>{"https://a.example", "http://b.example:8080", "*"}));
  EXPECT_EQ(allowed_origins({"[]"}), std::vector<std::string>{});
  EXPECT_EQ(error_of([] { allowed_origins({"[1]"}); }),
            "--allowed-origins: 1 in '[1]' is not a string");
  EXPECT_EQ(error_of([] { allowed_origins({"[\"a\""}); }),
            "--allowed-origins: '[\"a\"' is not a JSON list of origins");
  EXPECT_EQ(error_of([] { allowed_origins({"[\"\"]"}); }), "--allowed-origins: an empty origin");
}

TEST(VllmFlags, ApiKeysFromTheFlagElseTheEnvironment) {
  EXPECT_EQ(api_keys({"a", "b"}, "env"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(api_keys({}, "env"), std::vector<std::string>{"env"});
  EXPECT_EQ(api_keys({}, nullptr), std::vector<std::string>{});
  EXPECT_EQ(error_of([] {
              api_keys({"a", ""}, nullptr);
            }),
            "--api-key: is empty, which would serve without authentication; leave it out for that");
  EXPECT_EQ(error_of([] { api_keys({}, ""); }),
            "VLLM_API_KEY: is empty, which would serve without authentication; leave it out for "
            "that");
}

TEST(VllmFlags, DtypeIsAutoOrTheRunnersOwn) {
  for (const char* ok : {"auto", "float32", "float"}) EXPECT_NO_THROW(check_dtype(ok, "cpu"));
  for (const char* ok : {"auto", "bfloat16"}) EXPECT_NO_THROW(check_dtype(ok, "cuda"));
  EXPECT_EQ(
      error_of([] { check_dtype("half", "cuda"); }),
      "--dtype: 'half': the cuda runner computes in bfloat16 (give --dtype auto or bfloat16)");
  EXPECT_EQ(error_of([] { check_dtype("fp8", "cuda"); }),
            "--dtype: 'fp8' is not one of auto, bfloat16, float16, half, float32, float");
}

}  // namespace
}  // namespace flashserve::cli
