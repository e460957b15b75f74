// Logging to stderr and MSI_CHECK for broken invariants (programmer errors).
// MSI_CHECK aborts; it is never used on user input (files, flags, network bytes).
// Thread-safe: each message is formatted in a buffer and written with one call.
// The level comes from MSINFER_LOG_LEVEL (debug|info|warning|error; default info).
#pragma once

#include <sstream>

namespace msinfer {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

LogLevel log_threshold();
void set_log_threshold(LogLevel level);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when a log level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace msinfer

#define MSI_LOG_LEVEL_DEBUG ::msinfer::LogLevel::kDebug
#define MSI_LOG_LEVEL_INFO ::msinfer::LogLevel::kInfo
#define MSI_LOG_LEVEL_WARNING ::msinfer::LogLevel::kWarning
#define MSI_LOG_LEVEL_ERROR ::msinfer::LogLevel::kError

#define MSI_LOG(level)                                           \
  (MSI_LOG_LEVEL_##level < ::msinfer::log_threshold())           \
      ? (void)0                                                  \
      : ::msinfer::internal::LogVoidify() &                      \
            ::msinfer::internal::LogMessage(MSI_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define MSI_CHECK(cond)                                                                  \
  (cond) ? (void)0                                                                       \
         : ::msinfer::internal::LogVoidify() &                                           \
               ::msinfer::internal::LogMessage(::msinfer::LogLevel::kFatal, __FILE__, __LINE__) \
                       .stream()                                                         \
                   << "Check failed: " #cond " "
