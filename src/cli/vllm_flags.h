// What `flashserve serve` takes from vLLM's command line beyond flags of the same name and
// meaning (those are declared in serve.cc): the vLLM flags it refuses, each with why, and the
// values vLLM writes its own way (--chat-template as a file or inline, --allowed-origins as a
// JSON list, --api-key several keys or VLLM_API_KEY), so that `vllm serve MODEL ...` lines run
// unchanged where they mean something here and stop with a clear message where they do not.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace flashserve::cli {

// Why flashserve serve refuses vLLM's flag `name` ("--quantization"), or nullopt when it is no
// vLLM flag that flashserve refuses (one it implements, or none of vLLM's).
std::optional<std::string> refused_vllm_flag(const std::string& name);

// Throws UsageError naming the first of argv's flags ("--x" or "--x=v") that is a refused vLLM
// flag, before CLI11's parse would call it merely "not expected".
void refuse_vllm_flags(int argc, char** argv);

// --chat-template as vLLM reads it: the text of the file it names, or, when no such file can be
// read and it has a character only a template has ('{', '}' or a newline), the template itself.
// Throws UsageError("--chat-template") for a path that cannot be read.
std::string chat_template_source(const std::string& value);

// --allowed-origins values: each a JSON list of origins (vLLM's form, '["https://a.example"]')
// or one origin; "*" allows any. Throws UsageError for malformed JSON, a non-string element or
// an empty origin.
std::vector<std::string> allowed_origins(const std::vector<std::string>& values);

// The API keys: --api-key's values, else VLLM_API_KEY's (`env`, null when unset), as vLLM
// takes them. Throws UsageError for an empty key (say --api-key "$KEY" with KEY unset: the
// server would run without authentication).
std::vector<std::string> api_keys(const std::vector<std::string>& given, const char* env);

// --dtype: the runner's element type for `device` when `dtype` names it (auto always does),
// else a UsageError saying what the device computes in.
void check_dtype(const std::string& dtype, const std::string& device);

}  // namespace flashserve::cli
