#include "msinfer/core/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace msinfer {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("MSINFER_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string v(env);
  if (v == "debug") return LogLevel::kDebug;
  if (v == "warning") return LogLevel::kWarning;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& threshold() {
  static std::atomic<int> t{static_cast<int>(level_from_env())};
  return t;
}

const char* level_letter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
    case LogLevel::kFatal: return "F";
  }
  return "?";
}

}  // namespace

LogLevel log_threshold() { return static_cast<LogLevel>(threshold().load()); }
void set_log_threshold(LogLevel level) { threshold().store(static_cast<int>(level)); }

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = std::strrchr(file, '/');
  stream_ << level_letter(level) << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << "\n";
  std::string s = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace msinfer
