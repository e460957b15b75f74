// Template: parse (lexer, parser) and render (interpreter), with the
// interpreter's exceptions turned into Statuses at this boundary.
#include "msinfer/jinja/template.h"

#include <exception>
#include <utility>

#include "internal/interpreter.h"
#include "internal/lexer.h"
#include "internal/parser.h"

namespace msinfer::jinja {

struct Template::Impl {
  Body body;
};

Template::Template() = default;
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

StatusOr<Template> Template::parse(const std::string& source) {
  try {
    auto impl = std::make_shared<Impl>();
    impl->body = parse_template(lex(source));
    Template t;
    t.impl_ = std::move(impl);
    return t;
  } catch (const Error& e) {
    return invalid_argument(e.what());
  } catch (const std::exception& e) {
    return invalid_argument(e.what());
  }
}

StatusOr<std::string> Template::render(const Json& context) const {
  return render(context, RenderOptions());
}

StatusOr<std::string> Template::render(const Json& context, std::time_t now) const {
  RenderOptions o;
  o.now = now;
  return render(context, o);
}

StatusOr<std::string> Template::render(const Json& context, const RenderOptions& options) const {
  if (!impl_) return failed_precondition("template: not parsed");
  try {
    Scope globals(nullptr);
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) globals.set(k, from_json(v));
    }
    Scope top(&globals);
    Interpreter in(options.now.value_or(std::time(nullptr)),
                   Budget(options.max_steps, options.max_bytes, options.deadline));
    return in.run(impl_->body, top);
  } catch (const LimitError& e) {
    return e.deadline ? Status(StatusCode::kDeadlineExceeded, e.what())
                      : resource_exhausted(e.what());
  } catch (const Error& e) {
    return invalid_argument(e.what());
  } catch (const BreakSignal&) {
    return invalid_argument("break outside a loop");
  } catch (const ContinueSignal&) {
    return invalid_argument("continue outside a loop");
  } catch (const std::exception& e) {
    return invalid_argument(e.what());
  }
}

}  // namespace msinfer::jinja
