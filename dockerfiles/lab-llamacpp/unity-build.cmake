# Unity ("jumbo") build of llama-server's heavy C++ targets, loaded by build-llama-server.sh through
# CMAKE_PROJECT_INCLUDE, so the llama.cpp tree itself is not edited. Each of these targets is compiled
# as one translation unit: its headers are parsed, and the templates and inline functions it shares
# (std::regex, std::function, the json and chat code) are instantiated and compiled, once instead of
# once per file. Measured on this tree (llama-cpp-python 0.3.36 sdist), 2 idle cores, no ccache: 4 min 20 s
# and 80 ninja steps with this file at -O1; file by file 211 steps, 7 min 2 s at -O0 (docs/lab.md).
# The files that do not compile together (same-named statics or macros in one translation unit) keep
# their own: common/json.cpp and common/jinja/*.cpp, tools/mtmd/mtmd-helper*.cpp. ggml is left as it
# is (its C files are cheap, and its CPU backend's files define the same helpers). If a newer tree no
# longer compiles this way, build-llama-server.sh builds it again file by file.
# CMake: UNITY_BUILD, UNITY_BUILD_BATCH_SIZE (0 = the whole target), SKIP_UNITY_BUILD_INCLUSION,
# cmake_language(DEFER) (3.19+; Debian 12 has 3.25): the call runs at the end of the top-level
# CMakeLists.txt, when every target exists.
include_guard(GLOBAL)

function(_llmfleet_unity_build)
  foreach(target llama llama-common server-context llama-server-impl mtmd ggml-rpc-server rpc-server)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES UNITY_BUILD ON)
      if(NOT target STREQUAL "llama")
        set_target_properties(${target} PROPERTIES UNITY_BUILD_BATCH_SIZE 0)
      endif()
    endif()
  endforeach()
  # llama: its model files are already built in batches of 16 (src/CMakeLists.txt); its core files join them.
  if(TARGET llama)
    get_target_property(dir llama SOURCE_DIR)
    file(GLOB core "${dir}/llama*.cpp" "${dir}/unicode*.cpp")
    set_source_files_properties(${core} TARGET_DIRECTORY llama PROPERTIES SKIP_UNITY_BUILD_INCLUSION OFF)
  endif()
  if(TARGET llama-common)
    get_target_property(dir llama-common SOURCE_DIR)
    file(GLOB apart "${dir}/json.cpp" "${dir}/jinja/*.cpp")
    set_source_files_properties(${apart} TARGET_DIRECTORY llama-common PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  if(TARGET mtmd)
    get_target_property(dir mtmd SOURCE_DIR)
    file(GLOB apart "${dir}/mtmd-helper*.cpp")
    set_source_files_properties(${apart} TARGET_DIRECTORY mtmd PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _llmfleet_unity_build)
