// Chat templates: the published Llama 3, Mistral, Qwen2 and Llama 2 templates
// (fixtures/templates/*.jinja, as their tokenizer_config.json files have them) render what we
// worked out by hand from their text; the Jinja subset's whitespace rules, loop variables and
// filters; errors for what templates reject and for what the subset lacks.
#include <gtest/gtest.h>

#include "flashserve/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace flashserve::tokenizer {
namespace {

ChatTemplate published(const std::string& name, const std::string& bos, const std::string& eos) {
  return ChatTemplate::from_file(fixture_dir("templates/" + name + ".jinja"), bos, eos);
}

std::string render(const std::string& src, const std::vector<ChatMessage>& m, bool gen = false) {
  return ChatTemplate::from_string(src, "<s>", "</s>").render(m, gen);
}

const std::vector<ChatMessage> kChat = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};

TEST(ChatTemplate, Llama3) {
  const ChatTemplate t = published("llama3", "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(
      t.render({{"system", "You are terse."},
                {"user", "  Hi there \n"},
                {"assistant", "Hello!"},
                {"user", "2+2?"}},
               true),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.render({{"user", "x"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
}

TEST(ChatTemplate, MistralInst) {
  const ChatTemplate t = published("mistral", "<s>", "</s>");
  EXPECT_EQ(t.render(kChat, true), "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
  try {
    t.render({{"user", "a"}, {"user", "b"}}, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.argument(), "messages");
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos);
  }
  EXPECT_THROW(t.render({{"system", "s"}, {"user", "a"}}, true), Error);
}

TEST(ChatTemplate, Qwen2ChatML) {
  const ChatTemplate t = published("qwen2", "", "<|im_end|>");
  EXPECT_EQ(t.render({{"user", "Hello"}}, true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render({{"system", "Be brief."}, {"user", "Hello"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n");
}

TEST(ChatTemplate, Llama2WithSystemPrompt) {
  const ChatTemplate t = published("llama2", "<s>", "</s>");
  EXPECT_EQ(
      t.render({{"system", "Sys"}, {"user", "Hi "}, {"assistant", " Hello "}, {"user", "Q"}}, true),
      "<s>[INST] <<SYS>>\nSys\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Q [/INST]");
  EXPECT_EQ(t.render({{"user", "Q"}}, true), "<s>[INST] Q [/INST]");
}

TEST(ChatTemplate, LoadsFromTheFixtureDirectories) {
  EXPECT_EQ(ChatTemplate::load(fixture_dir("byte_fallback")).render(kChat, true),
            "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
  EXPECT_EQ(ChatTemplate::load(fixture_dir("byte_level")).render({{"user", "x"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(Jinja, TrimBlocksAndLstripBlocksAsTransformersRendersThem) {
  const std::string src =
      "{% for m in messages %}\n"
      "  {% if m.role == 'user' %}\n"
      "U{{ loop.index }}: {{ m.content }}\n"
      "  {% endif %}\n"
      "{% endfor %}\n";
  EXPECT_EQ(render(src, kChat), "U1: Hi\nU3: Bye\n");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c\n{#- note -#}\n d", {}), "a b cd");
}

TEST(Jinja, ExpressionsFiltersAndLoopVariables) {
  EXPECT_EQ(render("{{ messages | length }} {{ messages[-1].content | upper }} "
                   "{{ messages[1:] | map(attribute='role') | join(',') }}",
                   kChat),
            "3 BYE assistant,user");
  EXPECT_EQ(render("{% for m in messages if m.role == 'user' %}{{ loop.index0 }}{{ m.content }}"
                   "{% if not loop.last %}|{% endif %}{% endfor %}",
                   kChat),
            "0Hi|1Bye");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + "
                   "m.content|length %}{% endfor %}{{ ns.n }}",
                   kChat),
            "10");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 'a' ~ 1 ~ none }} {{ 1 if x is "
                   "defined else 2 }} {{ 'x' in 'xyz' }} {{ {'k': [1, 'v']} | tojson }}",
                   {}),
            "3 -4 1 a1None 2 True {\"k\": [1, \"v\"]}");
  EXPECT_EQ(render("{{ '  pad  '.strip() }}|{{ 'a,b'.split(',')[1] }}|{{ 'Hi'.startswith('H') }}"
                   "|{{ x | default('d') }}|{{ messages[0].get('missing', 'none') }}",
                   kChat),
            "pad|b|True|d|none");
}

TEST(Jinja, UnsupportedConstructsPointAtChatTemplateOption) {
  for (const char* src : {"{% macro f() %}x{% endmacro %}", "{{ x | wordwrap }}",
                          "{{ strftime_now('%Y') }}", "{% if x %}never closed", "{{ 'a' "}) {
    try {
      render(src, kChat);
      ADD_FAILURE() << src;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << src;
      EXPECT_EQ(e.argument(), "chat_template");
      EXPECT_NE(std::string(e.what()).find("--chat-template FILE"), std::string::npos) << e.what();
    }
  }
  try {
    ChatTemplate::load("/nonexistent");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent"), std::string::npos);
  }
}

}  // namespace
}  // namespace flashserve::tokenizer
