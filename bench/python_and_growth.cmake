# Cost of Python stack capture (issue 6): a Google Benchmark library that python_stacks_bench.py
# loads and calls from Python frames. Run: python3 bench/python_stacks_bench.py --build build
add_library(python_stacks_bench SHARED ${CMAKE_CURRENT_LIST_DIR}/python_stacks_bench.cpp)
target_link_libraries(python_stacks_bench PRIVATE gpushim_core benchmark::benchmark gpushim_warnings)
set_target_properties(python_stacks_bench PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${GPUSHIM_BIN_DIR})
find_package(Python3 REQUIRED COMPONENTS Interpreter)
# Smoke test, no timing asserted: the benchmark runs and really captures its 20 Python frames.
add_test(NAME bench.python_stacks_smoke
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/python_stacks_bench.py --build ${CMAKE_BINARY_DIR}
                 --pairs 200 --site-pairs 500 --site-runs 1 --benchmark_min_time=0.01 --benchmark_filter=BM_Capture)
set_tests_properties(bench.python_stacks_smoke PROPERTIES TIMEOUT 120
  PASS_REGULAR_EXPRESSION "BM_CaptureNativeAndPython[^\n]*python_frames=20.*target: cudaMallocAsync"
  FAIL_REGULAR_EXPRESSION "ERROR OCCURRED|Traceback")

# Cost of growth tracking per sampling instant and of the detector. Run: build/bin/growth_bench
add_executable(growth_bench ${CMAKE_CURRENT_LIST_DIR}/growth_bench.cpp)
target_link_libraries(growth_bench PRIVATE gpushim_core benchmark::benchmark gpushim_warnings)

# Cost of exact GPUSHIM_ITERATION_SITE counting. Run: python3 bench/iteration_site_bench.py --build build
# Smoke test, no timing asserted: every interpreter found counts every call of the site exactly.
add_test(NAME bench.iteration_site_smoke
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/iteration_site_bench.py --build ${CMAKE_BINARY_DIR}
                 --calls 20000 --repeat 1)
set_tests_properties(bench.iteration_site_smoke PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "other [^\n]* exact"
  FAIL_REGULAR_EXPRESSION "WRONG|Traceback|failed")

# Allocation pairs from a repeated site under Python frames, through the preloaded shim (issue 30).
# A plain CUDA library (no shim code linked): python_stacks_bench.py loads it in processes run
# with and without LD_PRELOAD=libgpushim.so.
add_library(python_pair_bench SHARED ${CMAKE_CURRENT_LIST_DIR}/python_pair_bench.cpp)
target_link_libraries(python_pair_bench PRIVATE cuda_headers fakecuda_runtime gpushim_warnings)
set_target_properties(python_pair_bench PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${GPUSHIM_BIN_DIR})
