# Builds the CUDA backend before the top-level CMakeLists.txt includes it (until the lead adds the two lines):
#   cmake -S . -B build-cuda -DPLUMB_CUDA=ON -DCMAKE_PROJECT_INCLUDE=$PWD/bench/cuda_defer.cmake
# Runs cmake/PlumbCuda.cmake and tests/cuda/CMakeLists.txt at the end of the top-level directory, where
# plumb_core exists. Once the top-level files include them, this file is not needed.
if(NOT CMAKE_SOURCE_DIR STREQUAL CMAKE_CURRENT_SOURCE_DIR)
  return()
endif()
if(PLUMB_CUDA)  # languages cannot be enabled in deferred calls
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
  endif()
  enable_language(CUDA)
endif()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL include ${CMAKE_SOURCE_DIR}/cmake/PlumbCuda.cmake)
if(PLUMB_TESTS)
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL include ${CMAKE_SOURCE_DIR}/tests/cuda/CMakeLists.txt)
endif()
