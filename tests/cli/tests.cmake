# tests/cli: the `petrel` command line run as a user runs it.  bad_input.sh
# feeds it out-of-range flags, a NUL in stdin and the eval model forms, and
# checks exit statuses and that stderr names the flag and its range.
add_test(NAME cli/bad_input
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/bad_input.sh $<TARGET_FILE:petrel>)
set_tests_properties(cli/bad_input PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} TIMEOUT 900)
