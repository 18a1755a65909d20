# tests/cli: the `petrel` binary run as a user runs it (a child process per
# case, its files and exit status checked), for behaviour that lives in the
# commands themselves: convert's output directory and its clean-up on a
# signal, bench without a tokenizer, kvcodec's JSON.  There is no petrel_cli
# library, so tests/CMakeLists.txt does not pick these up by itself.
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
