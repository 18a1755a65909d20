# Chat templates: the Jinja interpreter (src/tokenizer/jinja_*.c) and
# chat_template.c.  There is no petrel_template library; the code lives in
# petrel_tokenizer.
#
# template/test_jinja    language features with hand-written expectations,
#                        limits, errors, garbage input
# template/jinja_parity  byte parity with @huggingface/jinja on the chat
#                        templates of real models (npm packages, pinned in
#                        tests/parity/jinja/package-lock.json); skipped (77)
#                        when node/npm are not installed
add_executable(test_jinja ${CMAKE_CURRENT_LIST_DIR}/test_jinja.c)
target_link_libraries(test_jinja PRIVATE petrel_tokenizer PkgConfig::CMOCKA)
add_test(NAME template/test_jinja COMMAND test_jinja)
set_tests_properties(template/test_jinja PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} TIMEOUT 300)

add_executable(jinja_parity ${CMAKE_SOURCE_DIR}/tests/parity/jinja/jinja_parity.c)
target_link_libraries(jinja_parity PRIVATE petrel_tokenizer)
add_test(NAME template/jinja_parity
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/parity/jinja/run.sh $<TARGET_FILE:jinja_parity>
                 ${CMAKE_BINARY_DIR}/parity-jinja)
set_tests_properties(template/jinja_parity PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
