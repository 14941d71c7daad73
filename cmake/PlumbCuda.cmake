# The CUDA backend (issue 6): built only with -DPLUMB_CUDA=ON (CUDA 13, sm_90a). Included from the top-level
# CMakeLists.txt after the plumb_core and plumb targets exist; without PLUMB_CUDA it does nothing, and the build
# needs no CUDA at all (src/cuda/stub.cpp answers "built without CUDA").
#
# plumb_cuda holds the .cu translation units (kernels, launches, device runtime); the host side (src/cuda/*.cpp)
# is compiled into plumb_core like every other source and switched on by PLUMB_WITH_CUDA.
if(NOT PLUMB_CUDA)
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # The -gencode below names the target. (The -arch=sm_90a shorthand also runs a plain sm_90 pass that rejects
  # sm_90a-only instructions on nvcc 13.0.)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()
get_property(plumb_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
if(NOT "CUDA" IN_LIST plumb_langs)
  enable_language(CUDA)
endif()
find_package(CUDAToolkit 13 REQUIRED)

file(GLOB PLUMB_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/cuda/*.cu)
add_library(plumb_cuda STATIC ${PLUMB_CUDA_SOURCES})
# One translation unit per .cu file (no unity groups): the kernels' files are the build's longest, compiled side by side.
set_target_properties(plumb_cuda PROPERTIES UNITY_BUILD OFF)
# The directory's compile options are GCC's (-Wall ..., sanitizers); nvcc takes its own.
set_property(TARGET plumb_cuda PROPERTY COMPILE_OPTIONS "")
# --default-stream per-thread: a null stream in plumb means the calling thread's default stream, which (unlike the
# legacy one) can be captured into a CUDA graph (the decode graph, src/cuda/gpu_graph.cpp) and still synchronizes
# with the legacy stream that other code may use.
target_compile_options(plumb_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a -lineinfo --default-stream per-thread
  -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
# PLUMB_CUDA_CHECK_ONLY (scripts/test.sh sets it where no GPU is visible, as in CI): every kernel still goes through
# nvcc, NVVM and ptxas for sm_90a, with the device optimizers low (NVVM -O1, ptxas -O0): plumb_cuda's compile falls
# from ~280 to ~160 CPU-seconds (gemv.cu 59 -> 29 s, fwd_hc.cu 50 -> 25; the rest is nvcc's host pass), and no kernel
# runs there. Such kernels are correct but slow: `plumb bench` says so. Host code keeps the build type's flags.
option(PLUMB_CUDA_CHECK_ONLY "Compile the CUDA kernels without device optimization (machines without a GPU)" OFF)
set(PLUMB_CUDA_DEVICE_OPT "")
if(PLUMB_CUDA_CHECK_ONLY)
  set(PLUMB_CUDA_DEVICE_OPT "SHELL:-Xcicc -O1" "SHELL:-Xptxas -O0")  # (SHELL: keeps each pair whole)
  target_compile_options(plumb_cuda PRIVATE ${PLUMB_CUDA_DEVICE_OPT})
  target_compile_definitions(plumb_cuda PRIVATE PLUMB_CUDA_CHECK_ONLY=1)
  message(STATUS "plumb: PLUMB_CUDA_CHECK_ONLY: kernels compiled without device optimization (for checking; slow on a GPU)")
endif()
# The .cu files are C++17 (CMake 3.25 has no C++20 flag for nvcc); they include no plumb header but kernels.h.
set_target_properties(plumb_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Static
                                            POSITION_INDEPENDENT_CODE ON)
target_include_directories(plumb_cuda PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(plumb_cuda PUBLIC CUDA::cudart_static)

target_compile_definitions(plumb_core PUBLIC PLUMB_WITH_CUDA=1)
target_link_libraries(plumb_core PUBLIC plumb_cuda)

# cuBLASLt (dense bf16 GEMMs; the bench's bf16 tensor-core rate): optional. A toolkit without it (or
# -DPLUMB_CUBLASLT=OFF) builds without it, and `plumb bench` says the rate was not measured.
option(PLUMB_CUBLASLT "Use cuBLASLt when the CUDA toolkit has it" ON)
if(PLUMB_CUBLASLT AND TARGET CUDA::cublasLt)
  # Loaded on first use (src/cuda/blas.cpp: dlopen), not linked: linked, its 540 MB library and the kernels it
  # registers at load made every start of a CUDA build ~80 ms slower and ~200 MB larger, GPU or not. The header
  # comes from the toolkit; the toolkit's library folder is the fallback after the loader's own search.
  target_include_directories(plumb_core SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(plumb_core PUBLIC ${CMAKE_DL_LIBS})
  target_compile_definitions(plumb_core PUBLIC PLUMB_WITH_CUBLASLT=1)
  target_compile_definitions(plumb_core PRIVATE PLUMB_CUBLASLT_DIR="${CUDAToolkit_LIBRARY_DIR}")
  message(STATUS "plumb: cuBLASLt ON")
else()
  message(STATUS "plumb: cuBLASLt OFF (not found or disabled): bf16 GEMMs and the bench's GEMM rate unavailable")
endif()
message(STATUS "plumb: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_90a)")

# The standalone device probes (bench/*_probe.cu: each answers one question about the GPU, run by hand on the GPU
# machine, see its header): built with the backend, so that CI, which has nvcc, keeps them compiling.
file(GLOB PLUMB_CUDA_PROBES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/*_probe.cu)
foreach(probe ${PLUMB_CUDA_PROBES})
  get_filename_component(probe_name ${probe} NAME_WE)
  add_executable(${probe_name} ${probe})
  set_property(TARGET ${probe_name} PROPERTY COMPILE_OPTIONS "")
  target_compile_options(${probe_name} PRIVATE -gencode=arch=compute_90a,code=sm_90a ${PLUMB_CUDA_DEVICE_OPT})
  set_target_properties(${probe_name} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Static
                                                 UNITY_BUILD OFF)
  target_include_directories(${probe_name} PRIVATE ${CMAKE_SOURCE_DIR}/src)  # (probes may use the kernels' device helpers)
  target_link_libraries(${probe_name} PRIVATE CUDA::cudart_static)
endforeach()

# bench/ktrace: a CUPTI injection library recording every kernel's start and end in replayed steps, without
# serializing them (nsys is not on the GPU machine): see its header. Built when the toolkit has CUPTI, so that CI
# keeps it compiling; the GPU run carries it with libcupti beside it (its RUNPATH is its own folder first).
if(TARGET CUDA::cupti)
  add_library(plumb_ktrace SHARED ${CMAKE_SOURCE_DIR}/bench/ktrace/ktrace.cpp)
  set_target_properties(plumb_ktrace PROPERTIES UNITY_BUILD OFF OUTPUT_NAME ktrace BUILD_RPATH "$ORIGIN"
                                                INSTALL_RPATH "$ORIGIN")
  target_link_libraries(plumb_ktrace PRIVATE CUDA::cupti)
else()
  message(STATUS "plumb: CUPTI not found: bench/ktrace not built")
endif()
