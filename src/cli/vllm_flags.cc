#include "cli/vllm_flags.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "cli/options.h"

namespace flashserve::cli {

namespace {

// vLLM's serve flags that flashserve does not implement, with what a user needs to know instead.
// (Flags it implements are serve.cc's; anything else is CLI11's "not expected".)
const std::map<std::string, std::string, std::less<>>& refused() {
  static const std::map<std::string, std::string, std::less<>> table = {
      {"--tokenizer", "the tokenizer is the model directory's tokenizer.json"},
      {"--tokenizer-mode", "the tokenizer is the model directory's tokenizer.json"},
      {"--revision", "the model is a local directory (no Hugging Face Hub downloads)"},
      {"--tokenizer-revision", "the model is a local directory (no Hugging Face Hub downloads)"},
      {"--code-revision", "the model is a local directory (no Hugging Face Hub downloads)"},
      {"--download-dir", "the model is a local directory (no Hugging Face Hub downloads)"},
      {"--load-format", "weights are read from safetensors only"},
      {"--config-format", "the configuration is the model directory's config.json"},
      {"--hf-overrides", "the configuration is the model directory's config.json"},
      {"--rope-scaling", "RoPE scaling comes from config.json"},
      {"--generation-config",
       "request defaults are OpenAI's, not generation_config.json's (send them per request)"},
      {"--override-generation-config",
       "request defaults are OpenAI's, not generation_config.json's (send them per request)"},
      {"--seed", "each request seeds its own sampling (its `seed` field; else a fresh seed)"},
      {"--quantization", "weights run in the checkpoint's precision (no quantization)"},
      {"--calculate-kv-scales",
       "the fp8 KV cache's scales are static, 1.0 per head (vLLM's default without calibrated "
       "scales)"},
      {"--block-size", "the paged-KV block size is fixed (16 tokens)"},
      {"--swap-space", "preempted requests recompute; nothing is swapped to the CPU"},
      {"--cpu-offload-gb", "weights stay on the device"},
      {"--num-gpu-blocks-override", "the KV pool is sized by --gpu-memory-utilization"},
      {"--enforce-eager", "decode steps always use CUDA graphs"},
      {"--max-seq-len-to-capture", "decode steps always use CUDA graphs"},
      {"--max-logprobs", "the limit is OpenAI's (top_logprobs 20, logprobs 5)"},
      {"--pipeline-parallel-size", "one device per server (no pipeline parallelism)"},
      {"--data-parallel-size", "one device per server (run one server per device)"},
      {"--distributed-executor-backend", "one device per server"},
      {"--disable-custom-all-reduce", "one device per server"},
      {"--worker-cls", "one device per server"},
      {"--disable-sliding-window", "sliding windows come from config.json"},
      {"--enable-lora", "no LoRA adapters"},
      {"--lora-modules", "no LoRA adapters"},
      {"--max-loras", "no LoRA adapters"},
      {"--max-lora-rank", "no LoRA adapters"},
      {"--speculative-config", "no speculative decoding"},
      {"--enable-auto-tool-choice", "no tool calling yet"},
      {"--tool-call-parser", "no tool calling yet"},
      {"--reasoning-parser", "no reasoning parser"},
      {"--guided-decoding-backend",
       "structured output has one backend, flashserve's own (response_format)"},
      {"--scheduling-policy", "requests are served first come, first served"},
      {"--max-num-partial-prefills", "use --policy vllm-v1 semantics through flashserve simulate"},
      {"--long-prefill-token-threshold", "serve has no vllm-v1 long-prefill cap"},
      {"--preemption-mode", "preempted requests always recompute"},
      {"--num-scheduler-steps", "one scheduler step per forward"},
      {"--limit-mm-per-prompt", "text-only models"},
      {"--mm-processor-kwargs", "text-only models"},
      {"--ssl-keyfile", "plain HTTP only; put a TLS proxy in front"},
      {"--ssl-certfile", "plain HTTP only; put a TLS proxy in front"},
      {"--ssl-ca-certs", "plain HTTP only; put a TLS proxy in front"},
      {"--root-path", "routes are served at /"},
      {"--middleware", "no Python middleware"},
      {"--uds", "TCP only (--host, --port)"},
      {"--uvicorn-log-level", "there is no uvicorn"},
      {"--response-role", "the assistant's role is always \"assistant\""},
      {"--return-tokens-as-token-ids", "logprobs name tokens by their text"},
      {"--chat-template-content-format", "message content is text or text parts"},
      {"--allowed-methods", "CORS allows GET, POST and OPTIONS (with --allowed-origins)"},
      {"--allowed-headers", "CORS allows Authorization and Content-Type (with --allowed-origins)"},
      {"--allow-credentials", "CORS never allows credentials"},
      {"--task", "text generation only"},
      {"--enable-sleep-mode", "no sleep mode"},
  };
  return table;
}

std::string read_all(std::ifstream& in) {
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::optional<std::string> refused_vllm_flag(const std::string& name) {
  const auto it = refused().find(name);
  if (it == refused().end()) return std::nullopt;
  return it->second;
}

void refuse_vllm_flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return;  // the rest are positional
    if (!arg.starts_with("--")) continue;
    const std::string name(arg.substr(0, arg.find('=')));
    if (const auto why = refused_vllm_flag(name))
      throw UsageError(name, "vLLM's flag is not supported by flashserve serve: " + *why);
  }
}

std::string chat_template_source(const std::string& value) {
  if (std::ifstream file(value); file) return read_all(file);
  if (value.find_first_of("{}\n") != std::string::npos) return value;
  throw UsageError(
      "--chat-template",
      "cannot read '" + value + "' (a file path; an inline template has '{', '}' or a newline)");
}

std::vector<std::string> allowed_origins(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    if (v.starts_with("[")) {
      const nlohmann::json list = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
      if (list.is_discarded() || !list.is_array())
        throw UsageError("--allowed-origins", "'" + v + "' is not a JSON list of origins");
      for (const nlohmann::json& o : list) {
        if (!o.is_string())
          throw UsageError("--allowed-origins", o.dump() + " in '" + v + "' is not a string");
        out.push_back(o.get<std::string>());
      }
    } else {
      out.push_back(v);
    }
  }
  for (const std::string& o : out)
    if (o.empty()) throw UsageError("--allowed-origins", "an empty origin");
  return out;
}

