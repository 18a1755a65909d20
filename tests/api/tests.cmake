# tests/api: libpetrel as a user gets it.  installed_example.sh installs this
# build into a temporary prefix with `cmake --install`, builds the example
# of docs/api.md with `pkg-config --cflags --libs petrel` (shared, then
# static), runs it on stories260K, and checks the exported symbols and the
# header.  The in-process API test is tests/engine/test_api.c.
if(PETREL_SANITIZE)
  set(api_san 1)
else()
  set(api_san 0)
endif()
add_test(NAME api/installed_example
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/installed_example.sh ${CMAKE_BINARY_DIR}
                 ${CMAKE_SOURCE_DIR} ${api_san})
set_tests_properties(api/installed_example PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                     TIMEOUT 600 SKIP_RETURN_CODE 77)
