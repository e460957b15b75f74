# ccache where it is installed (scripts/setup installs it): a rebuild of
# unchanged sources, in this checkout or another clone on the same machine (CI),
# is a cache hit. Paths under the source tree are hashed relative to it
# (CCACHE_BASEDIR, CCACHE_NOHASHDIR), so clones in other directories share.
# Included by the main project and by the fuzzers' sub-build
# (fuzz/CMakeLists.txt), each setting MSINFER_ROOT to the checkout's root.
option(MSINFER_CCACHE "Compile C and C++ through ccache when it is installed" ON)
if(MSINFER_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(MSINFER_CCACHE_PROGRAM ccache)
  if(MSINFER_CCACHE_PROGRAM)
    set(_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${MSINFER_ROOT}
        CCACHE_NOHASHDIR=1 ${MSINFER_CCACHE_PROGRAM})
    set(CMAKE_C_COMPILER_LAUNCHER ${_launcher})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  endif()
endif()
