// HTTP/1.1 as the server writes it: status lines and headers by hand (one
// string per response, no serializer), the chunked transfer coding and
// server-sent events (docs/SERVING.md). Pure functions; any thread.
#pragma once

#include <cstddef>
#include <string>

#include "msinfer/core/json.h"
#include "msinfer/server/api.h"

namespace msinfer::server {

// The reason phrase of the statuses the server sends ("Unknown" for others).
const char* reason_phrase(int status);
// JSON text as the server sends it: compact, invalid UTF-8 replaced.
std::string dump(const Json& j);
// One chunk of the chunked transfer coding: hex length, CRLF, payload, CRLF.
std::string chunk(const std::string& payload);
// The chunk that ends a chunked body.
inline constexpr const char* kLastChunk = "0\r\n\r\n";
// One server-sent event carrying j: "data: <json>" and a blank line.
std::string sse(const Json& j);
// The event that ends an OpenAI stream.
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
// The interim answer to "Expect: 100-continue".
inline constexpr const char* kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
// An API error with this status, type and message (no param).
ApiError error_of(int status, std::string type, std::string message);
// A response's status line and headers, through the blank line:
// Content-Type, Content-Length, extra_headers (each ending in CRLF), then
// Connection: keep-alive or close.
std::string response_head(int status, const std::string& content_type, size_t content_length,
                          const std::string& extra_headers, bool keep_alive);
// The head of a 200 text/event-stream response in the chunked coding.
std::string event_stream_head(bool keep_alive);

}  // namespace msinfer::server