std::vector<std::string> api_keys(const std::vector<std::string>& given, const char* env) {
  std::vector<std::string> keys = given;
  const char* from = "--api-key";
  if (keys.empty() && env != nullptr) {
    keys.push_back(env);
    from = "VLLM_API_KEY";
  }
  for (const std::string& k : keys)
    if (k.empty())
      throw UsageError(from,
                       "is empty, which would serve without authentication; leave it out for "
                       "that");
  return keys;
}

void check_dtype(const std::string& dtype, const std::string& device) {
  static const std::map<std::string, std::string, std::less<>> names = {
      {"auto", ""},        {"bfloat16", "bfloat16"}, {"float16", "float16"},
      {"half", "float16"}, {"float32", "float32"},   {"float", "float32"}};
  const auto it = names.find(dtype);
  if (it == names.end())
    throw UsageError("--dtype",
                     "'" + dtype + "' is not one of auto, bfloat16, float16, half, float32, float");
  // The runners compute in one type each: the CUDA runner in bfloat16, the CPU runner in float32
  // (checkpoints of either type are converted on load).
  const std::string runs = device == "cuda" ? "bfloat16" : "float32";
  if (!it->second.empty() && it->second != runs)
    throw UsageError("--dtype", "'" + dtype + "': the " + device + " runner computes in " + runs +
                                    " (give --dtype auto or " + runs + ")");
}

}  // namespace flashserve::cli
