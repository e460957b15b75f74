// libFuzzer target for the server's untrusted inputs: OpenAI request bodies
// (parse_request) and chat templates (parse and render). Built and run by
// fuzz/run-server; a short run is part of the test suite.
#include <cstddef>
#include <cstdint>
#include <string>

#include "msinfer/server/api.h"
#include "msinfer/server/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace msinfer::server;
  if (data[0] % 2 == 0) {
    ApiContext ctx;
    ctx.served_model_name = "m";
    ctx.vocab = 1000;
    ctx.max_model_len = 4096;
    ApiRequest r;
    auto err = parse_request(in, data[0] % 4 == 2, ctx, &r);
    if (!err) {
      // Accepted: the limits hold.
      if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens > 4096)
        __builtin_trap();
      for (int32_t t : r.prompt) {
        if (t < 0 || t >= 1000) __builtin_trap();
      }
    } else {
      (void)err->body().dump();
    }
    return 0;
  }
  auto t = ChatTemplate::parse(in);
  if (!t.ok()) return 0;
  msinfer::Json ctx{{"messages", msinfer::Json::array({{{"role", "system"}, {"content", "s"}},
                                                       {{"role", "user"}, {"content", "u"}}})},
                    {"bos_token", "<s>"},
                    {"eos_token", "</s>"},
                    {"add_generation_prompt", true}};
  (void)t->render(ctx);
  return 0;
}
