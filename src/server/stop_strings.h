// Stop strings over streamed text. Text arrives in pieces; what may still turn out to be the start
// of a stop string is held back, so a client never receives text that a later piece shows to be
// part of a stop sequence (the stop sequence itself is not returned, as in OpenAI's API, unless
// `include` asks for it, vLLM's include_stop_str_in_output: the text then ends with it).
#pragma once

#include <string>
#include <vector>

namespace flashserve::server {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops, bool include = false)
      : stops_(std::move(stops)), include_(include) {}

  // Appends `piece`; returns the text that is now safe to send. After a stop string is found,
  // stopped() is true and everything from it on is dropped.
  std::string feed(const std::string& piece);
  // The held-back text, at the end of generation (no stop string came).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_ = false;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace flashserve::server
