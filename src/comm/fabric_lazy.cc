// libfabric, loaded on the first call rather than when a binary starts.
// Debian's libfabric.so.1 links the PSM providers' libinfinipath, whose
// constructor calibrates a clock with ~600 short sleeps: ~0.25 s of wall time
// at the start of every msinfer process here, although only the libfabric
// transports (--fabric-provider shm, tcp, verbs, efa) use the library. The
// five functions libfabric exports and msinfer calls (everything else in its
// API is an inline call through the objects these return) are defined here
// with the headers' declarations (a signature that differs does not compile)
// and resolve the real ones with dlsym once; dlsym takes each symbol's default
// version, as linking did. A library that cannot be loaded makes fi_getinfo
// and fi_fabric return -FI_ENOSYS and fi_dupinfo return null, and
// fabric_load_error() says why.
#include "fabric_lazy.h"

#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <mutex>

namespace msinfer::comm {
namespace {

std::once_flag g_once;
void* g_handle = nullptr;
std::string g_error;

void* library() {
  std::call_once(g_once, [] {
    g_handle = ::dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (g_handle == nullptr) g_error = std::string("cannot load libfabric.so.1: ") + ::dlerror();
  });
  return g_handle;
}

template <typename Fn>
Fn resolve(const char* name) {
  void* h = library();
  return h == nullptr ? nullptr : reinterpret_cast<Fn>(::dlsym(h, name));
}

}  // namespace

std::string fabric_load_error() {
  library();
  return g_error;
}

}  // namespace msinfer::comm

using msinfer::comm::resolve;

extern "C" int fi_getinfo(uint32_t version, const char* node, const char* service, uint64_t flags,
                          const struct fi_info* hints, struct fi_info** info) {
  static const auto fn = resolve<decltype(&fi_getinfo)>("fi_getinfo");
  return fn != nullptr ? fn(version, node, service, flags, hints, info) : -FI_ENOSYS;
}

extern "C" void fi_freeinfo(struct fi_info* info) {
  static const auto fn = resolve<decltype(&fi_freeinfo)>("fi_freeinfo");
  if (fn != nullptr) fn(info);
}

extern "C" struct fi_info* fi_dupinfo(const struct fi_info* info) {
  static const auto fn = resolve<decltype(&fi_dupinfo)>("fi_dupinfo");
  return fn != nullptr ? fn(info) : nullptr;
}

extern "C" int fi_fabric(struct fi_fabric_attr* attr, struct fid_fabric** fabric, void* context) {
  static const auto fn = resolve<decltype(&fi_fabric)>("fi_fabric");
  return fn != nullptr ? fn(attr, fabric, context) : -FI_ENOSYS;
}

extern "C" const char* fi_strerror(int errnum) {
  static const auto fn = resolve<decltype(&fi_strerror)>("fi_strerror");
  return fn != nullptr ? fn(errnum) : "libfabric is not loaded";
}
