# The optional CUDA backend (docs/CUDA.md). MSINFER_CUDA=auto builds it when a
# CUDA toolkit is found (nvcc on PATH or in /usr/local/cuda) and no sanitizer is
# asked for; on requires it; off never builds it. The result is the boolean
# MSINFER_WITH_CUDA. The binaries link the CUDA runtime statically and cuBLAS
# dynamically; the driver is found at run time, so they start (and the GPU
# tests skip) on machines without a GPU.
string(TOLOWER "${MSINFER_CUDA}" _msinfer_cuda)
if(_msinfer_cuda MATCHES "^(on|1|true|yes)$")
  set(_msinfer_cuda on)
elseif(_msinfer_cuda MATCHES "^(off|0|false|no)$")
  set(_msinfer_cuda off)
elseif(NOT _msinfer_cuda STREQUAL "auto")
  message(FATAL_ERROR "MSINFER_CUDA must be auto, on or off, got '${MSINFER_CUDA}'")
endif()

set(MSINFER_WITH_CUDA OFF)
if(NOT _msinfer_cuda STREQUAL "off")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(_msinfer_cuda STREQUAL "auto" AND MSINFER_SANITIZE)
    message(STATUS "msinfer: CUDA backend off (sanitizer build)")
  else()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # Hopper (H100/H200) machine code, and PTX that later GPUs compile at load.
      if(NOT CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
      endif()
      enable_language(CUDA)
      # CMake 3.25 does not know nvcc 13's C++20 flag (the project is C++20).
      if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
        set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      endif()
      find_package(CUDAToolkit REQUIRED)
      set(MSINFER_WITH_CUDA ON)
      message(STATUS "msinfer: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                     "architectures ${CMAKE_CUDA_ARCHITECTURES})")
    elseif(_msinfer_cuda STREQUAL "on")
      message(FATAL_ERROR "MSINFER_CUDA=on but no CUDA compiler was found")
    else()
      message(STATUS "msinfer: CUDA backend off (no CUDA toolkit found)")
    endif()
  endif()
endif()
