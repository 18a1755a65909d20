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

# `petrel bench serve` run briefly against stories260K: every request's
# counts are the server's usage, all finished, the HTML report is
# well-formed, offline and has its plots; a server without usage is refused
# (bench_serve.mjs; node's own modules only, skipped without node).
add_test(NAME cli/bench_serve
         COMMAND sh -c "command -v node >/dev/null || exit 77; exec node \"$0\" \"$1\" \"$2\""
                 ${CMAKE_CURRENT_LIST_DIR}/bench_serve.mjs $<TARGET_FILE:petrel>
                 ${CMAKE_BINARY_DIR}/bench-serve-test)
set_tests_properties(cli/bench_serve PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                     TIMEOUT 900 SKIP_RETURN_CODE 77)

# The bench serve report opened in headless Chromium (Debian's chromium):
# re-rendered by this build from the committed CPU run, its seven plots must
# be SVG in Chromium's DOM and their series' colours on the screenshot
# (bench_report_render.mjs).  Skipped (77) without node or chromium.
add_test(NAME cli/bench_report_chromium
         COMMAND sh -c "command -v node >/dev/null || exit 77; exec node \"$0\" \"$1\" \"$2\" \"$3\""
                 ${CMAKE_CURRENT_LIST_DIR}/bench_report_render.mjs $<TARGET_FILE:petrel>
                 ${CMAKE_BINARY_DIR}/bench-report-chromium
                 ${CMAKE_SOURCE_DIR}/bench/results/stories260k-cpu-serve.json)
set_tests_properties(cli/bench_report_chromium PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                     TIMEOUT 300 SKIP_RETURN_CODE 77)

# `petrel --version` / `version`, llama.cpp's flag spellings (-p, -c/--ctx-size,
# -ngl) giving the Petrel spellings' output, and the man page generated from
# the help text read by groff (version_flags.sh).
add_test(NAME cli/version_flags
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/version_flags.sh $<TARGET_FILE:petrel>)
set_tests_properties(cli/version_flags PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} TIMEOUT 300)

# `petrel chat` through a pseudo-terminal (python3's pty): streaming answers,
# history, /reset, /system, Ctrl-C at the prompt and during an answer
# (chat_pty.py).  Skipped (77) without python3.
add_test(NAME cli/chat_pty
         COMMAND sh -c "command -v python3 >/dev/null || exit 77; exec python3 \"$0\" \"$1\""
                 ${CMAKE_CURRENT_LIST_DIR}/chat_pty.py $<TARGET_FILE:petrel>)
set_tests_properties(cli/chat_pty PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                     TIMEOUT 600 SKIP_RETURN_CODE 77)

# Progress while loading and converting: a bar on a terminal (python3's pty),
# plain lines on a pipe, silent on a quick load (progress_modes.py).
add_test(NAME cli/progress_modes
         COMMAND sh -c "command -v python3 >/dev/null || exit 77; exec python3 \"$0\" \"$1\""
                 ${CMAKE_CURRENT_LIST_DIR}/progress_modes.py $<TARGET_FILE:petrel>)
set_tests_properties(cli/progress_modes PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                     TIMEOUT 600 SKIP_RETURN_CODE 77)

# --tensor-parallel N: the split reference forward gives the same greedy
# text; refusals name what does not split and the devices it needs.
add_test(NAME cli/tensor_parallel
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/tensor_parallel.sh $<TARGET_FILE:petrel>)
set_tests_properties(cli/tensor_parallel PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} TIMEOUT 300)
