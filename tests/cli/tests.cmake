# tests/cli: the `petrel` command line run as a user runs it (a child process
# per case, its exit status, output and files checked).  There is no
# petrel_cli library, so tests/CMakeLists.txt does not pick these up itself.
#
# bad_input.sh feeds it out-of-range flags, a NUL in stdin and the eval
# model forms, and checks exit statuses and that stderr names the flag and
# its range.
add_test(NAME cli/bad_input
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/bad_input.sh $<TARGET_FILE:petrel>)
set_tests_properties(cli/bad_input PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} TIMEOUT 900)

# C tests: convert's output directory (tokenizer carried from GGUF, staging
# and its clean-up on a signal), bench without a tokenizer, kvcodec's JSON.
# test_convert_cli also opens the models in-process to compare token ids.
set(test_kvcodec_cli_libs petrel_io)
set(test_convert_cli_libs petrel_engine)
foreach(t test_kvcodec_cli test_convert_cli)
  add_executable(${t} ${CMAKE_CURRENT_LIST_DIR}/${t}.c)
  target_link_libraries(${t} PRIVATE ${${t}_libs} PkgConfig::CMOCKA)
  target_compile_definitions(${t} PRIVATE
    PETREL_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    PETREL_BIN="$<TARGET_FILE:petrel>")
  add_dependencies(${t} petrel)
  add_test(NAME cli/${t} COMMAND ${t})
  set_tests_properties(cli/${t} PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} TIMEOUT 900)
endforeach()
