# -DK3_SANITIZE=ON builds everything with ASan + UBSan; CI runs the tests this way.
if(K3_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(K3_SANITIZE=1)
endif()
