# RMM beside the shim (issue 30): gpushim_bench_rmm, RMM's memory resources on alloc_bench's pair
# loop. Built only when GPUSHIM_RMM_SOURCE names a folder holding RMM's sources and its header-only
# dependencies (scripts/get-rmm makes one; bench/rmm.md says how, and at which commits):
#
#   ${GPUSHIM_RMM_SOURCE}/rmm             rapidsai/rmm (cpp/include, cpp/src)
#   ${GPUSHIM_RMM_SOURCE}/rapids-logger   rapidsai/rapids-logger (include, src/logger.cpp, cmake/)
#   ${GPUSHIM_RMM_SOURCE}/cccl            NVIDIA/cccl (libcudacxx/include, thrust, cub); when absent,
#                                         the CCCL that ships with the CUDA headers (include/cccl)
#
# and Debian's spdlog (libspdlog-dev, which brings libfmt-dev) for rapids-logger's one source file.
# No nvcc and no NVIDIA library: RMM's memory resources and its few .cpp files are host code,
# compiled by the host compiler and linked to the simulated libcudart.so.13. The normal build and
# CI never need any of this.
set(GPUSHIM_RMM_SOURCE "" CACHE PATH
    "Folder with rmm/, rapids-logger/ and cccl/ (scripts/get-rmm): builds gpushim_bench_rmm (issue 30)")
if(NOT GPUSHIM_RMM_SOURCE)
  return()
endif()

set(_rmm ${GPUSHIM_RMM_SOURCE}/rmm/cpp)
set(_logger ${GPUSHIM_RMM_SOURCE}/rapids-logger)
foreach(_f ${_rmm}/include/rmm/mr/device/arena_memory_resource.hpp ${_logger}/src/logger.cpp
           ${_logger}/cmake/logger_macros.hpp.in)
  if(NOT EXISTS ${_f})
    message(FATAL_ERROR "gpushim: GPUSHIM_RMM_SOURCE=${GPUSHIM_RMM_SOURCE} lacks ${_f} (scripts/get-rmm, bench/rmm.md)")
  endif()
endforeach()
if(EXISTS ${GPUSHIM_RMM_SOURCE}/cccl/libcudacxx/include/cuda/std/__cccl/version.h)
  set(_cccl_include ${GPUSHIM_RMM_SOURCE}/cccl/libcudacxx/include ${GPUSHIM_RMM_SOURCE}/cccl/thrust
                    ${GPUSHIM_RMM_SOURCE}/cccl/cub)
elseif(EXISTS ${GPUSHIM_CUDA_INCLUDE}/cccl/cuda/std/__cccl/version.h)
  set(_cccl_include ${GPUSHIM_CUDA_INCLUDE}/cccl)
else()
  message(FATAL_ERROR "gpushim: no CCCL in ${GPUSHIM_RMM_SOURCE}/cccl nor in ${GPUSHIM_CUDA_INCLUDE}/cccl")
endif()
find_package(spdlog CONFIG)
if(NOT spdlog_FOUND)
  message(FATAL_ERROR "gpushim: GPUSHIM_RMM_SOURCE needs spdlog for rapids-logger: apt-get install libspdlog-dev")
endif()
message(STATUS "gpushim: RMM from ${GPUSHIM_RMM_SOURCE}, CCCL from ${_cccl_include}, spdlog ${spdlog_VERSION}")

# What RMM's CMake generates: rmm/logger_macros.hpp (rapids-logger's create_logger_macros(RMM
# "rmm::default_logger()" include/rmm)). rmm/version_config.hpp is not included by the headers used.
set(_RAPIDS_LOGGER_MACRO_PREFIX RMM)
set(_RAPIDS_LOGGER_DEFAULT_LOGGER "rmm::default_logger()")
set(_rmm_generated ${CMAKE_CURRENT_BINARY_DIR}/rmm_generated)
configure_file(${_logger}/cmake/logger_macros.hpp.in ${_rmm_generated}/rmm/logger_macros.hpp @ONLY)

# rapids-logger as its CMake builds it (C++20, hidden visibility), on Debian's spdlog (which uses
# fmt) instead of its pinned spdlog 1.14.1 with SPDLOG_USE_STD_FORMAT (std::format: GCC 13+).
add_library(gpushim_rmm_rapids_logger STATIC ${_logger}/src/logger.cpp)
target_include_directories(gpushim_rmm_rapids_logger SYSTEM PUBLIC ${_logger}/include)
target_link_libraries(gpushim_rmm_rapids_logger PRIVATE spdlog::spdlog)
set_target_properties(gpushim_rmm_rapids_logger PROPERTIES CXX_STANDARD 20 CXX_VISIBILITY_PRESET hidden
                                                           POSITION_INDEPENDENT_CODE ON)

# librmm's sources as its CMake lists them, with its definitions and C++17; linked statically.
add_library(gpushim_rmm STATIC ${_rmm}/src/aligned.cpp ${_rmm}/src/cuda_device.cpp ${_rmm}/src/cuda_stream_pool.cpp
                               ${_rmm}/src/cuda_stream_view.cpp ${_rmm}/src/cuda_stream.cpp ${_rmm}/src/device_buffer.cpp)
target_include_directories(gpushim_rmm SYSTEM BEFORE PUBLIC ${_rmm}/include ${_rmm_generated} ${_cccl_include})
target_compile_definitions(gpushim_rmm PUBLIC LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
target_link_libraries(gpushim_rmm PUBLIC cuda_headers fakecuda_runtime gpushim_rmm_rapids_logger ${CMAKE_DL_LIBS})
set_target_properties(gpushim_rmm PROPERTIES CXX_STANDARD 17 CXX_VISIBILITY_PRESET hidden POSITION_INDEPENDENT_CODE ON)

add_executable(gpushim_bench_rmm rmm_bench.cpp)
target_link_libraries(gpushim_bench_rmm PRIVATE gpushim_rmm benchmark::benchmark Threads::Threads gpushim_warnings)
target_include_directories(gpushim_bench_rmm PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
set_target_properties(gpushim_bench_rmm PROPERTIES CXX_STANDARD 17 SKIP_BUILD_RPATH ON)
