// The chat side of chat templates: the template's source and special tokens
// from a model directory, and the Jinja template (msinfer/jinja) under the
// name of the chat template in its errors.
#include "msinfer/server/chat_template.h"

#include <fstream>
#include <iterator>
#include <utility>

namespace msinfer::server {

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

StatusOr<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  StatusOr<jinja::Template> t = jinja::Template::parse(source);
  if (!t.ok()) return invalid_argument("chat template: " + t.status().message());
  ChatTemplate c;
  c.template_ = std::move(t).value();
  return c;
}

StatusOr<std::string> ChatTemplate::render(const Json& context) const {
  return render(context, jinja::RenderOptions());
}

StatusOr<std::string> ChatTemplate::render(const Json& context, std::time_t now) const {
  jinja::RenderOptions o;
  o.now = now;
  return render(context, o);
}

StatusOr<std::string> ChatTemplate::render(const Json& context,
                                           const jinja::RenderOptions& options) const {
  if (!template_.parsed()) return failed_precondition("chat template: not parsed");
  return template_.render(context, options);
}

namespace {
std::string token_text(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}
}  // namespace

StatusOr<ChatTemplateConfig> read_chat_template_config(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  MSI_ASSIGN_OR_RETURN(Json j, read_json_file(path));
  ChatTemplateConfig c;
  if (j.contains("bos_token")) c.bos_token = token_text(j["bos_token"]);
  if (j.contains("eos_token")) c.eos_token = token_text(j["eos_token"]);
  // A chat_template.jinja beside it wins, as transformers loads it (the
  // published gpt-oss directories keep their template there).
  const std::string file = model_dir + "/chat_template.jinja";
  if (std::ifstream f(file); f.good()) {
    c.source.assign(std::istreambuf_iterator<char>(f), {});
    if (f.bad()) return not_found(file + ": cannot be read");
    return c;
  }
  if (!j.contains("chat_template") || j["chat_template"].is_null()) {
    return not_found(path + ": no chat_template");
  }
  const Json& t = j["chat_template"];
  if (t.is_string()) {
    c.source = t.get<std::string>();
  } else if (t.is_array()) {
    for (const auto& e : t) {
      if (e.is_object() && e.contains("name") && e["name"] == "default" &&
          e.contains("template") && e["template"].is_string()) {
        c.source = e["template"].get<std::string>();
      }
    }
    if (c.source.empty()) return invalid_argument(path + ": chat_template has no 'default' entry");
  } else {
    return invalid_argument(path + ": chat_template must be a string or a list");
  }
  return c;
}

}  // namespace msinfer::server
