# tests/quant: test_convert loads and runs models, so it also needs the
# model layer (petrel_quant sits below it).
if(TARGET test_convert)
  target_link_libraries(test_convert PRIVATE petrel_model)
endif()
