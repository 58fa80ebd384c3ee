# Installs posenc into a fresh prefix, MOVES the prefix elsewhere (a relocatable install works from
# any folder), checks that no installed CMake file names the build machine's LibTorch, then
# configures, builds and runs a small outside project that does find_package(posenc) and links
# every exported target — what a user of the installed package does.
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${POSENC_BUILD_DIR}" --prefix "${WORK_DIR}/staging"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
file(RENAME "${WORK_DIR}/staging" "${WORK_DIR}/moved")
file(GLOB_RECURSE installed_cmake "${WORK_DIR}/moved/*.cmake")
foreach(file IN LISTS installed_cmake)
  file(READ "${file}" text)
  foreach(machine_path "${POSENC_TORCH_ROOT}" "${POSENC_BUILD_DIR}" "${WORK_DIR}/staging")
    string(FIND "${text}" "${machine_path}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${file} names a path of the build machine: ${machine_path}")
    endif()
  endforeach()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${POSENC_SOURCE_DIR}/tests/install_consumer"
                -B "${WORK_DIR}/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
                "-DCMAKE_PREFIX_PATH=${WORK_DIR}/moved" "-DPOSENC_TORCH_ROOT=${POSENC_TORCH_ROOT}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed:\n${out}\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed:\n${out}\n${err}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" "${POSENC_SOURCE_DIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed (${rc})")
endif()
