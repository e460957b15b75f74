#include "internal/http_wire.h"

#include <cstdio>
#include <utility>

namespace msinfer::server {

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string dump(const Json& j) {
  // Random models may emit half a character: never let that break the JSON.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string chunk(const std::string& payload) {
  char len[32];
  std::snprintf(len, sizeof(len), "%zx\r\n", payload.size());
  return len + payload + "\r\n";
}

std::string sse(const Json& j) { return "data: " + dump(j) + "\n\n"; }

ApiError error_of(int status, std::string type, std::string message) {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  return e;
}

std::string response_head(int status, const std::string& content_type, size_t content_length,
                          const std::string& extra_headers, bool keep_alive) {
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  r += "Content-Type: " + content_type + "\r\n";
  r += "Content-Length: " + std::to_string(content_length) + "\r\n";
  r += extra_headers;
  r += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return r;
}

std::string event_stream_head(bool keep_alive) {
  std::string h =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
      "Transfer-Encoding: chunked\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

}  // namespace msinfer::server
