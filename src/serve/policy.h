// The scheduling policies by name, and each one's defaults: the one table the CLI and the engine
// read a policy's name, aliases, token budget and max_num_seqs from.
//
//   sarathi   stall-free chunked prefill (Sarathi-Serve): every decode first, then chunks under
//             the token budget.
//   vllm-v1   today's vLLM scheduler: the running requests in admission order, then new ones,
//             under one token budget (max_num_batched_tokens), blocks allocated chunk by chunk.
//   vllm-v0   vLLM v0's prefill-first scheduler (Sarathi-Serve's vLLM baseline). Also "vllm", the
//             name it had before vllm-v1 existed.
//   orca      iteration-level, memory-bound as Sarathi-Serve's Orca: max_model_len of KV reserved
//             per request, no watermark.
//   static    request-level (FasterTransformer-style): a new batch only once the last has drained.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashserve::serve {

enum class Policy : int32_t { kSarathi, kVllmV1, kVllmV0, kOrca, kStatic };

// The canonical name ("vllm-v0", never the alias), as the CLI and the metrics print it.
const char* to_string(Policy p);
// A canonical name or an alias; throws Error(kInvalidArgument) naming "policy" otherwise.
Policy parse_policy(const std::string& name);
std::vector<Policy> all_policies();
// "sarathi, vllm-v1, vllm-v0 (alias vllm), orca or static": for help texts and errors.
std::string policy_names();

// What a policy runs with when the user does not say otherwise.
struct PolicyDefaults {
  // SchedulerConfig::max_tokens_per_step: the token budget of the chunking policies; for vllm-v0
  // the cap on a step's prompt tokens (raised to max_model_len where it is below); orca and static
  // have no token cap.
  int64_t max_tokens_per_step;
  // SchedulerConfig::max_running (vLLM's max_num_seqs): requests admitted at once.
  int64_t max_running;
};
PolicyDefaults policy_defaults(Policy p);

}  // namespace flashserve::serve
