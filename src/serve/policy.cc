#include "serve/policy.h"

#include <iterator>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {

struct PolicyInfo {
  Policy policy;
  const char* name;
  const char* alias;  // nullptr: none
  PolicyDefaults defaults;
};

// Why each default:
// - sarathi: budget 512, the budget Sarathi-Serve's paper runs Mistral-7B at on one GPU; 256
//   running requests (the budget must stay >= max_running so no decode is ever skipped).
// - vllm-v1: max_num_batched_tokens 8192 and max_num_seqs 1024, what vLLM's API server picks on a
//   GPU of >= 70 GiB that is not an A100 (H100/H200; an A100 gets 2048 and 256).
// - vllm-v0: vLLM v0's max_num_seqs 256; its budget is raised to max_model_len (whole prompts), as
//   vLLM v0 set max_num_batched_tokens without chunked prefill.
// - orca and static: Sarathi-Serve's max_num_seqs 128 for both baselines; no token cap.
constexpr PolicyInfo kPolicies[] = {
    {Policy::kSarathi, "sarathi", nullptr, {512, 256}},
    {Policy::kVllmV1, "vllm-v1", nullptr, {8192, 1024}},
    {Policy::kVllmV0, "vllm-v0", "vllm", {512, 256}},
    {Policy::kOrca, "orca", nullptr, {512, 128}},
    {Policy::kStatic, "static", nullptr, {512, 128}},
};

const PolicyInfo& info(Policy p) {
  for (const PolicyInfo& i : kPolicies)
    if (i.policy == p) return i;
  throw Error(ErrorKind::kInternal, "policy",
              "no entry for policy " + std::to_string(static_cast<int32_t>(p)));
}

}  // namespace

const char* to_string(Policy p) {
  return info(p).name;
}

std::vector<Policy> all_policies() {
  std::vector<Policy> out;
  for (const PolicyInfo& i : kPolicies) out.push_back(i.policy);
  return out;
}

std::string policy_names() {
  std::string s;
  const size_t n = std::size(kPolicies);
  for (size_t k = 0; k < n; ++k) {
    if (k > 0) s += k + 1 == n ? " or " : ", ";
    s += kPolicies[k].name;
    if (kPolicies[k].alias) s += std::string(" (alias ") + kPolicies[k].alias + ")";
  }
  return s;
}

Policy parse_policy(const std::string& name) {
  for (const PolicyInfo& i : kPolicies)
    if (name == i.name || (i.alias && name == i.alias)) return i.policy;
  throw Error(ErrorKind::kInvalidArgument, "policy",
              "'" + name + "' is not one of " + policy_names());
}

PolicyDefaults policy_defaults(Policy p) {
  return info(p).defaults;
}

}  // namespace flashserve::serve
