// cuBLAS and cuBLASLt, loaded on the first call rather than when a binary
// starts. The toolkit's libcublasLt.so alone is 540 MB: the dynamic loader
// mapped and relocated it (and libcublas) at the start of every msinfer
// process, ~0.9 s of wall time and ~0.5 s of CPU here, for the help text, a
// CPU-only worker or a machine without a GPU alike. The functions below are
// the ones the backend calls (blas.cc), with the headers' own declarations
// (a signature that differs does not compile); each resolves its symbol with
// dlsym once. The libraries are looked up as the loader would (LD_LIBRARY_PATH,
// the cache), then in the toolkit's directory the build used. A library that
// cannot be loaded makes every call return CUBLAS_STATUS_NOT_INITIALIZED, and
// says why on stderr once.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <cstdio>
#include <mutex>
#include <string>

namespace {

// "libcublas.so.13" or "libcublasLt.so.13": the handle, opened once.
void* open_library(const std::string& soname) {
  void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const std::string first = ::dlerror();
    h = ::dlopen((std::string(MSINFER_CUDA_LIBRARY_DIR) + "/" + soname).c_str(),
                 RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      std::fprintf(stderr, "msinfer: cannot load %s (%s; %s): the CUDA backend's GEMMs fail\n",
                   soname.c_str(), first.c_str(), ::dlerror());
    }
  }
  return h;
}

enum class Lib { kBlas, kLt };

void* library(Lib lib) {
  static std::once_flag once;
  static void* lt = nullptr;
  static void* blas = nullptr;
  std::call_once(once, [] {
    const std::string major = std::to_string(CUBLAS_VER_MAJOR);
    // cuBLASLt first: libcublas needs it, and finds it loaded.
    lt = open_library("libcublasLt.so." + major);
    blas = open_library("libcublas.so." + major);
  });
  return lib == Lib::kLt ? lt : blas;
}

void* resolve(Lib lib, const char* name) {
  void* h = library(lib);
  if (h == nullptr) return nullptr;
  void* f = ::dlsym(h, name);
  if (f == nullptr) std::fprintf(stderr, "msinfer: cuBLAS has no %s: %s\n", name, ::dlerror());
  return f;
}

}  // namespace

// `params` is the parameter list as the header declares it, `args` the names.
#define MSI_CUBLAS_LAZY(lib, name, params, args)                                           \
  extern "C" cublasStatus_t CUBLASWINAPI name params {                                     \
    using Fn = cublasStatus_t(CUBLASWINAPI*) params;                                       \
    static const Fn fn = reinterpret_cast<Fn>(resolve(lib, #name));                        \
    return fn != nullptr ? fn args : CUBLAS_STATUS_NOT_INITIALIZED;                         \
  }

MSI_CUBLAS_LAZY(Lib::kBlas, cublasCreate_v2, (cublasHandle_t * handle), (handle))
MSI_CUBLAS_LAZY(Lib::kBlas, cublasDestroy_v2, (cublasHandle_t handle), (handle))
MSI_CUBLAS_LAZY(Lib::kBlas, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream),
                (handle, stream))
MSI_CUBLAS_LAZY(Lib::kBlas, cublasGemmEx,
                (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                 int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                 const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                 cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                 cublasGemmAlgo_t algo),
                (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
                 Ctype, ldc, computeType, algo))
MSI_CUBLAS_LAZY(Lib::kBlas, cublasGemmGroupedBatchedEx,
                (cublasHandle_t handle, const cublasOperation_t transa_array[],
                 const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
                 const int k_array[], const void* alpha_array, const void* const Aarray[],
                 cudaDataType_t Atype, const int lda_array[], const void* const Barray[],
                 cudaDataType_t Btype, const int ldb_array[], const void* beta_array,
                 void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
                 int group_count, const int group_size[], cublasComputeType_t computeType),
                (handle, transa_array, transb_array, m_array, n_array, k_array, alpha_array,
                 Aarray, Atype, lda_array, Barray, Btype, ldb_array, beta_array, Carray, Ctype,
                 ldc_array, group_count, group_size, computeType))

MSI_CUBLAS_LAZY(Lib::kLt, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmul,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                 const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                 cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                 cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                 const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream),
                (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                 workspace, workspace_bytes, stream))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmulAlgoGetHeuristic,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                 cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
                 cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t preference,
                 int requested, cublasLtMatmulHeuristicResult_t results[], int* returned),
                (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requested, results,
                 returned))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmulDescCreate,
                (cublasLtMatmulDesc_t * desc, cublasComputeType_t computeType,
                 cudaDataType_t scaleType),
                (desc, computeType, scaleType))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmulDescSetAttribute,
                (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                 size_t size),
                (desc, attr, buf, size))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref),
                (pref))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref),
                (pref))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatmulPreferenceSetAttribute,
                (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                 const void* buf, size_t size),
                (pref, attr, buf, size))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatrixLayoutCreate,
                (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols,
                 int64_t ld),
                (layout, type, rows, cols, ld))
MSI_CUBLAS_LAZY(Lib::kLt, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
